//! The tuner: a dispatch table in front of the cache, and the miss path that measures.
//!
//! A hit is a probe of an immutable hash map keyed by the caller's own key type (no
//! serialization, no fingerprint), published by read-copy-update. A miss fingerprints the
//! (bucketed) key and looks in the persistent cache; only what is not known is measured:
//! nothing if the entry is complete for the current candidate set; the new candidates plus the
//! current leader if the set grew or a tune was interrupted; the stored top few if only an older
//! scope (driver, library) has the key; everything otherwise. One thread per process tunes a
//! key while the others wait for it, and one process per cache file (a per-key claim lock) while
//! the others wait and then read its result.

mod background;
mod choose;
mod config;
mod consistency;
mod counters;
mod loose;
mod miss;
mod neighbours;

mod plan;
mod stability;
mod topk;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use cache_core::cache_format::{
    CandidateId, Entry, Fields, Fingerprint, Key, Scope, Value, to_fields,
};
use cache_core::{Cache, Namespace, SingleFlight, Store, StoreError};
use rustc_hash::FxBuildHasher;

use background::Background;
use config::ProgressFn;
pub use config::{MissPolicy, OpConfig, Progress, RemotePolicy, TuneError, TuneStats};
use consistency::Synced;
pub use consistency::{Consistency, SyncReport};
use counters::Counters;
pub use stability::{KeyStability, StabilityReport};

use crate::fleet::Fleet;
use crate::operation::OpError;
use crate::operation::Operation;
use crate::predict::Prediction;

/// What a hit returns: the chosen candidate and its ready-to-run handle.
#[derive(Debug)]
pub struct Choice<H> {
    candidate: CandidateId,
    handle: Arc<H>,
    provisional: bool,
    expires: Option<Instant>,
    /// The current candidates best first, for falling back when one fails.
    ranking: Vec<CandidateId>,
    key: Key,
    /// The prediction a provisional choice was made from, if it was.
    prediction: Option<Arc<Prediction>>,
    /// The scope whose entry a loose match reused, if it did.
    loose_from: Option<Scope>,
}

impl<H> Choice<H> {
    /// The chosen candidate.
    pub fn candidate(&self) -> &CandidateId {
        &self.candidate
    }

    /// The ready-to-run handle.
    pub fn handle(&self) -> &H {
        &self.handle
    }

    /// Whether this is a stand-in (a fallback while another thread or process tunes the key,
    /// or the nearest key's winner until a background tune finishes).
    pub fn is_provisional(&self) -> bool {
        self.provisional
    }

    /// The cache key it was chosen for (after bucketing).
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// For a provisional choice made by prediction ([`MissPolicy::NearestThenTune`]): the
    /// predicted ranking and the tuned keys that voted (see [`crate::predict`]).
    pub fn prediction(&self) -> Option<&Prediction> {
        self.prediction.as_deref()
    }

    /// For a provisional choice made by a loose match after an upgrade: the scope whose entry
    /// it reused (see `cache_format::loose_match`).
    pub fn loose_from(&self) -> Option<&Scope> {
        self.loose_from.as_ref()
    }
}

/// The shared part of a tuner: the cache and the settings every operation uses.
struct TunerShared {
    cache: Arc<Cache>,
    volatile: Vec<String>,
    progress: RwLock<Option<ProgressFn>>,
    consistency: Consistency,
    /// The fleet this tuner coordinates with, if any.
    fleet: Option<Arc<dyn Fleet>>,
    /// The operations registered, for [`Tuner::sync`].
    ops: Mutex<Vec<Weak<dyn Synced>>>,
}

impl TunerShared {
    fn new(cache: Arc<Cache>, volatile: Vec<String>, consistency: Consistency) -> Self {
        TunerShared {
            cache,
            volatile,
            progress: RwLock::new(None),
            consistency,
            fleet: None,
            ops: Mutex::new(Vec::new()),
        }
    }

    /// A copy with other settings, the progress callback kept (operations registered on the
    /// original stay with it).
    fn with(&self, volatile: Vec<String>, consistency: Consistency) -> Self {
        let mut shared = TunerShared::new(Arc::clone(&self.cache), volatile, consistency);
        shared.fleet.clone_from(&self.fleet);
        *shared.progress.write().unwrap_or_else(|p| p.into_inner()) = self
            .progress
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        shared
    }
}

/// Tunes operations on a cache. Cheap to clone.
#[derive(Clone)]
pub struct Tuner {
    shared: Arc<TunerShared>,
}

impl std::fmt::Debug for Tuner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tuner")
            .field("cache", &self.shared.cache)
            .finish()
    }
}

/// Scope fields that may change without invalidating what was measured as a starting point
/// (an upgrade): entries of a scope that differs only in these are re-timed, not re-tuned.
pub const DEFAULT_VOLATILE_SCOPE_FIELDS: [&str; 6] =
    ["driver", "cuda", "nvrtc", "library", "toolkit", "tuner"];

impl Tuner {
    /// A tuner over `cache` (whose scope should describe the device, see `cpu::scope` and
    /// `cuda::scope`).
    pub fn new(cache: Arc<Cache>) -> Self {
        let volatile = DEFAULT_VOLATILE_SCOPE_FIELDS
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        Tuner {
            shared: Arc::new(TunerShared::new(cache, volatile, Consistency::Local)),
        }
    }

    /// Replaces the scope fields treated as volatile (see [`DEFAULT_VOLATILE_SCOPE_FIELDS`]).
    pub fn with_volatile_scope_fields(self, fields: &[&str]) -> Self {
        let volatile = fields.iter().map(|s| (*s).to_owned()).collect();
        Tuner {
            shared: Arc::new(self.shared.with(volatile, self.shared.consistency)),
        }
    }

    /// Whose winner this tuner's operations use for a key (see [`Consistency`]; the default
    /// is [`Consistency::Local`]).
    pub fn with_consistency(self, consistency: Consistency) -> Self {
        Tuner {
            shared: Arc::new(self.shared.with(self.shared.volatile.clone(), consistency)),
        }
    }

    /// Coordinates with `fleet` (see [`crate::fleet`]): a key about to be measured is leased
    /// so that one process of the fleet measures it, and [`Consistency::Fleet`] reads the
    /// fleet's winners. With the `remote` feature, [`crate::fleet::of_cache`] gives a cache's
    /// shared tier as a fleet.
    pub fn with_fleet(self, fleet: Arc<dyn Fleet>) -> Self {
        let mut shared = self
            .shared
            .with(self.shared.volatile.clone(), self.shared.consistency);
        shared.fleet = Some(fleet);
        Tuner {
            shared: Arc::new(shared),
        }
    }

    /// The epoch: every registered operation's settled choices are checked against the
    /// fleet's entries (this process's records published first, then one round trip per
    /// operation; the publications share `timeout`, each read has the shared tier's budget),
    /// and each changed winner replaces its key's choice. Call it where every process
    /// of a job is at the same point (after a step's barrier): between two syncs no choice
    /// changes to follow the fleet. With [`Consistency::Local`] it works the same, on demand.
    pub fn sync(&self, timeout: Duration) -> SyncReport {
        let ops: Vec<Arc<dyn Synced>> = {
            let mut ops = lock(&self.shared.ops);
            ops.retain(|op| op.strong_count() > 0);
            ops.iter().filter_map(Weak::upgrade).collect()
        };
        // One bound for the whole sync, not one per operation.
        let deadline = cache_core::deadline_after(timeout);
        let mut report = SyncReport::default();
        for op in ops {
            op.sync(
                deadline.saturating_duration_since(Instant::now()),
                &mut report,
            );
        }
        report
    }

    /// Calls `f` with progress events from every operation of this tuner.
    pub fn on_progress(&self, f: impl Fn(&Progress<'_>) + Send + Sync + 'static) {
        *self
            .shared
            .progress
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(f));
    }

    /// The cache.
    pub fn cache(&self) -> &Arc<Cache> {
        &self.shared.cache
    }

    /// Registers an operation; the result serves its keys.
    pub fn register<O: Operation>(&self, op: O, config: OpConfig) -> Result<Tuned<O>, TuneError> {
        let ns = Namespace::new(op.namespace()).map_err(|e| TuneError::Namespace(e.to_string()))?;
        let tuned = Tuned {
            inner: Arc::new(TunedInner {
                op,
                config,
                ns,
                tuner: Arc::clone(&self.shared),
                dispatch: ArcSwap::from_pointee(HashMap::with_hasher(FxBuildHasher)),
                publish: Mutex::new(()),
                inflight: SingleFlight::new(),
                counters: Counters::default(),
                background: Mutex::new(Background::default()),
                counted: Mutex::new(HashMap::new()),
                neighbours: neighbours::Neighbours::default(),
            }),
        };
        let synced: Arc<dyn Synced> = Arc::clone(&tuned.inner) as Arc<dyn Synced>;
        lock(&self.shared.ops).push(Arc::downgrade(&synced));
        Ok(tuned)
    }
}

/// One registered operation: serves its keys, tuning on a miss.
pub struct Tuned<O: Operation> {
    inner: Arc<TunedInner<O>>,
}

impl<O: Operation> Clone for Tuned<O> {
    fn clone(&self) -> Self {
        Tuned {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<O: Operation> std::fmt::Debug for Tuned<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tuned")
            .field("namespace", &self.inner.ns)
            .finish()
    }
}

/// A key being tuned by one thread, its result waited for by the others.
type InFlight<O> =
    SingleFlight<<O as Operation>::Key, Result<Arc<Choice<<O as Operation>::Handle>>, TuneError>>;

type Dispatch<O> =
    HashMap<<O as Operation>::Key, Arc<Choice<<O as Operation>::Handle>>, FxBuildHasher>;

struct TunedInner<O: Operation> {
    op: O,
    config: OpConfig,
    ns: Namespace,
    tuner: Arc<TunerShared>,
    dispatch: ArcSwap<Dispatch<O>>,
    publish: Mutex<()>,
    inflight: InFlight<O>,
    counters: Counters,
    background: Mutex<Background<O::Key>>,
    /// Cache keys already counted in this process, each with whether this process measured
    /// it (`true`) or reused it: a bucket shared by many keys is counted once in `saved_time`,
    /// and a key served by a cache key measured here is not called reused.
    counted: Mutex<HashMap<Fingerprint, bool>>,
    /// The tuned keys of the namespace, indexed for predictions.
    neighbours: neighbours::Neighbours,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section here leaves its data consistent, so a poisoned lock is usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<O: Operation> Tuned<O> {
    /// The choice for `key`: a hash probe on a hit; on a miss, the cache, then measuring, as
    /// the policy says.
    #[inline]
    pub fn get(&self, key: &O::Key) -> Result<Arc<Choice<O::Handle>>, TuneError> {
        {
            let map = self.inner.dispatch.load();
            if let Some(choice) = map.get(key)
                && choice.expires.is_none_or(|t| Instant::now() < t)
            {
                self.inner.counters.hits.add(1);
                return Ok(Arc::clone(choice));
            }
        }
        self.inner.miss(key)
    }

    /// Runs `f` with the chosen handle; if it fails, the candidate is recorded as failed (in
    /// the cache, so no process chooses it again) and the runner-up is tried, until one
    /// succeeds or none is left.
    ///
    /// A hit runs `f` on the choice borrowed from the dispatch table: no reference count is
    /// touched, so threads running the same key do not contend on one (with [`Tuned::get`],
    /// each hit increments and decrements the choice's shared count).
    pub fn run<R>(
        &self,
        key: &O::Key,
        mut f: impl FnMut(&O::Handle) -> Result<R, OpError>,
    ) -> Result<R, TuneError> {
        let failed = {
            let map = self.inner.dispatch.load();
            match map.get(key) {
                Some(choice) if choice.expires.is_none_or(|t| Instant::now() < t) => {
                    self.inner.counters.hits.add(1);
                    match f(choice.handle()) {
                        Ok(r) => return Ok(r),
                        Err(reason) => Some((Arc::clone(choice), reason.to_string())),
                    }
                }
                _ => None,
            }
        };
        let mut choice = match failed {
            Some((choice, reason)) => self.inner.demote(key, &choice, reason)?,
            None => self.get(key)?,
        };
        loop {
            match f(choice.handle()) {
                Ok(r) => return Ok(r),
                Err(reason) => choice = self.inner.demote(key, &choice, reason.to_string())?,
            }
        }
    }

    /// Reads the keys of `keys` that the cache lacks from its shared tier, if it has one, in
    /// one round trip (a batch of calls about to start), so their misses find them in memory
    /// instead of asking the server one by one. Returns how many the server had.
    pub fn prefetch(&self, keys: &[O::Key]) -> usize {
        let fps: Vec<_> = keys
            .iter()
            .filter_map(|k| self.inner.cache_key(k).ok())
            .map(|k| k.fingerprint())
            .collect();
        self.inner.cache().prefetch(self.inner.ns, &fps)
    }

    /// The counters so far.
    pub fn stats(&self) -> TuneStats {
        self.inner.counters.snapshot()
    }

    /// The operation.
    pub fn operation(&self) -> &O {
        &self.inner.op
    }

    /// The namespace.
    pub fn namespace(&self) -> Namespace {
        self.inner.ns
    }

    /// Waits (bounded) until background tuning has nothing left to do.
    pub fn wait_background(&self, timeout: Duration) -> bool {
        let deadline = cache_core::deadline_after(timeout);
        loop {
            if !lock(&self.inner.background).busy() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// What every part of the miss path uses: the namespace, the cache, progress reports, the
/// cache key and the current candidates of a key, publication and recording.
impl<O: Operation> TunedInner<O> {
    pub(super) fn namespace(&self) -> &str {
        self.ns.name()
    }
    pub(super) fn cache(&self) -> &Cache {
        &self.tuner.cache
    }
    pub(super) fn progress(&self, event: &Progress<'_>) {
        let callback = self
            .tuner
            .progress
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(f) = callback {
            f(event);
        }
    }
    pub(super) fn cache_key(&self, key: &O::Key) -> Result<Key, TuneError> {
        let fields = to_fields(key).map_err(|e| TuneError::InvalidKey {
            namespace: self.namespace().to_owned(),
            reason: e.to_string(),
        })?;
        Ok(Key::new(self.config.bucketing.apply(fields)))
    }
    pub(super) fn current(&self, key: &O::Key) -> Vec<CandidateId> {
        self.op
            .candidates()
            .into_iter()
            .filter(|c| self.op.applies(c, key))
            .collect()
    }
    /// The measurement policy recorded with this operation's results: the operation's timer,
    /// the warm-up and samples asked for, interleaved.
    pub(super) fn policy(&self) -> Fields {
        let m = &self.config.measure;
        let mut policy = self.op.measure_policy();
        let int = |v: u128| Value::Int(i64::try_from(v).unwrap_or(i64::MAX));
        policy.insert("warmup_ns".to_owned(), int(m.warmup.as_nanos()));
        policy.insert(
            "samples".to_owned(),
            Value::Int(i64::from(m.samples.max(1))),
        );
        policy.insert("interleaved".to_owned(), Value::Bool(true));
        policy
    }
    pub(super) fn set_checksum(&self, current: &[CandidateId]) -> Fingerprint {
        Fingerprint::of_candidate_set(
            current.iter().map(|c| (c.algorithm.as_str(), &c.params)),
            &self.op.salt(),
        )
    }
    pub(super) fn publish(&self, key: &O::Key, choice: &Arc<Choice<O::Handle>>) {
        let _writer = lock(&self.publish);
        let mut map = Dispatch::<O>::clone(&self.dispatch.load());
        map.insert(key.clone(), Arc::clone(choice));
        self.dispatch.store(Arc::new(map));
    }
    /// Records a measurement; with `flush_each`, waits (at most `durable_wait`, and not at
    /// all while saves are failing) until it is durable.
    pub(super) fn record(&self, entry: Entry) {
        let cache = self.cache();
        let key = entry.key().clone();
        cache.put(self.ns, entry);
        self.neighbours.recorded(cache, self.ns, &key);
        if self.config.flush_each && !cache.is_saving_behind() {
            match cache.flush_within(self.config.durable_wait) {
                Ok(()) | Err(StoreError::NotPersistent { .. }) => {}
                // The saver keeps retrying; the result is in memory and queued.
                Err(e) => tracing::debug!("tunecache: a measurement is not durable yet: {e}"),
            }
        }
    }
}
