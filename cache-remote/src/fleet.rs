//! Fleet-wide single flight: before a process measures a key the shared tier lacks, it takes
//! the key's lease (`crate::lease`); the others wait (bounded) for the entry it publishes and
//! take it as a hit. A leader that dies lets its lease expire and another takes over; a server
//! that is frozen or unreachable costs each call at most the tier's budget, then the breaker
//! keeps it off the path and every process tunes locally, as without a shared tier.
//!
//! The acquisition loop's decisions are pure functions with unit tests: [`classify`] reads
//! one look at the lease, [`step`] decides what follows, [`waits_on`] whether a holder that
//! stalled before is waited on again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cache_core::Namespace;
use cache_format::Fingerprint;

use crate::health::Counters;
use crate::lease::{self, HeldLease, LeaseOp, LeaseReply};
use crate::renewer::{Renewal, Renewer};
use crate::store::RemoteError;
use crate::tier::CacheTier;
use crate::value::Expect;

/// How long waiting on leases that were never seen renewing stays charged to a process: the
/// longest lease tunecache trusts (a holder that died holds its keys at most that long).
const STALL_MEMORY: Duration = Duration::from_secs(600);

/// The longest a process waits on a leader that renews its lease (the renewal is the proof of
/// life): past it, it measures the key itself.
pub(crate) const MAX_FLEET_WAIT: Duration = Duration::from_secs(600);

/// The longest pause between two looks at a key another process is measuring.
const MAX_POLL: Duration = Duration::from_millis(200);

/// The first pause.
const FIRST_POLL: Duration = Duration::from_millis(10);

/// What [`crate::RemoteHandle::claim`] gives: whether this process measures a key for every
/// process sharing the tier, or another did.
#[derive(Debug)]
pub enum FleetClaim {
    /// This process measures the key for the fleet. What the tier already held for it is in
    /// the cache now (look again before measuring). Finish the lease once the results are
    /// recorded: it publishes them, then lets the others go on.
    Lead(LeaseGuard),
    /// Another process published the key while this one waited: its entry is in the cache.
    Published {
        /// Who measured it.
        by: String,
    },
    /// No coordination for this key: measure it here.
    Alone(Alone),
}

/// Why a key is measured here without a lease ([`FleetClaim::Alone`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Alone {
    /// The tier's options switch leases off.
    #[error("fleet leases are off")]
    LeasesOff,
    /// The tier does not write here.
    #[error("the shared tier is read-only here")]
    ReadOnly,
    /// The tier is off the path (the breaker is open).
    #[error("the shared tier is unavailable")]
    Unavailable,
    /// The lease call failed.
    #[error("no lease: {0}")]
    Failed(RemoteError),
    /// The lease key holds a value of another type: someone else's, left alone.
    #[error("{key} holds a {kind}, not a tunecache lease: left alone")]
    Foreign {
        /// The lease key.
        key: String,
        /// The type it holds.
        kind: String,
    },
    /// The lease key holds a value tunecache did not write, or one that never expires.
    #[error(
        "{key} holds a value tunecache did not write (or one that never expires): not \
         trusted, left alone"
    )]
    Untrusted {
        /// The lease key.
        key: String,
    },
    /// The store answered an acquire with "absent" (it should have created the lease).
    #[error("the lease could not be taken")]
    NotTaken,
    /// Leases that were never seen renewing already kept this process waiting a whole wait
    /// (on other keys, whatever holders they named): one that is not seen renewing is not
    /// waited on again for a while.
    #[error(
        "leases never renewed already kept this process waiting a whole wait; not waiting on \
         {holder}'s, which has not been seen renewing: measuring here"
    )]
    Stalled {
        /// Who the lease says holds it (its own words: not trusted for any decision).
        holder: String,
    },
    /// The wait ran out with the holder still measuring.
    #[error("waited {wait:?} for {holder}, which is still measuring this key")]
    WaitedOut {
        /// Who holds the lease.
        holder: String,
        /// How long this process waited.
        wait: Duration,
    },
}

/// Why [`LeaseGuard::finish`] did not publish the key's measurements to the fleet (they are
/// kept in the cache either way).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FinishError {
    /// Publishing failed or ran out of time; the publisher tries again later.
    #[error("publishing: {0}")]
    Publish(RemoteError),
    /// The lease was lost while measuring and another process took the key over: the
    /// publication was refused (fenced).
    #[error(
        "the lease on {key} was lost and another process took the key over: these \
         measurements were kept here, not published"
    )]
    Lost {
        /// The lease key.
        key: String,
    },
}

/// The leases of one shared tier: the renewer of those held, and how long waiting on leases
/// never seen renewing has cost this process.
#[derive(Debug, Default)]
pub(crate) struct Leases {
    pub(crate) renewer: Arc<Renewer>,
    /// Time spent waiting on leases not (yet) seen renewing, since when it is counted.
    unrenewed: Mutex<Spent>,
}

/// Waiting charged to leases never seen renewing.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Spent {
    pub(crate) spent: Duration,
    pub(crate) since: Option<Instant>,
}

impl Spent {
    /// What is spent at `now`: forgotten [`STALL_MEMORY`] after it began.
    pub(crate) fn at(self, now: Instant) -> Spent {
        match self.since {
            Some(since) if now.saturating_duration_since(since) < STALL_MEMORY => self,
            _ => Spent::default(),
        }
    }

    /// `self` with `d` more spent (`d` taken back when negative: a lease seen renewing).
    pub(crate) fn charge(self, now: Instant, add: Duration, refund: Duration) -> Spent {
        let s = self.at(now);
        Spent {
            spent: (s.spent + add).saturating_sub(refund),
            since: Some(s.since.unwrap_or(now)),
        }
    }
}

impl Leases {
    fn spent(&self, now: Instant) -> Duration {
        crate::lock(&self.unrenewed).at(now).spent
    }

    fn charge(&self, add: Duration, refund: Duration) {
        let mut s = crate::lock(&self.unrenewed);
        *s = s.charge(Instant::now(), add, refund);
    }
}

/// Whether a lease whose expiry was `before` and is `now` (both as this process reckons them:
/// the time of the look plus the time to live left) was renewed in between. A renewal moves
/// the expiry later by the time since the last one (a third of the time to live); more than
/// `slack` (the store's reckoning of a lease's age is in whole seconds on S3) is a renewal.
pub(crate) fn renewed(before: Instant, now: Instant, slack: Duration) -> bool {
    now > before + slack
}

/// One look at a key's lease, classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Look {
    /// The lease was free: this process holds it now.
    Taken,
    /// Another process holds it with a tunecache lease that expires, in `left`; `holder` is
    /// what the lease says (for messages only).
    Held { holder: String, left: Duration },
    /// Not a lease to wait on or take.
    Refused(Alone),
}

/// Reads an acquire's reply for the lease key `key` (time to live `ttl`).
pub(crate) fn classify(reply: LeaseReply, key: &str, ttl: Duration) -> Look {
    match reply {
        LeaseReply::Done => Look::Taken,
        LeaseReply::Foreign(kind) => Look::Refused(Alone::Foreign {
            key: key.to_owned(),
            kind,
        }),
        // An acquire creates an absent lease: a backend answering otherwise is not followed
        // round a loop with no pause.
        LeaseReply::Absent => Look::Refused(Alone::NotTaken),
        LeaseReply::Held { value, ttl: left } => {
            // A value of another form, or one that never ends (no time to live, or more than
            // ten minutes), is not trusted.
            let Some(left) = left.filter(|l| *l <= ttl.max(STALL_MEMORY)) else {
                return Look::Refused(Alone::Untrusted {
                    key: key.to_owned(),
                });
            };
            if !lease::is_ours(&value) {
                return Look::Refused(Alone::Untrusted {
                    key: key.to_owned(),
                });
            }
            Look::Held {
                holder: lease::holder(&value),
                left,
            }
        }
    }
}

/// What the acquisition loop does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Lead: the lease is this process's (`takeover`: after waiting on another holder).
    Lead { takeover: bool },
    /// The holder published and let go since the last look: hand the lease straight back and
    /// use its entry.
    HandBack,
    /// The holder published while still holding the lease: use its entry.
    Published { by: String },
    /// Measure here, without a lease.
    Alone(Alone),
    /// Look again after a pause.
    Wait { holder: String },
}

/// Where a wait on one key stands, for [`step`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Waiting {
    /// An earlier look found a holder.
    pub(crate) waiting: bool,
    /// The key's entry changed since the last look into one that passes the checks.
    pub(crate) published: bool,
    /// The lease was seen renewing while this process waited on it.
    pub(crate) renewed: bool,
    /// Left of the wait asked for.
    pub(crate) left: Duration,
    /// Left of [`MAX_FLEET_WAIT`] for a lease that renews.
    pub(crate) left_renewing: Duration,
    /// Waiting charged to leases never seen renewing, this process's, and the most it may be
    /// (the wait asked for).
    pub(crate) unrenewed: (Duration, Duration),
}

/// The decision after one look. A lease seen renewing is a leader alive: waited on (up to
/// [`MAX_FLEET_WAIT`]) however long the wait asked for was. One not seen renewing is waited on
/// at most the wait, and all of them together at most the wait (a squatter's leases, whatever
/// holders they name, cost a process one wait in all, not one per key).
pub(crate) fn step(look: Look, w: Waiting, wait: Duration) -> Step {
    match look {
        Look::Refused(why) => Step::Alone(why),
        Look::Taken if w.published => Step::HandBack,
        Look::Taken => Step::Lead {
            takeover: w.waiting,
        },
        Look::Held { holder, .. } if w.published => Step::Published { by: holder },
        Look::Held { holder, .. } if w.renewed => {
            if w.left_renewing.is_zero() {
                Step::Alone(Alone::WaitedOut {
                    holder,
                    wait: MAX_FLEET_WAIT,
                })
            } else {
                Step::Wait { holder }
            }
        }
        Look::Held { holder, .. } if w.left.is_zero() => {
            Step::Alone(Alone::WaitedOut { holder, wait })
        }
        Look::Held { holder, .. } if w.unrenewed.0 >= w.unrenewed.1 => {
            Step::Alone(Alone::Stalled { holder })
        }
        Look::Held { holder, .. } => Step::Wait { holder },
    }
}

/// The pause after `pause`: doubled, at most [`MAX_POLL`].
fn next_pause(pause: Duration) -> Duration {
    (pause * 2).min(MAX_POLL)
}

/// See [`crate::RemoteHandle::claim`].
pub(crate) fn claim(
    tier: &Arc<CacheTier>,
    ns: Namespace,
    fp: &Fingerprint,
    wait: Duration,
) -> FleetClaim {
    let policy = &tier.policy;
    let Some(ttl) = policy.options.lease_ttl else {
        return FleetClaim::Alone(Alone::LeasesOff);
    };
    if !policy.writes() {
        return FleetClaim::Alone(Alone::ReadOnly);
    }
    let entry_key = policy.layout.key(&tier.scope, ns.name(), fp);
    let key = lease::lease_key(&entry_key);
    let value = lease::new_value();
    let started = Instant::now();
    let give_up = cache_core::deadline_from(started, wait);
    let give_up_renewing = cache_core::deadline_from(started, MAX_FLEET_WAIT);
    // The entry as the server held it at the last look while waiting: a change is the
    // holder's publication.
    let mut before: Option<Option<Vec<u8>>> = None;
    // The lease's expiry as last reckoned, whether it was seen renewing, and the waiting this
    // claim charged to leases never seen renewing (given back once this one renews).
    let mut expiry: Option<Instant> = None;
    let mut renewing = false;
    let mut charged = Duration::ZERO;
    // A renewal moves the expiry by a third of the time to live; the store's reckoning of a
    // lease's age may be a second off (whole seconds on S3).
    let slack = (ttl / 6).min(Duration::from_secs(1));
    let mut pause = FIRST_POLL;
    let mut last_holder = String::new();
    loop {
        if !policy.allow(policy.options.budget) {
            return FleetClaim::Alone(Alone::Unavailable);
        }
        // The lease and the entry in one round trip.
        let deadline = cache_core::deadline_after(policy.options.budget);
        let acquire = LeaseOp::Acquire { value: &value, ttl };
        let result =
            policy
                .remote
                .lease_and_read(&key, acquire, &entry_key, policy.read(None), deadline);
        policy.outcome(&result);
        let (reply, entry) = match result {
            Err(e) => return FleetClaim::Alone(Alone::Failed(e)),
            Ok(got) => got,
        };
        let now = Instant::now();
        let look = classify(reply, &key, ttl);
        if let Look::Held { left, .. } = &look {
            let now_expiry = now + *left;
            if expiry.is_some_and(|e| renewed(e, now_expiry, slack)) && !renewing {
                // The holder renews: it is alive. What waiting on it cost is given back.
                renewing = true;
                tier.leases.charge(Duration::ZERO, charged);
                charged = Duration::ZERO;
            }
            expiry = Some(expiry.map_or(now_expiry, |e| e.max(now_expiry)));
        }
        let waiting = before.is_some();
        let published = before.as_ref().is_some_and(|seen| *seen != entry)
            && entry
                .as_deref()
                .is_some_and(|bytes| keep(tier, ns, fp, bytes));
        match &look {
            Look::Refused(Alone::Foreign { .. } | Alone::Untrusted { .. }) => {
                policy.reject("lease: foreign");
            }
            Look::Held { .. } if !waiting => {
                Counters::bump(&policy.counters.lease_waits, 1);
            }
            _ => {}
        }
        let left = give_up.saturating_duration_since(now);
        let w = Waiting {
            waiting,
            published,
            renewed: renewing,
            left,
            left_renewing: give_up_renewing.saturating_duration_since(now),
            unrenewed: (tier.leases.spent(now), wait),
        };
        match step(look, w, wait) {
            Step::Lead { takeover } => {
                return lead(tier, (ns, *fp, entry), key, value, ttl, takeover);
            }
            Step::HandBack => {
                let release = LeaseOp::Release { value: &value };
                let _ = policy
                    .remote
                    .lease(&key, release, deadline + policy.options.budget);
                return FleetClaim::Published { by: last_holder };
            }
            Step::Published { by } => return FleetClaim::Published { by },
            Step::Alone(why) => return FleetClaim::Alone(why),
            Step::Wait { holder } => {
                last_holder = holder;
                before = Some(entry);
                let nap = if renewing {
                    pause.min(w.left_renewing)
                } else {
                    pause.min(left)
                };
                std::thread::sleep(nap);
                if !renewing {
                    tier.leases.charge(nap, Duration::ZERO);
                    charged += nap;
                }
                pause = next_pause(pause);
            }
        }
    }
}

/// The lease is this process's: what the server holds for the key now is kept in the cache
/// (a leader may have finished just before), and a guard starts renewing it.
fn lead(
    tier: &Arc<CacheTier>,
    (ns, fp, entry): (Namespace, Fingerprint, Option<Vec<u8>>),
    key: String,
    value: Vec<u8>,
    ttl: Duration,
    takeover: bool,
) -> FleetClaim {
    let policy = &tier.policy;
    Counters::bump(&policy.counters.leases, 1);
    if takeover {
        Counters::bump(&policy.counters.takeovers, 1);
    }
    if let Some(bytes) = &entry {
        keep(tier, ns, &fp, bytes);
    }
    let held = Arc::new(HeldLease {
        key,
        value,
        seen: entry,
        finishing: AtomicBool::new(false),
        released: AtomicBool::new(false),
        fenced: AtomicBool::new(false),
    });
    // The key's publications are fenced by the lease from now on.
    tier.publisher.fence(ns, fp, Arc::clone(&held));
    let renewal = tier
        .leases
        .renewer
        .add(&policy.remote, held, ttl, policy.options.budget);
    FleetClaim::Lead(LeaseGuard {
        tier: Arc::clone(tier),
        key: (ns, fp),
        renewal,
    })
}

/// Checks a value read for `(ns, fp)` and keeps it in the cache; whether it was usable.
fn keep(tier: &CacheTier, ns: Namespace, fp: &Fingerprint, bytes: &[u8]) -> bool {
    let policy = &tier.policy;
    let scope_fp = tier.scope.fingerprint();
    let expect = Expect {
        scope: &scope_fp,
        ns: ns.name(),
        fp,
    };
    let Some((_, mut entry)) = policy.check(bytes, expect) else {
        return false;
    };
    entry.set_origin(policy.remote_origin(entry.origin()));
    tier.link.absorb(vec![(ns, entry)]);
    true
}

/// A held lease ([`FleetClaim::Lead`]): renewed by the tier's renewer until finished or
/// dropped; the publications of its key are fenced by it. Dropping it lets the others go on.
pub struct LeaseGuard {
    tier: Arc<CacheTier>,
    key: (Namespace, Fingerprint),
    renewal: Arc<Renewal>,
}

impl std::fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("key", &self.renewal.held.key)
            .field("lost", &self.lost())
            .finish()
    }
}

impl LeaseGuard {
    /// Whether it was lost while held (expired, or taken by another): the fleet may measure
    /// the key twice.
    pub fn lost(&self) -> bool {
        self.renewal.lost.load(Ordering::Relaxed)
            || self.renewal.held.fenced.load(Ordering::Relaxed)
    }

    /// Publishes what the cache recorded (waiting at most `timeout`), releasing the lease in
    /// the same step as the key's write; a lease lost meanwhile makes that write refused
    /// (fenced), and the measurements stay in the cache only.
    pub fn finish(self, timeout: Duration) -> Result<(), FinishError> {
        let held = &self.renewal.held;
        held.finishing.store(true, Ordering::Relaxed);
        self.tier
            .publisher
            .publish_within(timeout)
            .map_err(FinishError::Publish)?;
        if held.fenced.load(Ordering::Relaxed) {
            return Err(FinishError::Lost {
                key: held.key.clone(),
            });
        }
        Ok(())
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        let held = Arc::clone(&self.renewal.held);
        self.tier.leases.renewer.remove(&self.renewal);
        self.tier.publisher.unfence(self.key.0, self.key.1, &held);
        if held.released.load(Ordering::Relaxed) {
            return;
        }
        // Compared on the server: a lease that expired and was taken by another is left alone.
        let policy = &self.tier.policy;
        let deadline = cache_core::deadline_after(policy.options.budget);
        let release = LeaseOp::Release { value: &held.value };
        let _ = policy.remote.lease(&held.key, release, deadline);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(30);
    const WAIT: Duration = Duration::from_secs(5);

    fn ours() -> Vec<u8> {
        lease::new_value()
    }

    fn held(value: Vec<u8>, ttl: Option<Duration>) -> LeaseReply {
        LeaseReply::Held { value, ttl }
    }

    #[test]
    fn waiting_on_leases_never_renewed_is_charged_for_a_while_and_given_back_on_a_renewal() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let spent = Spent::default().charge(t0, s(3), Duration::ZERO);
        assert_eq!(spent.at(t0 + s(1)).spent, s(3));
        let spent = spent.charge(t0 + s(2), s(4), Duration::ZERO);
        assert_eq!(spent.at(t0 + s(2)).spent, s(7));
        assert_eq!(
            spent.charge(t0 + s(3), Duration::ZERO, s(4)).spent,
            s(3),
            "given back"
        );
        assert_eq!(
            spent.at(t0 + STALL_MEMORY).spent,
            Duration::ZERO,
            "forgotten in time"
        );
        // A renewal moves the expiry later by more than the slack; time passing does not.
        assert!(renewed(t0 + s(10), t0 + s(13), s(1)));
        assert!(!renewed(
            t0 + s(10),
            t0 + s(10) + Duration::from_millis(900),
            s(1)
        ));
        assert!(!renewed(t0 + s(10), t0 + s(9), s(1)));
    }

    #[test]
    fn replies_are_classified_and_only_tunecaches_expiring_leases_are_waited_on() {
        assert_eq!(classify(LeaseReply::Done, "k", TTL), Look::Taken);
        assert_eq!(
            classify(LeaseReply::Foreign("hash".into()), "k", TTL),
            Look::Refused(Alone::Foreign {
                key: "k".into(),
                kind: "hash".into()
            })
        );
        assert_eq!(
            classify(LeaseReply::Absent, "k", TTL),
            Look::Refused(Alone::NotTaken)
        );
        let untrusted = Look::Refused(Alone::Untrusted { key: "k".into() });
        // Not our form; ours without a time to live; ours living longer than ten minutes.
        assert_eq!(
            classify(held(b"lock".to_vec(), Some(TTL)), "k", TTL),
            untrusted
        );
        assert_eq!(classify(held(ours(), None), "k", TTL), untrusted);
        let long = STALL_MEMORY + Duration::from_secs(1);
        assert_eq!(classify(held(ours(), Some(long)), "k", TTL), untrusted);
        // A lease asked for a longer time to live than ten minutes may have that long.
        let look = classify(held(ours(), Some(long)), "k", long);
        assert!(
            matches!(look, Look::Held { left, .. } if left == long),
            "{look:?}"
        );
    }

    fn w(
        waiting: bool,
        published: bool,
        renewed: bool,
        left: Duration,
        spent: Duration,
    ) -> Waiting {
        Waiting {
            waiting,
            published,
            renewed,
            left,
            left_renewing: Duration::from_secs(100),
            unrenewed: (spent, WAIT),
        }
    }

    #[test]
    fn the_loop_leads_waits_takes_a_publication_or_gives_up() {
        let held = || Look::Held {
            holder: "pid=1".into(),
            left: TTL,
        };
        let (s1, zero) = (Duration::from_secs(1), Duration::ZERO);
        let holder = || "pid=1".to_owned();
        assert_eq!(
            step(Look::Taken, w(false, false, false, s1, zero), WAIT),
            Step::Lead { takeover: false }
        );
        assert_eq!(
            step(Look::Taken, w(true, false, false, s1, zero), WAIT),
            Step::Lead { takeover: true }
        );
        assert_eq!(
            step(Look::Taken, w(true, true, false, s1, zero), WAIT),
            Step::HandBack
        );
        assert_eq!(
            step(held(), w(false, false, false, s1, zero), WAIT),
            Step::Wait { holder: holder() }
        );
        assert_eq!(
            step(held(), w(true, true, false, s1, zero), WAIT),
            Step::Published { by: holder() }
        );
        // A publication wins over a wait that just ran out.
        assert_eq!(
            step(held(), w(true, true, false, zero, zero), WAIT),
            Step::Published { by: holder() }
        );
        assert_eq!(
            step(held(), w(true, false, false, zero, zero), WAIT),
            Step::Alone(Alone::WaitedOut {
                holder: holder(),
                wait: WAIT
            })
        );
        // No wait at all: the first look gives up.
        assert!(matches!(
            step(held(), w(false, false, false, zero, zero), Duration::ZERO),
            Step::Alone(Alone::WaitedOut { .. })
        ));
        let refused = Look::Refused(Alone::NotTaken);
        assert_eq!(
            step(refused, w(true, true, false, s1, zero), WAIT),
            Step::Alone(Alone::NotTaken)
        );
    }

    #[test]
    fn a_renewing_leader_is_waited_on_past_the_wait_and_squatters_cost_one_wait_in_all() {
        let held = || Look::Held {
            holder: "pid=1".into(),
            left: TTL,
        };
        let zero = Duration::ZERO;
        // Alive (renewing): the wait asked for ran out, the leader is waited on still...
        assert_eq!(
            step(held(), w(true, false, true, zero, WAIT), WAIT),
            Step::Wait {
                holder: "pid=1".into()
            }
        );
        // ...up to the fleet's bound.
        let mut out = w(true, false, true, zero, zero);
        out.left_renewing = zero;
        assert!(matches!(
            step(held(), out, WAIT),
            Step::Alone(Alone::WaitedOut { .. })
        ));
        // Never seen renewing, with a whole wait already spent on such leases (other keys,
        // any holders): not waited on at all.
        assert_eq!(
            step(
                held(),
                w(false, false, false, Duration::from_secs(1), WAIT),
                WAIT
            ),
            Step::Alone(Alone::Stalled {
                holder: "pid=1".into()
            })
        );
        // A renewing one still is, whatever was spent.
        assert_eq!(
            step(
                held(),
                w(false, false, true, Duration::from_secs(1), WAIT * 3),
                WAIT
            ),
            Step::Wait {
                holder: "pid=1".into()
            }
        );
    }

    #[test]
    fn pauses_double_up_to_the_cap() {
        let mut pause = FIRST_POLL;
        let mut seen = vec![pause];
        for _ in 0..6 {
            pause = next_pause(pause);
            seen.push(pause);
        }
        assert_eq!(
            seen.iter().map(Duration::as_millis).collect::<Vec<_>>(),
            [10, 20, 40, 80, 160, 200, 200]
        );
    }
}
