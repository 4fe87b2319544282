//! Fleet-wide single flight: before a process measures a key the shared tier lacks, it takes
//! the key's lease (`crate::lease`); the others wait (bounded) for the entry it publishes and
//! take it as a hit. A leader that dies lets its lease expire and another takes over; a server
//! that is frozen or unreachable costs each call at most the tier's budget, then the breaker
//! keeps it off the path and every process tunes locally, as without a shared tier.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cache_core::{FleetClaim, FleetLease, Namespace, Tier};
use cache_format::Fingerprint;

use crate::health::Counters;
use crate::lease::{self, HeldLease, LeaseOp, LeaseReply};
use crate::renewer::Renewal;
use crate::store::Remote;
use crate::tier::CacheTier;

/// How long a holder that kept this process waiting a whole wait is not waited on again: the
/// longest lease tunecache trusts (a holder that died holds its keys at most that long).
const STALL_MEMORY: Duration = Duration::from_secs(600);

/// Whether to wait on a lease holder that last kept this process waiting a whole wait at
/// `stalled_at` (if ever): not within [`STALL_MEMORY`], so a dead holder's (or a squatter's)
/// leases cost one wait, not one per key (a tune of 27 keys waited 590 s).
pub(crate) fn waits_on(stalled_at: Option<Instant>, now: Instant) -> bool {
    stalled_at.is_none_or(|at| now.saturating_duration_since(at) >= STALL_MEMORY)
}
use crate::value::Expect;

/// The longest pause between two looks at a key another process is measuring.
const MAX_POLL: Duration = Duration::from_millis(200);

/// A held lease: renewed by the tier's renewer until finished or dropped; the publications of
/// its key are fenced by it.
pub struct LeaseGuard {
    remote: Arc<dyn Remote>,
    tier: Arc<dyn Tier>,
    key: (Namespace, Fingerprint),
    budget: Duration,
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

impl FleetLease for LeaseGuard {
    fn lost(&self) -> bool {
        self.renewal.lost.load(Ordering::Relaxed)
            || self.renewal.held.fenced.load(Ordering::Relaxed)
    }

    /// Publishes what this cache recorded (waiting at most `timeout`), releasing the lease in
    /// the same step as the key's write; a lease lost meanwhile makes that write refused
    /// (fenced), and the measurements stay in this cache only.
    fn finish(self: Box<Self>, timeout: Duration) -> Result<(), String> {
        let held = &self.renewal.held;
        held.finishing.store(true, Ordering::Relaxed);
        if let Some(tier) = self.cache_tier() {
            tier.publisher()
                .publish_within(timeout)
                .map_err(|e| e.to_string())?;
        }
        if held.fenced.load(Ordering::Relaxed) {
            return Err(format!(
                "the lease on {} was lost and another process took the key over: these \
                 measurements were kept here, not published",
                held.key
            ));
        }
        Ok(())
    }
}

impl LeaseGuard {
    fn cache_tier(&self) -> Option<&CacheTier> {
        self.tier.as_any().downcast_ref::<CacheTier>()
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        let held = Arc::clone(&self.renewal.held);
        if let Some(tier) = self.cache_tier() {
            tier.renewer().remove(&self.renewal);
            tier.publisher().unfence(self.key.0, self.key.1, &held);
        }
        if held.released.load(Ordering::Relaxed) {
            return;
        }
        // Compared on the server: a lease that expired and was taken by another is left alone.
        let deadline = Instant::now() + self.budget;
        let release = LeaseOp::Release { value: &held.value };
        let _ = self.remote.lease(&held.key, release, deadline);
    }
}

impl CacheTier {
    /// See [`Tier::fleet_claim`].
    pub(crate) fn fleet_claim(
        &self,
        tier: Arc<dyn Tier>,
        ns: Namespace,
        fp: &Fingerprint,
        wait: Duration,
    ) -> FleetClaim {
        let policy = self.policy();
        let options = &policy.options;
        let Some(ttl) = options.lease_ttl else {
            return FleetClaim::Alone("fleet leases are off".to_owned());
        };
        if !policy.writes() {
            return FleetClaim::Alone("the shared tier is read-only here".to_owned());
        }
        let entry_key = policy.layout.key(self.scope(), ns.name(), fp);
        let key = lease::lease_key(&entry_key);
        let value = lease::new_value();
        let give_up = Instant::now() + wait;
        // The entry as the server held it when this process started waiting: a change is the
        // holder's publication.
        let mut before: Option<Option<Vec<u8>>> = None;
        let mut pause = Duration::from_millis(10);
        let mut last_holder = String::new();
        loop {
            if !policy.allow(options.budget) {
                return FleetClaim::Alone("the shared tier is unavailable".to_owned());
            }
            // The lease and the entry in one round trip.
            let deadline = Instant::now() + options.budget;
            let acquire = LeaseOp::Acquire { value: &value, ttl };
            let result = policy.remote.lease_and_read(
                &key,
                acquire,
                &entry_key,
                policy.read(None),
                deadline,
            );
            policy.outcome(&result);
            let (reply, entry) = match result {
                Err(e) => return FleetClaim::Alone(format!("no lease: {e}")),
                Ok(got) => got,
            };
            let holder = match reply {
                LeaseReply::Done => {
                    if self.published_since(before.as_ref(), entry.as_deref(), ns, fp) {
                        // Its holder published, then let go, since the last look: the entry is
                        // what was waited for, and the lease goes straight back.
                        let release = LeaseOp::Release { value: &value };
                        let _ = policy
                            .remote
                            .lease(&key, release, deadline + options.budget);
                        return FleetClaim::Published { by: last_holder };
                    }
                    let waited = before.is_some();
                    return self.lead(tier, (ns, fp, entry), key, value, ttl, waited);
                }
                LeaseReply::Foreign(kind) => {
                    policy.reject("lease: foreign");
                    return FleetClaim::Alone(format!(
                        "{key} holds a {kind}, not a tunecache lease: left alone"
                    ));
                }
                // An acquire creates an absent lease: a backend answering otherwise is not
                // followed round a loop with no pause.
                LeaseReply::Absent => {
                    return FleetClaim::Alone("the lease could not be taken".to_owned());
                }
                LeaseReply::Held {
                    value: held,
                    ttl: left,
                } => match self.trusted_holder(&key, &held, left, ttl) {
                    Ok(holder) => holder,
                    Err(alone) => return alone,
                },
            };
            last_holder.clone_from(&holder);
            if !waits_on(self.stalled_at(&holder), Instant::now()) {
                return FleetClaim::Alone(format!(
                    "{holder} already kept this process waiting a whole wait on another key: measuring here"
                ));
            }
            if before.is_none() {
                Counters::bump(&policy.counters.lease_waits, 1);
            } else if self.published_since(before.as_ref(), entry.as_deref(), ns, fp) {
                return FleetClaim::Published { by: holder };
            }
            before = Some(entry);
            let left = give_up.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.note_stalled(holder.clone());
                return FleetClaim::Alone(format!(
                    "waited {wait:?} for {holder}, which is still measuring this key"
                ));
            }
            std::thread::sleep(pause.min(left));
            pause = (pause * 2).min(MAX_POLL);
        }
    }

    /// When `holder` last kept this process waiting a whole wait, if it did.
    fn stalled_at(&self, holder: &str) -> Option<Instant> {
        self.stalled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(holder)
            .copied()
    }

    /// Remembers that `holder` kept this process waiting a whole wait (the oldest forgotten
    /// past a bound, so a server full of squatted leases cannot grow it).
    fn note_stalled(&self, holder: String) {
        let mut stalled = self
            .stalled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        stalled.retain(|_, at| now.duration_since(*at) < STALL_MEMORY);
        if stalled.len() < 1024 {
            stalled.insert(holder, now);
        }
    }

    /// The lease is this process's: what the server holds for the key now is kept in the
    /// cache (a leader may have finished just before), and a guard starts renewing it.
    fn lead(
        &self,
        tier: Arc<dyn Tier>,
        (ns, fp, entry): (Namespace, &Fingerprint, Option<Vec<u8>>),
        key: String,
        value: Vec<u8>,
        ttl: Duration,
        waited: bool,
    ) -> FleetClaim {
        let counters = &self.policy().counters;
        Counters::bump(&counters.leases, 1);
        if waited {
            Counters::bump(&counters.takeovers, 1);
        }
        if let Some(bytes) = &entry {
            self.absorb(ns, fp, bytes);
        }
        let held = HeldLease {
            key,
            value,
            seen: entry,
            finishing: AtomicBool::new(false),
            released: AtomicBool::new(false),
            fenced: AtomicBool::new(false),
        };
        FleetClaim::Lead(Box::new(self.guard(tier, (ns, *fp), held, ttl)))
    }

    /// Who holds the lease, if it is one tunecache wrote that expires: a value of another form,
    /// or one that never ends (no time to live, or more than ten minutes), is not trusted.
    fn trusted_holder(
        &self,
        key: &str,
        held: &[u8],
        left: Option<Duration>,
        ttl: Duration,
    ) -> Result<String, FleetClaim> {
        let never_ends = left.is_none_or(|l| l > ttl.max(Duration::from_secs(600)));
        if !lease::is_ours(held) || never_ends {
            self.policy().reject("lease: foreign");
            return Err(FleetClaim::Alone(format!(
                "{key} holds a value tunecache did not write (or one that never expires): not \
                 trusted, left alone"
            )));
        }
        Ok(lease::holder(held))
    }

    /// Whether the entry changed since `before` (the first look while waiting) into one that
    /// passes the checks; it is then kept in the cache.
    fn published_since(
        &self,
        before: Option<&Option<Vec<u8>>>,
        entry: Option<&[u8]>,
        ns: Namespace,
        fp: &Fingerprint,
    ) -> bool {
        before.is_some_and(|seen| seen.as_deref() != entry)
            && entry.is_some_and(|bytes| self.absorb(ns, fp, bytes))
    }

    /// Checks a value read for `(ns, fp)` and keeps it in the cache; whether it was usable.
    fn absorb(&self, ns: Namespace, fp: &Fingerprint, bytes: &[u8]) -> bool {
        let policy = self.policy();
        let scope_fp = self.scope().fingerprint();
        let expect = Expect {
            scope: &scope_fp,
            ns: ns.name(),
            fp,
        };
        let Some((_, mut entry)) = policy.check(bytes, expect) else {
            return false;
        };
        entry.set_origin(policy.remote_origin(entry.origin()));
        self.link().absorb(vec![(ns, entry)]);
        true
    }

    /// Fences the key's publications by the lease and starts renewing it.
    fn guard(
        &self,
        tier: Arc<dyn Tier>,
        key: (Namespace, Fingerprint),
        held: HeldLease,
        ttl: Duration,
    ) -> LeaseGuard {
        let policy = self.policy();
        let held = Arc::new(held);
        self.publisher().fence(key.0, key.1, Arc::clone(&held));
        let renewal = self
            .renewer()
            .add(&policy.remote, held, ttl, policy.options.budget);
        LeaseGuard {
            remote: Arc::clone(&policy.remote),
            tier,
            key,
            budget: policy.options.budget,
            renewal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
