//! Fleet-wide single flight: before a process measures a key the shared tier lacks, it takes
//! the key's lease (`crate::lease`); the others wait (bounded) for the entry it publishes and
//! take it as a hit. A leader that dies lets its lease expire and another takes over; a server
//! that is frozen or unreachable costs each call at most the tier's budget, then the breaker
//! keeps it off the path and every process tunes locally, as without a shared tier.
//!
//! The acquisition loop's decisions are pure functions with unit tests: [`classify`] reads
//! one look at the lease, [`step`] decides what follows, [`waits_on`] whether a holder that
//! stalled before is waited on again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cache_core::Namespace;
use cache_format::Fingerprint;

mod decide;

pub(crate) use decide::{
    FIRST_POLL, Look, MAX_FLEET_WAIT, Step, Waiting, classify, next_pause, renewed, step,
};

use crate::health::Counters;
use crate::lease::{self, HeldLease, LeaseOp};
use crate::leases::Leases;
use crate::renewer::Renewal;
use crate::store::RemoteError;
use crate::tier::CacheTier;
use crate::value::Expect;

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
    let mut watch = Renewals::new(ttl);
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
            watch.see(now + *left, &tier.leases);
        }
        let renewing = watch.renewing;
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
                watch.waited(nap, &tier.leases);
                pause = next_pause(pause);
            }
        }
    }
}

/// One wait's view of a lease's renewals: its expiry as last reckoned, whether it was seen
/// renewing, and the waiting this claim charged to leases never seen renewing (given back
/// once this one renews).
struct Renewals {
    expiry: Option<Instant>,
    renewing: bool,
    charged: Duration,
    /// A renewal moves the expiry by a third of the time to live; the store's reckoning of a
    /// lease's age may be a second off (whole seconds on S3).
    slack: Duration,
}

impl Renewals {
    fn new(ttl: Duration) -> Renewals {
        Renewals {
            expiry: None,
            renewing: false,
            charged: Duration::ZERO,
            slack: (ttl / 6).min(Duration::from_secs(1)),
        }
    }

    /// A look found the lease expiring at `expiry`.
    fn see(&mut self, expiry: Instant, leases: &Leases) {
        if !self.renewing && self.expiry.is_some_and(|e| renewed(e, expiry, self.slack)) {
            // The holder renews: it is alive. What waiting on it cost is given back.
            self.renewing = true;
            leases.charge(Duration::ZERO, self.charged);
            self.charged = Duration::ZERO;
        }
        self.expiry = Some(self.expiry.map_or(expiry, |e| e.max(expiry)));
    }

    /// The claim waited `nap` on the lease: charged while it has not been seen renewing.
    fn waited(&mut self, nap: Duration, leases: &Leases) {
        if !self.renewing {
            leases.charge(nap, Duration::ZERO);
            self.charged += nap;
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
