//! Fleet-wide single flight: before a process measures a key the shared tier lacks, it takes
//! the key's lease (`crate::lease`); the others wait (bounded) for the entry it publishes and
//! take it as a hit. A leader that dies lets its lease expire and another takes over; a server
//! that is frozen or unreachable costs each call at most the tier's budget, then the breaker
//! keeps it off the path and every process tunes locally, as without a shared tier.
//!
//! The acquisition loop's decisions are pure functions with unit tests: [`classify`] reads
//! one look at the lease, [`step`] decides what follows, [`waits_on`] whether a holder that
//! stalled before is waited on again.

use std::collections::HashMap;
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

/// How long a holder that kept this process waiting a whole wait is not waited on again: the
/// longest lease tunecache trusts (a holder that died holds its keys at most that long).
const STALL_MEMORY: Duration = Duration::from_secs(600);

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
    /// The holder already kept this process waiting a whole wait on another key.
    #[error(
        "{holder} already kept this process waiting a whole wait on another key: measuring here"
    )]
    Stalled {
        /// Who holds the lease.
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

/// The leases of one shared tier: the renewer of those held, and the holders that stalled.
#[derive(Debug, Default)]
pub(crate) struct Leases {
    pub(crate) renewer: Arc<Renewer>,
    /// Lease holders that kept this process waiting a whole wait, and when.
    stalled: Mutex<HashMap<String, Instant>>,
}

impl Leases {
    /// When `holder` last kept this process waiting a whole wait, if it did.
    fn stalled_at(&self, holder: &str) -> Option<Instant> {
        crate::lock(&self.stalled).get(holder).copied()
    }

    /// Remembers that `holder` kept this process waiting a whole wait (the oldest forgotten
    /// past a bound, so a server full of squatted leases cannot grow it).
    fn note_stalled(&self, holder: String) {
        let mut stalled = crate::lock(&self.stalled);
        let now = Instant::now();
        stalled.retain(|_, at| now.duration_since(*at) < STALL_MEMORY);
        if stalled.len() < 1024 {
            stalled.insert(holder, now);
        }
    }
}

/// Whether to wait on a lease holder that last kept this process waiting a whole wait at
/// `stalled_at` (if ever): not within [`STALL_MEMORY`], so a dead holder's (or a squatter's)
/// leases cost one wait, not one per key (a tune of 27 keys waited 590 s).
pub(crate) fn waits_on(stalled_at: Option<Instant>, now: Instant) -> bool {
    stalled_at.is_none_or(|at| now.saturating_duration_since(at) >= STALL_MEMORY)
}

/// One look at a key's lease, classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Look {
    /// The lease was free: this process holds it now.
    Taken,
    /// Another process holds it with a tunecache lease that expires; `stalled`: that holder
    /// kept this process waiting a whole wait before (see [`waits_on`]).
    Held { holder: String, stalled: bool },
    /// Not a lease to wait on or take.
    Refused(Alone),
}

/// Reads an acquire's reply for the lease key `key` (time to live `ttl`); `stalled` says
/// whether a holder is not to be waited on.
pub(crate) fn classify(
    reply: LeaseReply,
    key: &str,
    ttl: Duration,
    stalled: impl Fn(&str) -> bool,
) -> Look {
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
            let never_ends = left.is_none_or(|l| l > ttl.max(STALL_MEMORY));
            if !lease::is_ours(&value) || never_ends {
                return Look::Refused(Alone::Untrusted {
                    key: key.to_owned(),
                });
            }
            let holder = lease::holder(&value);
            let stalled = stalled(&holder);
            Look::Held { holder, stalled }
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

/// The decision after one look: `waiting` (an earlier look found a holder), `published`
/// (the key's entry changed since the last look into one that passes the checks), `left` (of
/// the wait) and `wait` (the whole wait, for messages).
pub(crate) fn step(
    look: Look,
    waiting: bool,
    published: bool,
    left: Duration,
    wait: Duration,
) -> Step {
    match look {
        Look::Refused(why) => Step::Alone(why),
        Look::Taken if published => Step::HandBack,
        Look::Taken => Step::Lead { takeover: waiting },
        Look::Held {
            holder,
            stalled: true,
        } => Step::Alone(Alone::Stalled { holder }),
        Look::Held { holder, .. } if published => Step::Published { by: holder },
        Look::Held { holder, .. } if left.is_zero() => {
            Step::Alone(Alone::WaitedOut { holder, wait })
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
    let give_up = cache_core::deadline_after(wait);
    // The entry as the server held it at the last look while waiting: a change is the
    // holder's publication.
    let mut before: Option<Option<Vec<u8>>> = None;
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
        let look = classify(reply, &key, ttl, |h| {
            !waits_on(tier.leases.stalled_at(h), now)
        });
        let waiting = before.is_some();
        let published = before.as_ref().is_some_and(|seen| *seen != entry)
            && entry
                .as_deref()
                .is_some_and(|bytes| keep(tier, ns, fp, bytes));
        match &look {
            Look::Refused(Alone::Foreign { .. } | Alone::Untrusted { .. }) => {
                policy.reject("lease: foreign");
            }
            Look::Held { stalled: false, .. } if !waiting => {
                Counters::bump(&policy.counters.lease_waits, 1);
            }
            _ => {}
        }
        let left = give_up.saturating_duration_since(now);
        match step(look, waiting, published, left, wait) {
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
            Step::Alone(why) => {
                if let Alone::WaitedOut { holder, .. } = &why {
                    tier.leases.note_stalled(holder.clone());
                }
                return FleetClaim::Alone(why);
            }
            Step::Wait { holder } => {
                last_holder = holder;
                before = Some(entry);
                std::thread::sleep(pause.min(left));
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
    fn a_holder_that_stalled_is_not_waited_on_again_until_the_memory_ends() {
        let now = Instant::now();
        assert!(waits_on(None, now), "a holder never seen is waited on");
        assert!(!waits_on(Some(now), now));
        assert!(!waits_on(
            Some(now),
            now + STALL_MEMORY - Duration::from_millis(1)
        ));
        assert!(waits_on(Some(now), now + STALL_MEMORY));
        // A clock that went back (a stall noted "after" now) still does not wait.
        assert!(!waits_on(Some(now + Duration::from_secs(5)), now));
    }

    #[test]
    fn replies_are_classified_and_only_tunecaches_expiring_leases_are_waited_on() {
        let never = |_: &str| false;
        assert_eq!(classify(LeaseReply::Done, "k", TTL, never), Look::Taken);
        assert_eq!(
            classify(LeaseReply::Foreign("hash".into()), "k", TTL, never),
            Look::Refused(Alone::Foreign {
                key: "k".into(),
                kind: "hash".into()
            })
        );
        assert_eq!(
            classify(LeaseReply::Absent, "k", TTL, never),
            Look::Refused(Alone::NotTaken)
        );
        let untrusted = Look::Refused(Alone::Untrusted { key: "k".into() });
        // Not our form; ours without a time to live; ours living longer than ten minutes.
        assert_eq!(
            classify(held(b"lock".to_vec(), Some(TTL)), "k", TTL, never),
            untrusted
        );
        assert_eq!(classify(held(ours(), None), "k", TTL, never), untrusted);
        let long = STALL_MEMORY + Duration::from_secs(1);
        assert_eq!(
            classify(held(ours(), Some(long)), "k", TTL, never),
            untrusted
        );
        // A lease asked for a longer time to live than ten minutes may have that long.
        let look = classify(held(ours(), Some(long)), "k", long, never);
        assert!(
            matches!(look, Look::Held { stalled: false, .. }),
            "{look:?}"
        );
        let look = classify(held(ours(), Some(TTL)), "k", TTL, |_| true);
        assert!(matches!(look, Look::Held { stalled: true, .. }), "{look:?}");
    }

    #[test]
    fn the_loop_leads_waits_takes_a_publication_or_gives_up() {
        let held = |stalled| Look::Held {
            holder: "pid=1".into(),
            stalled,
        };
        let left = Duration::from_secs(1);
        assert_eq!(
            step(Look::Taken, false, false, left, WAIT),
            Step::Lead { takeover: false }
        );
        assert_eq!(
            step(Look::Taken, true, false, left, WAIT),
            Step::Lead { takeover: true }
        );
        assert_eq!(step(Look::Taken, true, true, left, WAIT), Step::HandBack);
        assert_eq!(
            step(held(false), false, false, left, WAIT),
            Step::Wait {
                holder: "pid=1".into()
            }
        );
        assert_eq!(
            step(held(false), true, true, left, WAIT),
            Step::Published { by: "pid=1".into() }
        );
        // A publication wins over a wait that just ran out.
        assert_eq!(
            step(held(false), true, true, Duration::ZERO, WAIT),
            Step::Published { by: "pid=1".into() }
        );
        assert_eq!(
            step(held(false), true, false, Duration::ZERO, WAIT),
            Step::Alone(Alone::WaitedOut {
                holder: "pid=1".into(),
                wait: WAIT
            })
        );
        // No wait at all: the first look gives up.
        assert!(matches!(
            step(held(false), false, false, Duration::ZERO, Duration::ZERO),
            Step::Alone(Alone::WaitedOut { .. })
        ));
        assert_eq!(
            step(held(true), false, false, left, WAIT),
            Step::Alone(Alone::Stalled {
                holder: "pid=1".into()
            })
        );
        let refused = Look::Refused(Alone::NotTaken);
        assert_eq!(
            step(refused, true, true, left, WAIT),
            Step::Alone(Alone::NotTaken)
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
