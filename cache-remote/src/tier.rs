//! The shared tier as a tier of a [`cache_core::Cache`]: read on a local miss (one round trip
//! within the budget; a key the server lacked is not asked again for a while), and what is
//! recorded here published by a thread of its own ([`CacheTier::run_publisher`], rounds decided
//! by [`crate::publisher`]). Opened by
//! `RemoteSource`; what only it does is reached through [`crate::RemoteHandle`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cache_core::{Fill, Namespace, Tier, TierHealth, TierLink};
use cache_format::{Entry, Fingerprint, Scope};

use crate::health::{Counters, RemoteHealth};
use crate::leases::Leases;
use crate::policy::Policy;
use crate::publish::PublishOutcome;
use crate::publisher::Publisher;
use crate::store::RemoteError;
use crate::value::Expect;

/// Past this many remembered misses, the negative cache starts over.
const NEGATIVE_MAX: usize = 100_000;

/// A cache's shared tier. Its parts are the jobs of their own modules: the policy around the
/// store, the publisher's queue, the leases this process holds.
#[derive(Debug)]
pub(crate) struct CacheTier {
    pub(crate) policy: Policy,
    pub(crate) scope: Scope,
    pub(crate) link: TierLink,
    /// Keys the remote lacked, and when it was last asked.
    negative: Mutex<HashMap<(Namespace, Fingerprint), Instant>>,
    pub(crate) leases: Leases,
    pub(crate) publisher: Publisher,
    /// The publisher's thread, once started.
    pub(crate) thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl CacheTier {
    /// The tier of one cache, its publisher not started.
    pub(crate) fn new(policy: Policy, scope: Scope, link: TierLink) -> Self {
        CacheTier {
            policy,
            scope,
            link,
            negative: Mutex::new(HashMap::new()),
            leases: Leases::default(),
            publisher: Publisher::default(),
            thread: Mutex::new(None),
        }
    }

    /// The publisher thread: each round's keys, read from the cache, published, what came
    /// back from the server folded in, and what is left queued again; until the publisher
    /// says stop.
    pub(crate) fn run_publisher(&self, delay: Duration) {
        while let Some(round) = self.publisher.next_round(delay, || self.policy.retry_at()) {
            let entries: Vec<(Namespace, Entry)> = round
                .keys
                .iter()
                .filter_map(|(ns, fp)| self.link.get(*ns, fp).map(|e| (*ns, Entry::clone(&e))))
                .collect();
            let outcome = self.publish(entries, round.force);
            if !outcome.folded.is_empty() {
                self.link.absorb(outcome.folded);
            }
            self.publisher
                .end_round(&round, outcome.left, outcome.error);
        }
    }

    /// Publishes entries of the cache's scope within the publish budget.
    pub(crate) fn publish(&self, entries: Vec<(Namespace, Entry)>, force: bool) -> PublishOutcome {
        let deadline = cache_core::deadline_after(self.policy.options.publish_budget);
        let fences = self.publisher.fences();
        crate::publish::publish(&self.policy, &self.scope, entries, deadline, force, &fences)
    }

    /// Reads the entries of `fps` (local misses) in one round trip within the budget;
    /// returns those found that pass every check, with origin `remote`.
    fn fetch(&self, ns: Namespace, fps: &[Fingerprint]) -> Vec<Entry> {
        let options = &self.policy.options;
        let now = Instant::now();
        let wanted: Vec<Fingerprint> = {
            let negative = crate::lock(&self.negative);
            fps.iter()
                .filter(|fp| {
                    negative
                        .get(&(ns, **fp))
                        .is_none_or(|t| now.duration_since(*t) >= options.negative_ttl)
                })
                .copied()
                .collect()
        };
        if wanted.is_empty() || !self.policy.allow(options.budget) {
            return Vec::new();
        }
        let budget = self.batch_budget(wanted.len());
        let Some(values) = self.read(ns, &wanted, now + budget) else {
            return Vec::new();
        };
        let mut found = Vec::new();
        let mut missed = Vec::new();
        for (fp, entry) in wanted.iter().zip(self.checked(ns, &wanted, values)) {
            match entry {
                Some(entry) => found.push(entry),
                None => missed.push(*fp),
            }
        }
        if !missed.is_empty() {
            let mut negative = crate::lock(&self.negative);
            if negative.len() + missed.len() > NEGATIVE_MAX {
                negative.clear();
            }
            negative.extend(missed.into_iter().map(|fp| ((ns, fp), now)));
        }
        found
    }

    /// The values read for `fps`, each checked (a refused one is a miss) and given origin
    /// `remote`; counted as hits and misses.
    fn checked(
        &self,
        ns: Namespace,
        fps: &[Fingerprint],
        values: Vec<Option<Vec<u8>>>,
    ) -> Vec<Option<Entry>> {
        let scope_fp = self.scope.fingerprint();
        fps.iter()
            .zip(values)
            .map(|(fp, value)| {
                let expect = Expect {
                    scope: &scope_fp,
                    ns: ns.name(),
                    fp,
                };
                let checked = value.and_then(|bytes| self.policy.check(&bytes, expect));
                let counter = match checked {
                    Some(_) => &self.policy.counters.hits,
                    None => &self.policy.counters.misses,
                };
                Counters::bump(counter, 1);
                checked.map(|(_, mut entry)| {
                    entry.set_origin(self.policy.remote_origin(entry.origin()));
                    entry
                })
            })
            .collect()
    }

    /// See [`crate::RemoteHandle::view`]: what this cache holds for the keys is offered to
    /// the publisher and published (within `timeout`; a failure is no reason not to read),
    /// then the keys are read in one round trip within the budget, the negative cache skipped.
    pub(crate) fn view(
        &self,
        ns: Namespace,
        fps: &[Fingerprint],
        timeout: Duration,
    ) -> Result<Vec<Option<Entry>>, ViewError> {
        if self.policy.writes() {
            // Even entries of an earlier run that never reached the tier join the fleet's.
            let held: Vec<(Namespace, Fingerprint)> = fps
                .iter()
                .filter(|fp| self.link.get(ns, fp).is_some())
                .map(|fp| (ns, *fp))
                .collect();
            self.publisher.queue(&held);
        }
        if let Err(e) = self.publisher.publish_within(timeout) {
            tracing::debug!("tunecache: the fleet's view is read before this cache published: {e}");
        }
        let budget = self.policy.options.budget;
        let tier = || self.policy.describe.clone();
        if !self.policy.allow(budget) {
            return Err(ViewError::Unavailable { tier: tier() });
        }
        let values = self
            .read(
                ns,
                fps,
                cache_core::deadline_after(self.batch_budget(fps.len())),
            )
            .ok_or_else(|| ViewError::Unread { tier: tier() })?;
        if values.len() != fps.len() {
            return Err(ViewError::Short {
                tier: tier(),
                got: values.len(),
                asked: fps.len(),
            });
        }
        Ok(self.checked(ns, fps, values))
    }

    /// The read budget of a batch of `keys` on this tier's store (see
    /// [`crate::RemoteOptions::budget`]).
    fn batch_budget(&self, keys: usize) -> Duration {
        let per_round = self.policy.remote.keys_per_round();
        crate::options::batch_budget(self.policy.options.budget, keys, per_round)
    }

    /// One read of the keys of `fps`, refreshing their time to live where this cache writes
    /// (a full server refuses that write: then read without it). `None` if the call failed.
    fn read(
        &self,
        ns: Namespace,
        fps: &[Fingerprint],
        deadline: Instant,
    ) -> Option<Vec<Option<Vec<u8>>>> {
        let policy = &self.policy;
        let keys: Vec<String> = fps
            .iter()
            .map(|fp| policy.layout.key(&self.scope, ns.name(), fp))
            .collect();
        let touch = (policy.writes() && !policy.full())
            .then_some(policy.options.ttl)
            .flatten();
        let mut result = policy.remote.get_many(&keys, policy.read(touch), deadline);
        if touch.is_some() && matches!(result, Err(RemoteError::Full(_))) {
            policy.outcome(&result);
            result = policy.remote.get_many(&keys, policy.read(None), deadline);
        }
        policy.outcome(&result);
        result.ok()
    }

    /// Every entry of the cache's scope on the server, checked, by namespace.
    pub(crate) fn pull_scope(
        &self,
        deadline: Instant,
    ) -> Result<Vec<(Namespace, Entry)>, RemoteError> {
        let pattern = self.policy.layout.scope_pattern(&self.scope);
        let keys = self.policy.scan(&pattern, deadline)?;
        Ok(self
            .policy
            .read_keys(&keys, deadline)?
            .into_iter()
            .filter_map(|(_, ns, entry)| Some((Namespace::new(&ns).ok()?, entry)))
            .collect())
    }

    pub(crate) fn remote_health(&self) -> RemoteHealth {
        self.policy.health(self.publisher.pending())
    }
}

impl Tier for CacheTier {
    fn name(&self) -> &'static str {
        "shared"
    }

    fn describe(&self) -> String {
        self.policy.describe.clone()
    }

    fn budget(&self) -> Duration {
        self.policy.options.budget
    }

    fn fill(&self) -> Fill {
        Fill::Keep
    }

    fn get_many(&self, ns: Namespace, fps: &[Fingerprint]) -> Vec<Arc<Entry>> {
        self.fetch(ns, fps).into_iter().map(Arc::new).collect()
    }

    fn offer(&self, keys: &[(Namespace, Fingerprint)]) {
        if self.policy.writes() {
            self.publisher.queue(keys);
        }
    }

    fn health(&self) -> TierHealth {
        self.remote_health().to_tier_health()
    }

    fn close(&self) {
        self.leases.renewer.shutdown();
        let Some(handle) = crate::lock(&self.thread).take() else {
            return;
        };
        // One last round: the whole publish budget while the store answers, and only
        // CLOSE_SILENCE for a store that does not (a frozen bucket must not cost a short
        // command its whole budget at exit).
        let cap = self.policy.options.publish_budget + Duration::from_millis(100);
        let answered = || {
            self.policy
                .answered
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        let left = self.publisher.stop(CLOSE_SILENCE, cap, answered);
        if left > 0 {
            tracing::warn!(
                "tunecache: {left} results were not published to {} (it did not answer within \
                 {:?} at the end); they are in the local cache, and `tunecache remote push` \
                 publishes them",
                self.policy.describe,
                CLOSE_SILENCE
            );
        } else {
            let _ = handle.join();
        }
    }
}

/// How long a closing tier waits for a store that does not answer at all (its connection
/// accepted and silent, or refused): then the process may end.
const CLOSE_SILENCE: Duration = Duration::from_secs(3);

/// Why the fleet's entries could not be read ([`crate::RemoteHandle::view`]): only this
/// cache's own entries are known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViewError {
    /// The tier is off the path (its server failed, and the breaker keeps it off until a
    /// probe finds it back).
    #[error("{tier} is unavailable")]
    Unavailable {
        /// Where the tier is (never a password).
        tier: String,
    },
    /// The read failed or ran out of time.
    #[error("{tier} could not be read")]
    Unread {
        /// Where the tier is.
        tier: String,
    },
    /// The server answered for fewer keys than asked.
    #[error("{tier} answered {got} of {asked} keys")]
    Short {
        /// Where the tier is.
        tier: String,
        /// Keys answered.
        got: usize,
        /// Keys asked.
        asked: usize,
    },
}
