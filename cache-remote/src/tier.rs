//! The shared tier as a tier of a [`Cache`]: read on a local miss (one round trip within the
//! budget; a key the server lacked is not asked again for a while), and what is recorded
//! here published by a thread of its own ([`crate::publisher`]). [`RemoteBuilder`] gives a
//! builder a shared tier, [`RemoteCache`] the calls only a shared tier has.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cache_core::{
    Cache, CacheBuilder, Fill, Namespace, Tier, TierContext, TierHealth, TierLink, TierSource,
};
use cache_format::{Entry, Fingerprint, Scope};

use crate::health::{Counters, RemoteHealth};
use crate::options::{RemoteMode, RemoteOptions};
use crate::policy::Policy;
use crate::publish::PublishOutcome;
use crate::publisher::{self, Publisher};
use crate::renewer::Renewer;
use crate::store::{Remote, RemoteError};
use crate::value::Expect;

/// Past this many remembered misses, the negative cache starts over.
const NEGATIVE_MAX: usize = 100_000;

/// A cache's shared tier.
#[derive(Debug)]
pub(crate) struct CacheTier {
    policy: Policy,
    scope: Scope,
    link: TierLink,
    /// Keys the remote lacked, and when it was last asked.
    negative: Mutex<HashMap<(Namespace, Fingerprint), Instant>>,
    /// Lease holders that kept this process waiting a whole wait, and when (see
    /// `fleet::waits_on`).
    pub(crate) stalled: Mutex<HashMap<String, Instant>>,
    publisher: Publisher,
    renewer: Arc<Renewer>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl CacheTier {
    pub(crate) fn policy(&self) -> &Policy {
        &self.policy
    }

    pub(crate) fn publisher(&self) -> &Publisher {
        &self.publisher
    }

    pub(crate) fn renewer(&self) -> &Arc<Renewer> {
        &self.renewer
    }

    pub(crate) fn link(&self) -> &TierLink {
        &self.link
    }

    pub(crate) fn scope(&self) -> &Scope {
        &self.scope
    }

    /// Publishes entries of the cache's scope within the publish budget.
    pub(crate) fn publish(&self, entries: Vec<(Namespace, Entry)>, force: bool) -> PublishOutcome {
        let deadline = Instant::now() + self.policy.options.publish_budget;
        let fences = self.publisher.fences();
        self.policy
            .publish(&self.scope, entries, deadline, force, &fences)
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
        let Some(values) = self.read(ns, &wanted, now + options.budget) else {
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

    /// See [`Tier::fleet_view`]: what this cache recorded is published first (within
    /// `timeout`; a failure is no reason not to read), then the keys are read in one round
    /// trip within the budget, the negative cache skipped.
    fn view(
        &self,
        ns: Namespace,
        fps: &[Fingerprint],
        timeout: Duration,
    ) -> Result<Vec<Option<Entry>>, String> {
        if let Err(e) = self.publisher.publish_within(timeout) {
            tracing::debug!("tunecache: the fleet's view is read before this cache published: {e}");
        }
        let budget = self.policy.options.budget;
        if !self.policy.allow(budget) {
            return Err(format!("{} is unavailable", self.policy.describe));
        }
        let values = self
            .read(ns, fps, Instant::now() + budget)
            .ok_or_else(|| format!("{} could not be read", self.policy.describe))?;
        if values.len() != fps.len() {
            return Err(format!(
                "{} answered {} of {} keys",
                self.policy.describe,
                values.len(),
                fps.len()
            ));
        }
        Ok(self.checked(ns, fps, values))
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
    fn pull_scope(&self, deadline: Instant) -> Result<Vec<(Namespace, Entry)>, RemoteError> {
        let pattern = self.policy.layout.scope_pattern(&self.scope);
        let keys = self.policy.scan(&pattern, deadline)?;
        Ok(self
            .policy
            .read_keys(&keys, deadline)?
            .into_iter()
            .filter_map(|(_, ns, entry)| Some((Namespace::new(&ns).ok()?, entry)))
            .collect())
    }

    fn remote_health(&self) -> RemoteHealth {
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

    fn fleet_claim(
        &self,
        this: &Arc<dyn Tier>,
        ns: Namespace,
        fp: &Fingerprint,
        wait: Duration,
    ) -> Option<cache_core::FleetClaim> {
        Some(CacheTier::fleet_claim(self, Arc::clone(this), ns, fp, wait))
    }

    fn fleet_view(
        &self,
        ns: Namespace,
        fps: &[Fingerprint],
        timeout: Duration,
    ) -> Option<Result<Vec<Option<Entry>>, String>> {
        Some(self.view(ns, fps, timeout))
    }

    fn health(&self) -> TierHealth {
        self.remote_health().to_tier_health()
    }

    fn close(&self) {
        self.renewer.shutdown();
        let Some(handle) = crate::lock(&self.thread).take() else {
            return;
        };
        // One last bounded round; a server that does not answer costs at most its budget.
        let wait = self.policy.options.publish_budget + Duration::from_millis(100);
        if self.publisher.stop(wait) {
            let _ = handle.join();
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A shared tier waiting for its cache (what [`RemoteBuilder`] gives the builder).
#[derive(Debug, Clone)]
pub struct RemoteSource {
    remote: Arc<dyn Remote>,
    options: RemoteOptions,
}

impl RemoteSource {
    /// The shared tier on `remote`, used as `options` say (`TUNECACHE_REMOTE_MODE` and
    /// `TUNECACHE_REMOTE_TIMEOUT_MS` override the mode and the budget).
    pub fn new(remote: Arc<dyn Remote>, options: RemoteOptions) -> Self {
        RemoteSource { remote, options }
    }
}

impl TierSource for RemoteSource {
    fn open(&self, ctx: &mut TierContext<'_>) -> Option<Arc<dyn Tier>> {
        let (options, warnings) = self.options.clone().with_env(|name| ctx.env(name));
        for w in warnings {
            ctx.warn(w);
        }
        if options.mode == RemoteMode::Off {
            return None;
        }
        let writes = options.writes();
        let tier = Arc::new(CacheTier {
            policy: Policy::new(
                Arc::clone(&self.remote),
                options,
                Arc::clone(ctx.registry),
                *ctx.limits,
            ),
            scope: ctx.scope.clone(),
            link: ctx.link.clone(),
            negative: Mutex::new(HashMap::new()),
            stalled: Mutex::new(HashMap::new()),
            publisher: Publisher::default(),
            renewer: Arc::default(),
            thread: Mutex::new(None),
        });
        if writes {
            tier.publisher.set_running(true);
            let worker = Arc::clone(&tier);
            let delay = ctx.save_delay;
            match std::thread::Builder::new()
                .name("tunecache-publisher".into())
                .spawn(move || publisher::run(worker, delay))
            {
                Ok(handle) => *crate::lock(&tier.thread) = Some(handle),
                Err(e) => {
                    tier.publisher.set_running(false);
                    ctx.warn(format!(
                        "tunecache could not start its publisher thread: {e}; results are not \
                         published to the shared tier"
                    ));
                }
            }
        }
        Some(tier)
    }
}

/// A shared tier for a [`CacheBuilder`].
pub trait RemoteBuilder: Sized {
    /// A shared tier on `remote` behind the file (e.g. a [`crate::RedisRemote`]), with the
    /// default [`RemoteOptions`]: read on a local miss, published to in the background.
    fn remote(self, remote: Arc<dyn Remote>) -> Self {
        self.remote_with(remote, RemoteOptions::default())
    }

    /// [`RemoteBuilder::remote`] used as `options` say.
    fn remote_with(self, remote: Arc<dyn Remote>, options: RemoteOptions) -> Self;

    /// The shared tier named by `TUNECACHE_REMOTE`, if set. A value that is not a usable
    /// address is an error naming the variable (the password left out).
    fn remote_from_env(self) -> Result<Self, crate::ConfigError> {
        Ok(match crate::from_env()? {
            Some(remote) => self.remote(remote),
            None => self,
        })
    }

    /// The shared tier at `address`, or else the one `TUNECACHE_REMOTE` names; an address
    /// that is not usable leaves the cache without one, with a warning (what an embedding
    /// that must open anyway, the Python package and the C ABI, does).
    fn remote_or_warn(self, address: Option<&str>) -> Self {
        let remote = match address {
            Some(address) => crate::connect(address).map(Some),
            None => crate::from_env(),
        };
        match remote {
            Ok(Some(r)) => self.remote(r),
            Ok(None) => self,
            Err(e) => {
                tracing::warn!("tunecache: no shared tier: {e}");
                self
            }
        }
    }
}

impl RemoteBuilder for CacheBuilder {
    fn remote_with(self, remote: Arc<dyn Remote>, options: RemoteOptions) -> Self {
        self.tier(RemoteSource::new(remote, options))
    }
}

/// What only a shared tier does, on a [`Cache`] that has one.
pub trait RemoteCache {
    /// The shared tier's counters, if the cache has one.
    fn remote_health(&self) -> Option<RemoteHealth>;

    /// Reads every entry of this cache's scope that the shared tier holds and merges them in
    /// (kept in the file as well); returns how many it held. For warming a fresh machine at
    /// start-up, or converging with what other machines published since. Without a shared
    /// tier, `Ok(0)`.
    fn pull_remote(&self, timeout: Duration) -> Result<usize, RemoteError>;

    /// Waits at most `timeout` until what was recorded so far is published to the shared
    /// tier (a command-line tool before it exits). Without a writable one, `Ok` at once.
    fn publish_within(&self, timeout: Duration) -> Result<(), RemoteError>;
}

fn shared_tier(cache: &Cache) -> Option<&CacheTier> {
    cache
        .tiers()
        .iter()
        .find_map(|t| t.as_any().downcast_ref::<CacheTier>())
}

impl RemoteCache for Cache {
    fn remote_health(&self) -> Option<RemoteHealth> {
        shared_tier(self).map(CacheTier::remote_health)
    }

    fn pull_remote(&self, timeout: Duration) -> Result<usize, RemoteError> {
        let Some(tier) = shared_tier(self) else {
            return Ok(0);
        };
        let pulled = tier.pull_scope(Instant::now() + timeout)?;
        let n = pulled.len();
        tier.link.absorb(pulled);
        Ok(n)
    }

    fn publish_within(&self, timeout: Duration) -> Result<(), RemoteError> {
        match shared_tier(self) {
            Some(tier) => tier.publisher.publish_within(timeout),
            None => Ok(()),
        }
    }
}
