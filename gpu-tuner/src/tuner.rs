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

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use cache_core::cache_format::{
    Candidate, Entry, Fields, Fingerprint, Key, Origin, Outcome, Scope, Stats, Value, now_millis,
    rank, to_fields,
};
use cache_core::{Cache, FileLock, Mode, Namespace, Store, StoreError};

use crate::bucket::Bucketing;
use crate::measure::{MeasureConfig, measure};
use crate::operation::{CandidateSpec, Operation};

/// What to do when a key has no usable entry.
#[derive(Debug, Clone, PartialEq)]
pub enum MissPolicy {
    /// Measure the candidates now (the default).
    TuneNow,
    /// Use the winner of the nearest already-tuned key now (or the first candidate if there is
    /// none), and tune this key on a background thread, spending at most `budget` of
    /// background tuning time in this process.
    NearestThenTune {
        /// Total background tuning time allowed.
        budget: Duration,
    },
    /// Never measure: use this declared default.
    Never {
        /// The candidate to use.
        default: CandidateSpec,
    },
}

/// How one operation is tuned.
#[derive(Debug, Clone)]
pub struct OpConfig {
    /// What a miss does.
    pub policy: MissPolicy,
    /// Key bucketing for this namespace.
    pub bucketing: Bucketing,
    /// Longest wait for another thread or process that is tuning the same key; past it, a
    /// provisional fallback is used and nothing is measured twice.
    pub wait: Duration,
    /// How candidates are measured.
    pub measure: MeasureConfig,
    /// After a scope change (same device, new driver or library), how many of the stored best
    /// candidates are re-timed.
    pub retime_top: usize,
    /// Make each candidate's measurement durable as soon as it is taken, so a killed tune
    /// resumes where it stopped.
    pub flush_each: bool,
    /// How long a provisional fallback is used before the key is looked at again.
    pub provisional_ttl: Duration,
}

impl Default for OpConfig {
    fn default() -> Self {
        OpConfig {
            policy: MissPolicy::TuneNow,
            bucketing: Bucketing::none(),
            wait: Duration::from_secs(30),
            measure: MeasureConfig::default(),
            retime_top: 3,
            flush_each: true,
            provisional_ttl: Duration::from_secs(1),
        }
    }
}

/// Why a key could not be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TuneError {
    /// The key cannot be turned into canonical fields (e.g. it has a float).
    #[error("invalid key for {namespace}: {reason}")]
    InvalidKey {
        /// The namespace.
        namespace: String,
        /// Why.
        reason: String,
    },
    /// No candidate can run the key.
    #[error("no candidate of {namespace} can run {key}: {reasons}")]
    NoCandidate {
        /// The namespace.
        namespace: String,
        /// The key.
        key: String,
        /// What each candidate said.
        reasons: String,
    },
    /// Setting up the problem to measure on failed.
    #[error("cannot set up {namespace} {key} for measuring: {reason}")]
    Problem {
        /// The namespace.
        namespace: String,
        /// The key.
        key: String,
        /// Why.
        reason: String,
    },
    /// The namespace name was refused.
    #[error("{0}")]
    Namespace(String),
}

/// What a hit returns: the chosen candidate and its ready-to-run handle.
#[derive(Debug)]
pub struct Choice<H> {
    candidate: CandidateSpec,
    handle: Arc<H>,
    provisional: bool,
    expires: Option<Instant>,
    /// The current candidates best first, for falling back when one fails.
    ranking: Vec<CandidateSpec>,
    key: Key,
}

impl<H> Choice<H> {
    /// The chosen candidate.
    pub fn candidate(&self) -> &CandidateSpec {
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
}

/// What the tuner is doing, for progress displays.
#[derive(Debug)]
pub enum Progress<'a> {
    /// Measuring starts for a key.
    Tuning {
        /// The namespace.
        namespace: &'a str,
        /// The key.
        key: &'a Key,
        /// How many candidates will be measured.
        candidates: usize,
    },
    /// One candidate was measured (or failed), and the result recorded (durable, with
    /// `flush_each`).
    Measured {
        /// The namespace.
        namespace: &'a str,
        /// The candidate.
        candidate: &'a CandidateSpec,
        /// Its statistics, or why it failed.
        result: Result<&'a Stats, &'a str>,
        /// Whether sampling stopped early because it was clearly losing.
        stopped_early: bool,
    },
    /// A key is tuned.
    Tuned {
        /// The namespace.
        namespace: &'a str,
        /// The key.
        key: &'a Key,
        /// The winner.
        winner: &'a CandidateSpec,
        /// Time spent preparing and measuring.
        elapsed: Duration,
    },
}

/// A progress callback.
pub type ProgressFn = Arc<dyn Fn(&Progress<'_>) + Send + Sync>;

/// Counters of one tuned operation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TuneStats {
    /// Calls served from the dispatch table.
    pub hits: u64,
    /// Calls that went to the miss path.
    pub misses: u64,
    /// Keys for which something was measured.
    pub tuned_keys: u64,
    /// Keys served from the persistent cache without measuring.
    pub reused_keys: u64,
    /// Candidates measured (or found failing).
    pub measured: u64,
    /// Provisional choices handed out.
    pub provisional: u64,
    /// Chosen candidates that failed at run time and were replaced by the runner-up.
    pub failures: u64,
    /// Time spent preparing and measuring.
    pub tuning_time: Duration,
    /// Tuning time recorded for the cache keys reused (each counted once, none that this
    /// process tuned itself): what this process did not spend.
    pub saved_time: Duration,
}

/// The shared part of a tuner: the cache and the settings every operation uses.
struct TunerShared {
    cache: Arc<Cache>,
    volatile: Vec<String>,
    progress: RwLock<Option<ProgressFn>>,
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
        Tuner {
            shared: Arc::new(TunerShared {
                cache,
                volatile: DEFAULT_VOLATILE_SCOPE_FIELDS
                    .iter()
                    .map(|s| (*s).to_owned())
                    .collect(),
                progress: RwLock::new(None),
            }),
        }
    }

    /// Replaces the scope fields treated as volatile (see [`DEFAULT_VOLATILE_SCOPE_FIELDS`]).
    pub fn with_volatile_scope_fields(self, fields: &[&str]) -> Self {
        Tuner {
            shared: Arc::new(TunerShared {
                cache: Arc::clone(&self.shared.cache),
                volatile: fields.iter().map(|s| (*s).to_owned()).collect(),
                progress: RwLock::new(
                    self.shared
                        .progress
                        .read()
                        .unwrap_or_else(|p| p.into_inner())
                        .clone(),
                ),
            }),
        }
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
        Ok(Tuned {
            inner: Arc::new(TunedInner {
                op,
                config,
                ns,
                tuner: Arc::clone(&self.shared),
                dispatch: ArcSwap::from_pointee(HashMap::with_hasher(FxBuild)),
                publish: Mutex::new(()),
                inflight: Mutex::new(HashMap::new()),
                counters: Counters::default(),
                background: Mutex::new(Background::default()),
                counted: Mutex::new(HashSet::new()),
            }),
        })
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

type InFlight<O> = HashMap<<O as Operation>::Key, Arc<Flight<<O as Operation>::Handle>>>;

type Dispatch<O> = HashMap<<O as Operation>::Key, Arc<Choice<<O as Operation>::Handle>>, FxBuild>;

struct TunedInner<O: Operation> {
    op: O,
    config: OpConfig,
    ns: Namespace,
    tuner: Arc<TunerShared>,
    dispatch: ArcSwap<Dispatch<O>>,
    publish: Mutex<()>,
    inflight: Mutex<InFlight<O>>,
    counters: Counters,
    background: Mutex<Background<O::Key>>,
    /// Cache keys already counted as tuned or reused in this process, so a bucket shared by
    /// many keys is counted once in `saved_time`.
    counted: Mutex<HashSet<Fingerprint>>,
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
    pub fn run<R>(
        &self,
        key: &O::Key,
        mut f: impl FnMut(&O::Handle) -> Result<R, String>,
    ) -> Result<R, TuneError> {
        let mut choice = self.get(key)?;
        loop {
            match f(choice.handle()) {
                Ok(r) => return Ok(r),
                Err(reason) => choice = self.inner.demote(key, &choice, reason)?,
            }
        }
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
        let deadline = Instant::now() + timeout;
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

/// The plan for a key that missed the dispatch table.
enum Plan {
    /// The stored entry is complete for the current candidate set.
    Use(Entry),
    /// Measure these; `entry` is what is stored already (if anything).
    Measure {
        entry: Option<Entry>,
        list: Vec<CandidateSpec>,
    },
    /// Nothing usable is stored.
    Miss,
}

impl<O: Operation> TunedInner<O> {
    fn namespace(&self) -> &str {
        self.ns.name()
    }

    fn cache(&self) -> &Cache {
        &self.tuner.cache
    }

    fn progress(&self, event: &Progress<'_>) {
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

    fn cache_key(&self, key: &O::Key) -> Result<Key, TuneError> {
        let fields = to_fields(key).map_err(|e| TuneError::InvalidKey {
            namespace: self.namespace().to_owned(),
            reason: e.to_string(),
        })?;
        Ok(Key::new(self.config.bucketing.apply(fields)))
    }

    fn current(&self, key: &O::Key) -> Vec<CandidateSpec> {
        self.op
            .candidates()
            .into_iter()
            .filter(|c| self.op.applies(c, key))
            .collect()
    }

    fn set_checksum(&self, current: &[CandidateSpec]) -> Fingerprint {
        Fingerprint::of_candidate_set(
            current.iter().map(|c| (c.algorithm.as_str(), &c.params)),
            &self.op.salt(),
        )
    }

    fn publish(&self, key: &O::Key, choice: &Arc<Choice<O::Handle>>) {
        let _writer = lock(&self.publish);
        let mut map = Dispatch::<O>::clone(&self.dispatch.load());
        map.insert(key.clone(), Arc::clone(choice));
        self.dispatch.store(Arc::new(map));
    }

    fn miss(self: &Arc<Self>, key: &O::Key) -> Result<Arc<Choice<O::Handle>>, TuneError> {
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        let (flight, leader) = {
            let mut inflight = lock(&self.inflight);
            if let Some(c) = self.dispatch.load().get(key)
                && c.expires.is_none_or(|t| Instant::now() < t)
            {
                return Ok(Arc::clone(c));
            }
            match inflight.get(key) {
                Some(f) => (Arc::clone(f), false),
                None => {
                    let f = Arc::new(Flight::default());
                    inflight.insert(key.clone(), Arc::clone(&f));
                    (f, true)
                }
            }
        };
        if !leader {
            // Another thread is on it: wait (bounded), never tune twice.
            return match flight.wait(self.config.wait) {
                Some(result) => result,
                None => self.fallback(key, "another thread is still tuning this key"),
            };
        }
        let result = self.resolve(key, &self.config.policy);
        if let Ok(choice) = &result {
            self.publish(key, choice);
        }
        lock(&self.inflight).remove(key);
        flight.finish(result.clone());
        result
    }

    /// Looks at what is stored for the key and decides what to measure.
    fn plan(&self, ckey: &Key, current: &[CandidateSpec], set: Fingerprint) -> Plan {
        let cache = self.cache();
        if let Some(stored) = cache.lookup(self.ns, ckey) {
            let stored = Entry::clone(&stored);
            let is_current = |c: &Candidate| current.iter().any(|s| s.matches(c));
            let recorded: Vec<&Candidate> = stored
                .candidates()
                .iter()
                .filter(|c| is_current(c))
                .collect();
            if stored.candidate_set() == set {
                return Plan::Use(stored);
            }
            let missing: Vec<CandidateSpec> = current
                .iter()
                .filter(|s| !recorded.iter().any(|c| s.matches(c)))
                .cloned()
                .collect();
            let leader = rank(recorded.iter().copied().filter(|c| c.stats().is_some()))
                .first()
                .map(|c| CandidateSpec {
                    algorithm: c.algorithm.clone(),
                    params: c.params.clone(),
                });
            if missing.is_empty() {
                // The set shrank (or a tune finished without its completion mark): nothing new.
                return Plan::Measure {
                    entry: Some(stored),
                    list: Vec::new(),
                };
            }
            // The set grew, or a tune was interrupted: the new ones, plus the current leader
            // measured again under the same conditions.
            let mut list = missing;
            list.extend(leader);
            return Plan::Measure {
                entry: Some(stored),
                list,
            };
        }
        // Warm start: the same key under a compatible older scope (a new driver or library).
        let mut priors: Vec<(Scope, Entry)> = cache
            .lookup_other_scopes(self.ns, &ckey.fingerprint())
            .into_iter()
            .filter(|(scope, _)| compatible(cache.scope(), scope, &self.tuner.volatile))
            .collect();
        priors.sort_by_key(|(_, e)| std::cmp::Reverse(e.recorded_at()));
        if let Some((_, prior)) = priors.first() {
            let top: Vec<CandidateSpec> = rank(
                prior
                    .candidates()
                    .iter()
                    .filter(|c| c.stats().is_some() && current.iter().any(|s| s.matches(c))),
            )
            .into_iter()
            .take(self.config.retime_top.max(1))
            .map(|c| CandidateSpec {
                algorithm: c.algorithm.clone(),
                params: c.params.clone(),
            })
            .collect();
            if !top.is_empty() {
                return Plan::Measure {
                    entry: None,
                    list: top,
                };
            }
        }
        Plan::Miss
    }

    fn resolve(
        self: &Arc<Self>,
        key: &O::Key,
        policy: &MissPolicy,
    ) -> Result<Arc<Choice<O::Handle>>, TuneError> {
        let ckey = self.cache_key(key)?;
        let current = self.current(key);
        if current.is_empty() {
            return Err(TuneError::NoCandidate {
                namespace: self.namespace().to_owned(),
                key: ckey.to_string(),
                reasons: "no candidate applies to this key".into(),
            });
        }
        let set = self.set_checksum(&current);
        // Fast path: complete in the cache, no claim needed.
        if let Plan::Use(entry) = self.plan(&ckey, &current, set) {
            return self.choose_reused(key, &ckey, &current, &entry);
        }
        // Someone has to measure: take the key's claim (other processes wait for it), and
        // look again, since another process may have finished it meanwhile.
        let claim = self.claim(&ckey);
        if !matches!(claim, Claim::Unshared) {
            let _ = self.cache().refresh();
        }
        let plan = self.plan(&ckey, &current, set);
        if let Claim::Busy = claim
            && !matches!(plan, Plan::Use(_))
        {
            return self.fallback(key, "another process is still tuning this key");
        }
        let choice = match plan {
            Plan::Use(entry) => self.choose_reused(key, &ckey, &current, &entry),
            Plan::Measure { entry, list } => self.tune(key, &ckey, &current, set, entry, list),
            Plan::Miss => match policy {
                MissPolicy::TuneNow => self.tune(key, &ckey, &current, set, None, current.clone()),
                MissPolicy::Never { default } => self.declared(key, &ckey, &current, default),
                MissPolicy::NearestThenTune { budget } => {
                    let choice = self.nearest(key, &ckey, &current)?;
                    self.enqueue_background(key.clone(), *budget);
                    Ok(choice)
                }
            },
        };
        drop(claim);
        choice
    }

    /// Measures `list` for the key, records each result as it completes, and chooses.
    fn tune(
        &self,
        key: &O::Key,
        ckey: &Key,
        current: &[CandidateSpec],
        set: Fingerprint,
        stored: Option<Entry>,
        list: Vec<CandidateSpec>,
    ) -> Result<Arc<Choice<O::Handle>>, TuneError> {
        let started = Instant::now();
        let origin = Origin::here();
        let mut entry = stored.unwrap_or_else(|| {
            Entry::new(
                ckey.clone(),
                Fingerprint::default(),
                origin.clone(),
                now_millis(),
                [],
            )
        });
        let mut handles: HashMap<CandidateSpec, Arc<O::Handle>> = HashMap::new();
        if !list.is_empty() {
            self.progress(&Progress::Tuning {
                namespace: self.namespace(),
                key: ckey,
                candidates: list.len(),
            });
            let mut problem = self.op.problem(key).map_err(|reason| TuneError::Problem {
                namespace: self.namespace().to_owned(),
                key: ckey.to_string(),
                reason,
            })?;
            let mut best = rank(
                entry
                    .candidates()
                    .iter()
                    .filter(|c| current.iter().any(|s| s.matches(c))),
            )
            .first()
            .and_then(|c| c.stats().map(|s| s.median_ns));
            for spec in &list {
                let t0 = Instant::now();
                let outcome = match self.op.prepare(spec, key) {
                    Err(e) => Err(format!("prepare failed: {e}")),
                    Ok(handle) => {
                        let handle = Arc::new(handle);
                        let measured =
                            measure(&self.op, &handle, &mut problem, &self.config.measure, best);
                        handles.insert(spec.clone(), handle);
                        measured
                    }
                };
                let mut candidate = match &outcome {
                    Ok(m) => {
                        Candidate::measured(spec.algorithm.clone(), spec.params.clone(), m.stats)
                    }
                    Err(e) => {
                        Candidate::failed(spec.algorithm.clone(), spec.params.clone(), e.clone())
                    }
                };
                candidate.tuning_ns = Some(t0.elapsed().as_nanos() as u64);
                if let Ok(m) = &outcome {
                    best = Some(best.map_or(m.stats.median_ns, |b| b.min(m.stats.median_ns)));
                }
                self.counters.measured.fetch_add(1, Ordering::Relaxed);
                // Durable now, marked incomplete (a zero candidate-set checksum), so a kill
                // resumes here.
                let record = Entry::new(
                    ckey.clone(),
                    Fingerprint::default(),
                    origin.clone(),
                    now_millis(),
                    [candidate],
                );
                entry.merge(record.clone());
                self.record(record);
                self.progress(&Progress::Measured {
                    namespace: self.namespace(),
                    candidate: spec,
                    result: outcome.as_ref().map(|m| &m.stats).map_err(String::as_str),
                    stopped_early: outcome.as_ref().is_ok_and(|m| m.stopped_early),
                });
            }
            self.counters.tuned_keys.fetch_add(1, Ordering::Relaxed);
            lock(&self.counted).insert(ckey.fingerprint());
            self.counters
                .tuning_ns
                .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        // Complete for this candidate set.
        let done = Entry::new(ckey.clone(), set, origin, now_millis(), []);
        entry.merge(done.clone());
        self.record(done);
        let choice = self.choose(key, ckey, current, &entry, handles)?;
        if !list.is_empty() {
            self.progress(&Progress::Tuned {
                namespace: self.namespace(),
                key: ckey,
                winner: &choice.candidate,
                elapsed: started.elapsed(),
            });
        }
        Ok(choice)
    }

    fn record(&self, entry: Entry) {
        self.cache().put(self.ns, entry);
        if self.config.flush_each {
            match self.cache().flush() {
                Ok(()) | Err(StoreError::NotPersistent { .. }) => {}
                // The saver keeps retrying; the result is in memory and queued.
                Err(e) => tracing::debug!("tunecache: a measurement is not durable yet: {e}"),
            }
        }
    }

    fn choose_reused(
        &self,
        key: &O::Key,
        ckey: &Key,
        current: &[CandidateSpec],
        entry: &Entry,
    ) -> Result<Arc<Choice<O::Handle>>, TuneError> {
        let saved: u64 = entry
            .candidates()
            .iter()
            .filter(|c| current.iter().any(|s| s.matches(c)))
            .filter_map(|c| c.tuning_ns)
            .sum();
        self.counters.reused_keys.fetch_add(1, Ordering::Relaxed);
        // Only what this process did not spend itself, once per cache key.
        if lock(&self.counted).insert(ckey.fingerprint()) {
            self.counters.saved_ns.fetch_add(saved, Ordering::Relaxed);
        }
        self.choose(key, ckey, current, entry, HashMap::new())
    }

    /// The best current candidate of `entry` that prepares; failing ones are recorded.
    fn choose(
        &self,
        key: &O::Key,
        ckey: &Key,
        current: &[CandidateSpec],
        entry: &Entry,
        mut handles: HashMap<CandidateSpec, Arc<O::Handle>>,
    ) -> Result<Arc<Choice<O::Handle>>, TuneError> {
        // Only candidates of the current set count: a stored winner that is not one of them is
        // ignored.
        let mut ranking: Vec<CandidateSpec> = rank(
            entry
                .candidates()
                .iter()
                .filter(|c| c.stats().is_some() && current.iter().any(|s| s.matches(c))),
        )
        .into_iter()
        .map(|c| CandidateSpec {
            algorithm: c.algorithm.clone(),
            params: c.params.clone(),
        })
        .collect();
        let mut reasons = Vec::new();
        while !ranking.is_empty() {
            let spec = ranking[0].clone();
            let handle = match handles.remove(&spec) {
                Some(h) => Ok(h),
                None => self.op.prepare(&spec, key).map(Arc::new),
            };
            match handle {
                Ok(handle) => {
                    return Ok(Arc::new(Choice {
                        candidate: spec,
                        handle,
                        provisional: false,
                        expires: None,
                        ranking,
                        key: ckey.clone(),
                    }));
                }
                Err(e) => {
                    reasons.push(format!("{spec}: {e}"));
                    self.record(Entry::new(
                        ckey.clone(),
                        Fingerprint::default(),
                        Origin::here(),
                        now_millis(),
                        [Candidate::failed(
                            spec.algorithm.clone(),
                            spec.params.clone(),
                            format!("prepare failed: {e}"),
                        )],
                    ));
                    ranking.remove(0);
                }
            }
        }
        for c in entry.candidates() {
            if let Outcome::Failed(r) = &c.outcome
                && current.iter().any(|s| s.matches(c))
            {
                reasons.push(format!("{}: {r}", c.algorithm));
            }
        }
        Err(TuneError::NoCandidate {
            namespace: self.namespace().to_owned(),
            key: ckey.to_string(),
            reasons: if reasons.is_empty() {
                "nothing was measured".into()
            } else {
                reasons.join("; ")
            },
        })
    }

    /// A stand-in while someone else tunes: the declared default, else the nearest tuned key's
    /// winner, else the first applicable candidate. Nothing is measured.
    fn fallback(
        self: &Arc<Self>,
        key: &O::Key,
        why: &str,
    ) -> Result<Arc<Choice<O::Handle>>, TuneError> {
        tracing::debug!(
            "tunecache: {} uses a provisional choice: {why}",
            self.namespace()
        );
        let ckey = self.cache_key(key)?;
        let current = self.current(key);
        let mut choice = match &self.config.policy {
            MissPolicy::Never { default } => self.declared(key, &ckey, &current, default)?,
            _ => self.nearest(key, &ckey, &current)?,
        };
        if let Some(c) = Arc::get_mut(&mut choice) {
            c.expires = Some(Instant::now() + self.config.provisional_ttl);
        }
        self.publish(key, &choice);
        Ok(choice)
    }

    fn provisional(
        &self,
        key: &O::Key,
        ckey: &Key,
        spec: CandidateSpec,
        current: &[CandidateSpec],
    ) -> Result<Arc<Choice<O::Handle>>, TuneError> {
        let handle = self
            .op
            .prepare(&spec, key)
            .map_err(|e| TuneError::NoCandidate {
                namespace: self.namespace().to_owned(),
                key: ckey.to_string(),
                reasons: format!("{spec}: {e}"),
            })?;
        self.counters.provisional.fetch_add(1, Ordering::Relaxed);
        let mut ranking = vec![spec.clone()];
        ranking.extend(current.iter().filter(|c| **c != spec).cloned());
        Ok(Arc::new(Choice {
            candidate: spec,
            handle: Arc::new(handle),
            provisional: true,
            expires: None,
            ranking,
            key: ckey.clone(),
        }))
    }

    fn declared(
        &self,
        key: &O::Key,
        ckey: &Key,
        current: &[CandidateSpec],
        default: &CandidateSpec,
    ) -> Result<Arc<Choice<O::Handle>>, TuneError> {
        let spec = if current.contains(default) {
            default.clone()
        } else {
            current[0].clone()
        };
        let mut choice = self.provisional(key, ckey, spec, current)?;
        if let Some(c) = Arc::get_mut(&mut choice) {
            // A declared default is the answer, not a stand-in.
            c.provisional = false;
        }
        Ok(choice)
    }

    /// The winner of the nearest tuned key of this namespace (same non-numeric fields, closest
    /// numeric ones), else the first current candidate.
    fn nearest(
        &self,
        key: &O::Key,
        ckey: &Key,
        current: &[CandidateSpec],
    ) -> Result<Arc<Choice<O::Handle>>, TuneError> {
        let mut best: Option<(f64, Fingerprint, CandidateSpec)> = None;
        for (ns, entry) in self.cache().entries() {
            if ns != self.ns || entry.fingerprint() == ckey.fingerprint() {
                continue;
            }
            let Some(d) = distance(ckey.fields(), entry.key().fields()) else {
                continue;
            };
            let Some(winner) = rank(
                entry
                    .candidates()
                    .iter()
                    .filter(|c| c.stats().is_some() && current.iter().any(|s| s.matches(c))),
            )
            .first()
            .map(|c| CandidateSpec {
                algorithm: c.algorithm.clone(),
                params: c.params.clone(),
            }) else {
                continue;
            };
            let better = best
                .as_ref()
                .is_none_or(|(bd, bfp, _)| d < *bd || (d == *bd && entry.fingerprint() < *bfp));
            if better {
                best = Some((d, entry.fingerprint(), winner));
            }
        }
        let spec = best.map_or_else(|| current[0].clone(), |(_, _, s)| s);
        self.provisional(key, ckey, spec, current)
    }

    fn enqueue_background(self: &Arc<Self>, key: O::Key, budget: Duration) {
        let mut bg = lock(&self.background);
        if bg.spent >= budget || bg.queue.contains(&key) {
            return;
        }
        bg.queue.push_back(key);
        if bg.running {
            return;
        }
        bg.running = true;
        let me = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name(format!("tunecache-tune-{}", self.namespace()))
            .spawn(move || me.background_loop(budget));
        if spawned.is_err() {
            bg.running = false;
            bg.queue.clear();
        }
    }

    fn background_loop(self: Arc<Self>, budget: Duration) {
        loop {
            let key = {
                let mut bg = lock(&self.background);
                match (bg.spent < budget).then(|| bg.queue.pop_front()).flatten() {
                    Some(k) => k,
                    None => {
                        bg.queue.clear();
                        bg.running = false;
                        return;
                    }
                }
            };
            let started = Instant::now();
            if let Ok(choice) = self.resolve(&key, &MissPolicy::TuneNow) {
                self.publish(&key, &choice);
            }
            lock(&self.background).spent += started.elapsed();
        }
    }

    /// Records that `choice` failed at run time and returns the runner-up's choice.
    fn demote(
        &self,
        key: &O::Key,
        choice: &Choice<O::Handle>,
        reason: String,
    ) -> Result<Arc<Choice<O::Handle>>, TuneError> {
        self.counters.failures.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            "tunecache: {} {} failed at run time ({reason}); falling back to the runner-up",
            self.namespace(),
            choice.candidate
        );
        self.record(Entry::new(
            choice.key.clone(),
            Fingerprint::default(),
            Origin::here(),
            now_millis(),
            [Candidate::failed(
                choice.candidate.algorithm.clone(),
                choice.candidate.params.clone(),
                format!("failed at run time: {reason}"),
            )],
        ));
        let rest: Vec<CandidateSpec> = choice
            .ranking
            .iter()
            .filter(|c| **c != choice.candidate)
            .cloned()
            .collect();
        let mut reasons = vec![format!("{}: {reason}", choice.candidate)];
        for (i, spec) in rest.iter().enumerate() {
            match self.op.prepare(spec, key) {
                Ok(handle) => {
                    let next = Arc::new(Choice {
                        candidate: spec.clone(),
                        handle: Arc::new(handle),
                        provisional: choice.provisional,
                        expires: choice.expires,
                        ranking: rest[i..].to_vec(),
                        key: choice.key.clone(),
                    });
                    self.publish(key, &next);
                    return Ok(next);
                }
                Err(e) => reasons.push(format!("{spec}: {e}")),
            }
        }
        Err(TuneError::NoCandidate {
            namespace: self.namespace().to_owned(),
            key: choice.key.to_string(),
            reasons: reasons.join("; "),
        })
    }

    fn claim(&self, ckey: &Key) -> Claim {
        let cache = self.cache();
        let Some(path) = cache.path() else {
            return Claim::Unshared;
        };
        if cache.health().mode != Mode::Persistent {
            return Claim::Unshared;
        }
        let mut dir = path.as_os_str().to_owned();
        dir.push(".claims");
        let dir = PathBuf::from(dir);
        if std::fs::create_dir_all(&dir).is_err() {
            return Claim::Unshared;
        }
        let safe: String = self
            .namespace()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let file = dir.join(format!("{safe}-{}.lock", ckey.fingerprint()));
        match FileLock::acquire(&file, self.config.wait) {
            Ok(lock) => Claim::Held(lock),
            Err(StoreError::LockTimeout { .. }) => Claim::Busy,
            Err(e) => {
                tracing::debug!("tunecache: no cross-process claim for a key: {e}");
                Claim::Unshared
            }
        }
    }
}

enum Claim {
    /// This process measures the key; others wait for this lock.
    Held(#[allow(dead_code, reason = "held for its drop, which releases the claim")] FileLock),
    /// Another process held the claim for longer than the wait.
    Busy,
    /// No file to share (memory-only cache): threads of this process are all there is.
    Unshared,
}

/// Whether `other` differs from `current` only in volatile fields (a driver or library
/// upgrade on the same device).
fn compatible(current: &Scope, other: &Scope, volatile: &[String]) -> bool {
    let stable = |s: &Scope| -> Vec<(String, Value)> {
        s.fields()
            .iter()
            .filter(|(k, _)| !volatile.iter().any(|v| v == *k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    current != other && stable(current) == stable(other)
}

/// Distance between two keys: `None` unless they have the same fields and equal non-numeric
/// values; otherwise the sum of |ln(a+1) - ln(b+1)| over integer fields (elementwise in lists).
fn distance(a: &Fields, b: &Fields) -> Option<f64> {
    if a.len() != b.len() {
        return None;
    }
    let mut total = 0.0;
    for ((ka, va), (kb, vb)) in a.iter().zip(b.iter()) {
        if ka != kb {
            return None;
        }
        total += value_distance(va, vb)?;
    }
    Some(total)
}

fn value_distance(a: &Value, b: &Value) -> Option<f64> {
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => {
            let f = |v: i64| ((v.max(0) as f64) + 1.0).ln();
            Some((f(*x) - f(*y)).abs() + if (x < &0) != (y < &0) { 1.0 } else { 0.0 })
        }
        (Value::List(x), Value::List(y)) if x.len() == y.len() => {
            x.iter().zip(y).map(|(p, q)| value_distance(p, q)).sum()
        }
        (Value::Map(x), Value::Map(y)) => distance(x, y),
        (x, y) if x == y => Some(0.0),
        _ => None,
    }
}

/// A key being tuned by one thread, waited for by others.
struct Flight<H> {
    result: Mutex<Option<Result<Arc<Choice<H>>, TuneError>>>,
    done: Condvar,
}

impl<H> Default for Flight<H> {
    fn default() -> Self {
        Flight {
            result: Mutex::new(None),
            done: Condvar::new(),
        }
    }
}

impl<H> Flight<H> {
    fn finish(&self, result: Result<Arc<Choice<H>>, TuneError>) {
        *lock(&self.result) = Some(result);
        self.done.notify_all();
    }

    fn wait(&self, timeout: Duration) -> Option<Result<Arc<Choice<H>>, TuneError>> {
        let deadline = Instant::now() + timeout;
        let mut guard = lock(&self.result);
        loop {
            if let Some(r) = guard.as_ref() {
                return Some(r.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            guard = self
                .done
                .wait_timeout(guard, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

struct Background<K> {
    queue: VecDeque<K>,
    running: bool,
    spent: Duration,
}

impl<K> Default for Background<K> {
    fn default() -> Self {
        Background {
            queue: VecDeque::new(),
            running: false,
            spent: Duration::ZERO,
        }
    }
}

impl<K> Background<K> {
    fn busy(&self) -> bool {
        self.running || !self.queue.is_empty()
    }
}

/// A counter split over cache lines, so threads hitting at once do not contend on one.
#[derive(Default)]
struct Striped([Padded; 8]);

#[repr(align(128))]
#[derive(Default)]
struct Padded(AtomicU64);

impl Striped {
    #[inline]
    fn add(&self, n: u64) {
        thread_local! {
            static STRIPE: usize = {
                static NEXT: AtomicU64 = AtomicU64::new(0);
                (NEXT.fetch_add(1, Ordering::Relaxed) % 8) as usize
            };
        }
        let i = STRIPE.with(|s| *s);
        self.0[i].0.fetch_add(n, Ordering::Relaxed);
    }

    fn sum(&self) -> u64 {
        self.0.iter().map(|p| p.0.load(Ordering::Relaxed)).sum()
    }
}

#[derive(Default)]
struct Counters {
    hits: Striped,
    misses: AtomicU64,
    tuned_keys: AtomicU64,
    reused_keys: AtomicU64,
    measured: AtomicU64,
    provisional: AtomicU64,
    failures: AtomicU64,
    tuning_ns: AtomicU64,
    saved_ns: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> TuneStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        TuneStats {
            hits: self.hits.sum(),
            misses: get(&self.misses),
            tuned_keys: get(&self.tuned_keys),
            reused_keys: get(&self.reused_keys),
            measured: get(&self.measured),
            provisional: get(&self.provisional),
            failures: get(&self.failures),
            tuning_time: Duration::from_nanos(get(&self.tuning_ns)),
            saved_time: Duration::from_nanos(get(&self.saved_ns)),
        }
    }
}

/// The multiply-rotate hash of rustc (FxHash): keys here are small integer structs chosen by
/// the caller, hashed on every hit, where SipHash's flooding resistance buys nothing.
#[derive(Default, Clone, Copy)]
struct FxBuild;

struct FxHasher(u64);

const FX_SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(FX_SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(b));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
}

impl BuildHasher for FxBuild {
    type Hasher = FxHasher;
    #[inline]
    fn build_hasher(&self) -> FxHasher {
        FxHasher(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(pairs: &[(&str, i64)]) -> Fields {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::Int(*v)))
            .collect()
    }

    #[test]
    fn distance_needs_the_same_fields_and_prefers_close_sizes() {
        let a = f(&[("m", 128), ("n", 128)]);
        let near = f(&[("m", 128), ("n", 256)]);
        let far = f(&[("m", 4096), ("n", 4096)]);
        assert!(distance(&a, &near).expect("comparable") < distance(&a, &far).expect("comparable"));
        assert_eq!(distance(&a, &f(&[("m", 128)])), None);
        let mut typed = a.clone();
        typed.insert("dtype", Value::from("f16"));
        let mut other = a.clone();
        other.insert("dtype", Value::from("f32"));
        assert_eq!(
            distance(&typed, &other),
            None,
            "different dtypes never stand in for each other"
        );
    }

    #[test]
    fn only_volatile_fields_may_differ_for_a_warm_start() {
        let s = |driver: &str, device: &str| {
            Scope::new(Fields::from([
                ("device".to_owned(), Value::from(device)),
                ("driver".to_owned(), Value::from(driver)),
            ]))
        };
        let volatile = vec!["driver".to_owned()];
        assert!(compatible(&s("560", "H100"), &s("550", "H100"), &volatile));
        assert!(
            !compatible(&s("560", "H100"), &s("560", "H100"), &volatile),
            "the same scope is not a prior"
        );
        assert!(!compatible(&s("560", "H100"), &s("550", "A100"), &volatile));
    }
}
