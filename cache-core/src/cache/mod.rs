//! `Cache`: the in-memory tier in front of the disk tier, with a background saver.
//!
//! Callers only ever touch memory: `get` is a shard lookup, `put` merges into memory and
//! queues the entry. One saver thread per cache does all file I/O: it gathers changes for
//! `save_delay`, takes the file lock (bounded wait), reads what other processes wrote
//! (through the version gate), appends one journal record or compacts, and retries with
//! back-off when the lock is busy or the disk fails. The queue is emptied only by a save that
//! succeeded, so a failure never loses a result. No caller waits on I/O except `flush` and
//! drop, and both wait a bounded time.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cache_format::{CacheData, Entry, Fingerprint, Scope};
use cache_migrate::Report;

use crate::claim::Claim;
use crate::config::{CacheBuilder, Location, MemoryOnly};
use crate::disk::{Disk, DiskOptions, Event, Failure, Incoming, Paths};
use crate::error::StoreError;
use crate::fsio;
use crate::lock::CacheLock;
use crate::memory::MemoryStore;
use crate::namespace::Namespace;
use crate::store::Store;

/// What a cache can do with its file right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Reads and writes its file.
    Persistent,
    /// Reads its file (and other processes' updates) but never writes.
    ReadOnly,
    /// Keeps results in memory only.
    Memory,
}

/// The state of a cache, for diagnostics and the CLI.
#[derive(Debug, Clone)]
pub struct Health {
    /// What it can do.
    pub mode: Mode,
    /// Its file, if it has one.
    pub path: Option<PathBuf>,
    /// Why it is not persistent, if it is not.
    pub reason: Option<String>,
    /// The last failed save, if the latest attempt failed.
    pub last_error: Option<String>,
    /// Files this cache moved aside because they were unusable.
    pub quarantined: Vec<PathBuf>,
    /// The migration applied when the file was loaded, if any.
    pub migration: Option<Report>,
    /// Results recorded but not yet durable.
    pub pending: usize,
    /// The shared tier, if the cache has one.
    pub remote: Option<crate::remote::RemoteHealth>,
}

struct State {
    /// Keys of the current scope changed in memory and not yet durable; the saver reads
    /// their merged entries from memory when it writes, so `put` copies nothing.
    dirty: HashSet<(Namespace, Fingerprint)>,
    /// Entries of other scopes waiting to be written (imports).
    other: CacheData,
    put_seq: u64,
    durable_seq: u64,
    dirty_since: Option<Instant>,
    rewrite: bool,
    flush_requested: u64,
    flush_served: u64,
    refresh_requested: u64,
    refresh_served: u64,
    last_error: Option<StoreError>,
    retry_at: Option<Instant>,
    failures: u32,
    shutdown: bool,
    saver_running: bool,
    /// `pause_saves` calls not yet resumed: no save starts while this is not 0.
    paused: u32,
    /// A save is writing (the file lock may be held).
    saving: bool,
}

struct Diagnostics {
    mode: Mode,
    reason: Option<String>,
    /// Conditions already reported: how many more times each came up, and its first line.
    warned: HashMap<String, (u64, String)>,
    quarantined: Vec<PathBuf>,
    migration: Option<Report>,
}

struct Shared {
    memory: MemoryStore,
    /// What every reader accepts: an entry beyond it is refused where it enters.
    limits: cache_format::Limits,
    /// Entries of the other scopes in the file (another GPU, an older driver): not for the
    /// hot path, but for warm starts after an upgrade.
    others: Mutex<CacheData>,
    scope: Scope,
    path: Option<PathBuf>,
    save_delay: Duration,
    lock_timeout: Duration,
    flush_timeout: Duration,
    refresh_interval: Option<Duration>,
    max_retry_delay: Duration,
    state: Mutex<State>,
    cv: Condvar,
    diag: Mutex<Diagnostics>,
    /// The shared tier, if one is configured.
    remote: Option<crate::remote::RemoteTier>,
    /// The read-only system tier (entries of this scope from the system files).
    system: MemoryStore,
    has_system: bool,
    publish: Mutex<shared_tier::Publish>,
    publish_cv: Condvar,
}

/// A persistent autotune cache for one application and scope. See the crate docs.
pub struct Cache {
    shared: Arc<Shared>,
    saver: Option<JoinHandle<()>>,
    publisher: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let health = self.health();
        f.debug_struct("Cache")
            .field("path", &health.path)
            .field("mode", &health.mode)
            .field("entries", &self.shared.memory.len())
            .finish()
    }
}

mod notice;
mod queue;
mod shared_tier;
pub(crate) mod system;

pub use queue::check_entry;
mod saver;

use notice::Notice;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the state consistent before it can panic, so a
    // poisoned mutex still guards valid data.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Cache {
    /// A builder for the application described by `registry`.
    pub fn builder(registry: cache_migrate::Migrations) -> CacheBuilder {
        CacheBuilder::new(registry)
    }

    pub(crate) fn open(builder: CacheBuilder) -> Cache {
        let (location, mut warnings) = builder.resolve();
        let registry = Arc::new(builder.registry.clone());
        let remote = builder.remote.clone().and_then(|remote| {
            let (options, notes) = builder.effective_remote_options();
            warnings.extend(notes);
            (options.mode != crate::remote::RemoteMode::Off).then(|| {
                crate::remote::RemoteTier::new(
                    remote,
                    options,
                    Arc::clone(&registry),
                    builder.limits,
                    builder.scope.clone(),
                )
            })
        });
        let (path, read_only) = match &location {
            Location::File { path, read_only } => (Some(path.clone()), *read_only),
            Location::Memory(_) => (None, false),
        };
        let system = MemoryStore::new();
        let mut system_notes = Vec::new();
        for p in builder.system_paths() {
            match system::load(&p, &registry, &builder.limits, &builder.scope) {
                Ok(entries) => {
                    system.merge_many(entries);
                }
                Err(why) => system_notes.push(format!(
                    "tunecache: the system file {} is ignored: {why}",
                    p.display()
                )),
            }
        }
        let has_system = !system.is_empty();
        let shared = Arc::new(Shared {
            memory: MemoryStore::new(),
            limits: builder.limits,
            others: Mutex::new(CacheData::new()),
            scope: builder.scope.clone(),
            path: path.clone(),
            save_delay: builder.save_delay,
            lock_timeout: builder.lock_timeout,
            flush_timeout: builder.effective_flush_timeout(),
            refresh_interval: builder.refresh_interval,
            max_retry_delay: builder.max_retry_delay,
            state: Mutex::new(State {
                dirty: HashSet::new(),
                other: CacheData::new(),
                put_seq: 0,
                durable_seq: 0,
                dirty_since: None,
                rewrite: false,
                flush_requested: 0,
                flush_served: 0,
                refresh_requested: 0,
                refresh_served: 0,
                last_error: None,
                retry_at: None,
                failures: 0,
                shutdown: false,
                saver_running: false,
                paused: 0,
                saving: false,
            }),
            cv: Condvar::new(),
            diag: Mutex::new(Diagnostics {
                mode: Mode::Memory,
                reason: None,
                warned: HashMap::new(),
                quarantined: Vec::new(),
                migration: None,
            }),
            remote,
            system,
            has_system,
            publish: Mutex::new(shared_tier::Publish::default()),
            publish_cv: Condvar::new(),
        });
        for w in warnings.into_iter().chain(system_notes) {
            shared.notify(Notice::config(w));
        }
        let mut cache = Cache {
            shared: Arc::clone(&shared),
            saver: None,
            publisher: None,
        };
        if shared.remote.as_ref().is_some_and(|t| t.writes()) {
            lock(&shared.publish).running = true;
            let worker = Arc::clone(&shared);
            match std::thread::Builder::new()
                .name("tunecache-publisher".into())
                .spawn(move || worker.run_publisher())
            {
                Ok(handle) => cache.publisher = Some(handle),
                Err(e) => {
                    lock(&shared.publish).running = false;
                    shared.notify(Notice::no_publisher(&e));
                }
            }
        }
        let path = match location {
            Location::Memory(why) => {
                if let MemoryOnly::NoLocation(reason) = &why {
                    shared.notify(Notice::memory_only(reason));
                }
                lock(&shared.diag).reason = Some(why.to_string());
                return cache;
            }
            Location::File { path, .. } => path,
        };
        let mut mode = if read_only {
            Mode::ReadOnly
        } else {
            Mode::Persistent
        };
        let paths = Paths::new(path.clone());
        // A file this build could write but no reader could read (an application name that
        // makes the header too large): keep results in memory instead.
        let empty = cache_format::encode_snapshot(
            builder.registry.app(),
            builder.registry.current(),
            &CacheData::new(),
        );
        if let Err(e) = cache_format::peek_header(&empty, &builder.limits) {
            let reason = format!(
                "the application name ({} bytes) makes a file no reader accepts: {e}",
                builder.registry.app().len()
            );
            shared.notify(Notice::memory_only(&reason));
            lock(&shared.diag).reason = Some(reason);
            return cache;
        }
        // A device, a FIFO or a folder at any of the cache's paths is never read, written,
        // locked or renamed (TUNECACHE_FILE=/dev/null means "no file", not "replace
        // /dev/null"): the cache stays in memory and creates nothing beside it.
        if let Err(e) = [&paths.snapshot, &paths.journal, &paths.lock]
            .into_iter()
            .try_for_each(|p| crate::fsio::check_regular(p))
        {
            let link = (paths.snapshot != path).then_some(path.as_path());
            shared.notify(Notice::not_a_file(&e, link));
            lock(&shared.diag).reason = Some(e.to_string());
            return cache;
        }
        if mode == Mode::Persistent
            && let Err(reason) = prepare_dir(&paths)
        {
            shared.notify(Notice::unwritable(&path, &reason));
            lock(&shared.diag).reason = Some(format!("cannot write {}: {reason}", path.display()));
            mode = if path.exists() {
                Mode::ReadOnly
            } else {
                Mode::Memory
            };
        } else if mode == Mode::ReadOnly {
            lock(&shared.diag).reason = Some("read-only".to_owned());
        }
        if mode == Mode::Memory {
            return cache;
        }
        let options = DiskOptions {
            limits: builder.limits,
            compact_ratio: builder.compact_ratio,
            compact_min_bytes: builder.compact_min_bytes,
            backup_on_migrate: builder.backup_on_migrate,
            compaction_budget: builder.compaction_budget,
            retention: builder.retention,
        };
        let mut disk = Disk::new(paths, registry, options);
        // The first read takes no lock, so other writers are not held up while a large file
        // is decoded. Then, if the lock is free, it is taken only to reconcile: read what
        // changed since (usually nothing) and make the repairs a locked read makes (cut a
        // torn tail, remove a stale journal or leftover temporaries). A read that found
        // damage is redone whole under the lock, so the damage is kept aside and reported
        // once, as a locked read does. With the lock busy, the saver repairs once it has it.
        match open_read(&mut disk, mode == Mode::Persistent, &shared.scope) {
            Ok(reads) => {
                for inc in reads {
                    shared.absorb(inc, mode == Mode::Persistent);
                }
            }
            Err(Failure::Blocked(b)) => {
                shared.block(&b.path, &b.cause.to_string());
                return cache;
            }
            Err(Failure::Retry(e)) => {
                shared.notify(Notice::first_read_failed(&e));
                let mut st = lock(&shared.state);
                st.rewrite = true;
                st.dirty_since.get_or_insert_with(Instant::now);
            }
        }
        lock(&shared.diag).mode = mode;
        if mode == Mode::Persistent || shared.refresh_interval.is_some() {
            lock(&shared.state).saver_running = true;
            let worker = Arc::clone(&shared);
            let spawned = std::thread::Builder::new()
                .name("tunecache-saver".into())
                .spawn(move || worker.run_saver(disk, mode));
            match spawned {
                Ok(handle) => cache.saver = Some(handle),
                Err(e) => {
                    lock(&shared.state).saver_running = false;
                    shared.notify(Notice::no_saver(&e));
                    let mut diag = lock(&shared.diag);
                    diag.mode = Mode::Memory;
                    diag.reason = Some(format!("no saver thread: {e}"));
                }
            }
        }
        cache
    }

    /// The current scope.
    pub fn scope(&self) -> &Scope {
        &self.shared.scope
    }

    /// The cache file, if the cache has one.
    pub fn path(&self) -> Option<&Path> {
        self.shared.path.as_deref()
    }

    /// Number of entries of the current scope in memory.
    pub fn len(&self) -> usize {
        self.shared.memory.len()
    }

    /// Whether there are no entries in memory.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every entry of the current scope, by namespace and fingerprint.
    pub fn entries(&self) -> Vec<(Namespace, Arc<Entry>)> {
        self.shared.memory.snapshot()
    }

    /// Claims the key `fp` of `ns` across the processes that share this cache's file, waiting
    /// at most `wait` for another holder (see [`Claim`]). A tuner takes it before measuring,
    /// so one process measures a key while the others wait and then read its result. The
    /// claim ends when the guard is dropped or the process dies.
    pub fn claim(&self, ns: Namespace, fp: &Fingerprint, wait: Duration) -> Claim {
        let Some(path) = self.shared.path.as_deref() else {
            return Claim::Unshared;
        };
        if lock(&self.shared.diag).mode != Mode::Persistent {
            return Claim::Unshared;
        }
        crate::claim::claim(&crate::fsio::resolve_link(path), ns, fp, wait)
    }

    /// The entries recorded for `fp` in `ns` under scopes other than the current one (the
    /// same device with an older driver, another device), for warm starts.
    pub fn lookup_other_scopes(&self, ns: Namespace, fp: &Fingerprint) -> Vec<(Scope, Entry)> {
        let others = lock(&self.shared.others);
        others
            .scopes()
            .filter_map(|(scope, data)| {
                data.namespace(ns.name())
                    .and_then(|entries| entries.get(fp))
                    .map(|e| (scope.clone(), e.clone()))
            })
            .collect()
    }

    /// Reads what other processes recorded since the last read, now, waiting a bounded time
    /// (the saver thread does the reading). A memory-only cache has nothing to read.
    pub fn refresh(&self) -> Result<(), StoreError> {
        let timeout = self.shared.flush_timeout;
        let deadline = Instant::now() + timeout;
        let mut st = lock(&self.shared.state);
        if !st.saver_running {
            return Ok(());
        }
        st.refresh_requested += 1;
        let request = st.refresh_requested;
        self.shared.cv.notify_all();
        while st.refresh_served < request {
            if !st.saver_running {
                return Ok(());
            }
            st = self.shared.wait_until(st, deadline, timeout)?;
        }
        Ok(())
    }

    /// What the cache can do, what it moved aside, what it migrated.
    pub fn health(&self) -> Health {
        // Lock order everywhere: state, then diagnostics.
        let st = lock(&self.shared.state);
        let diag = lock(&self.shared.diag);
        Health {
            mode: diag.mode,
            path: self.shared.path.clone(),
            reason: diag.reason.clone(),
            last_error: st.last_error.as_ref().map(ToString::to_string),
            quarantined: diag.quarantined.clone(),
            migration: diag.migration.clone(),
            pending: st.dirty.len() + st.other.len(),
            remote: self
                .shared
                .remote
                .as_ref()
                .map(|t| t.health(lock(&self.shared.publish).pending.len())),
        }
    }

    /// Reads the keys of `fps` that memory lacks from the shared tier, in one round trip
    /// within its budget (a tuner about to ask for many keys calls this first); returns how
    /// many the remote had. Without a remote, nothing.
    pub fn prefetch(&self, ns: Namespace, fps: &[Fingerprint]) -> usize {
        self.shared.fetch_remote(ns, fps)
    }

    /// Reads every entry of this cache's scope that the shared tier holds and merges them in
    /// (kept in the file as well); returns how many it held. For warming a fresh machine at
    /// start-up, or converging with what other machines published since. Without a remote,
    /// `Ok(0)`.
    pub fn pull_remote(&self, timeout: Duration) -> Result<usize, crate::remote::RemoteError> {
        self.shared.pull_remote(timeout)
    }

    /// Waits at most `timeout` until what was recorded so far is published to the shared
    /// tier (a command-line tool before it exits). Without a writable remote, `Ok` at once.
    pub fn publish_within(&self, timeout: Duration) -> Result<(), crate::remote::RemoteError> {
        self.shared.publish_within(timeout)
    }

    /// Queues entries of any scope for saving (e.g. an import); entries of the current scope
    /// are also merged into memory. Returns the namespace names that were refused (see
    /// [`Namespace::new`]); their entries are skipped.
    pub fn import(&self, data: CacheData) -> Vec<String> {
        let mut refused = Vec::new();
        let mut mine = Vec::new();
        let mut others = CacheData::new();
        for (scope, data) in data.into_scopes() {
            for (ns_name, entries) in data.into_namespaces() {
                let Ok(ns) = Namespace::new(&ns_name) else {
                    refused.push(ns_name);
                    continue;
                };
                for entry in entries.into_values() {
                    if let Err(why) = self.shared.admissible(&scope, &ns_name, &entry) {
                        self.shared.notify(Notice::refused_entry(&ns_name, &why));
                        continue;
                    }
                    if scope == self.shared.scope {
                        mine.push((ns, entry));
                    } else {
                        others.insert(&scope, &ns_name, entry);
                    }
                }
            }
        }
        self.shared.clamp(mine.iter_mut().map(|(_, e)| e));
        let keys: Vec<_> = mine.iter().map(|(ns, e)| (*ns, e.fingerprint())).collect();
        self.shared.queue_publish(keys.iter().copied());
        self.shared.memory.merge_many(mine);
        lock(&self.shared.others).merge(others.clone());
        let mut st = lock(&self.shared.state);
        st.dirty.extend(keys);
        st.other.merge(others);
        self.shared.mark_dirty(&mut st);
        refused
    }

    /// Flushes, then stops the saver. Equivalent to dropping, but reports the outcome.
    pub fn close(mut self) -> Result<(), StoreError> {
        let result = self.flush_inner(self.shared.flush_timeout);
        self.stop();
        result
    }

    /// Like [`Store::flush`], but waits at most `timeout` (instead of the cache's flush
    /// timeout); past it, `FlushTimeout` and the save goes on in the background.
    pub fn flush_within(&self, timeout: Duration) -> Result<(), StoreError> {
        self.flush_inner(timeout)
    }

    /// Holds the saver between saves until [`Cache::resume_saves`]: waits for a save in
    /// progress, and starts no other, so no thread of this cache holds the file lock. Taken
    /// around `fork()` (the Python package does), so a child never inherits the parent's
    /// lock. Calls nest; a closing cache saves anyway.
    pub fn pause_saves(&self) {
        let mut st = lock(&self.shared.state);
        st.paused += 1;
        while st.saving {
            st = self.shared.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Ends one [`Cache::pause_saves`].
    pub fn resume_saves(&self) {
        let mut st = lock(&self.shared.state);
        st.paused = st.paused.saturating_sub(1);
        self.shared.cv.notify_all();
    }

    /// Whether the latest save failed and the saver is retrying (a lock held by another
    /// process, a full disk): results are safe in memory but not yet durable. A caller that
    /// would wait for durability can skip the wait while this holds.
    pub fn is_saving_behind(&self) -> bool {
        lock(&self.shared.state).failures > 0
    }

    fn flush_inner(&self, timeout: Duration) -> Result<(), StoreError> {
        let deadline = Instant::now() + timeout;
        let mut st = lock(&self.shared.state);
        if !st.saver_running || lock(&self.shared.diag).mode != Mode::Persistent {
            let reason = lock(&self.shared.diag)
                .reason
                .clone()
                .unwrap_or_else(|| "in memory only".to_owned());
            return Err(StoreError::NotPersistent { reason });
        }
        let target = st.put_seq;
        if st.durable_seq >= target && !st.rewrite {
            return Ok(());
        }
        st.flush_requested += 1;
        let request = st.flush_requested;
        self.shared.cv.notify_all();
        loop {
            if st.durable_seq >= target && !st.rewrite {
                return Ok(());
            }
            if st.flush_served >= request {
                if let Some(e) = &st.last_error {
                    return Err(e.clone());
                }
                if !st.saver_running {
                    return Err(StoreError::NotPersistent {
                        reason: lock(&self.shared.diag)
                            .reason
                            .clone()
                            .unwrap_or_else(|| "the saver stopped".to_owned()),
                    });
                }
            }
            st = self.shared.wait_until(st, deadline, timeout)?;
        }
    }

    fn stop(&mut self) {
        self.stop_saver();
        if let Some(handle) = self.publisher.take() {
            // One last bounded round; a server that does not answer costs at most its budget.
            let wait = self
                .shared
                .remote
                .as_ref()
                .map_or(Duration::ZERO, |t| t.options().publish_budget)
                + Duration::from_millis(100);
            self.shared.stop_publisher(wait);
            if !lock(&self.shared.publish).running {
                let _ = handle.join();
            }
        }
        self.shared.summarize_repeats();
    }

    fn stop_saver(&mut self) {
        let Some(handle) = self.saver.take() else {
            return;
        };
        let deadline = Instant::now() + self.shared.flush_timeout;
        let mut st = lock(&self.shared.state);
        st.shutdown = true;
        self.shared.cv.notify_all();
        while st.saver_running {
            let now = Instant::now();
            if now >= deadline {
                let pending = st.dirty.len() + st.other.len();
                drop(st);
                self.shared
                    .notify(Notice::unsaved_at_close(pending, self.shared.flush_timeout));
                return; // detach: the thread finishes on its own
            }
            st = self
                .shared
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        drop(st);
        let _ = handle.join();
    }
}

impl Cache {
    /// A miss in memory: the system tier, then the shared tier.
    #[cold]
    fn miss(&self, ns: Namespace, fp: &Fingerprint) -> Option<Arc<Entry>> {
        if self.shared.has_system
            && let Some(e) = self.shared.system.get(ns, fp)
        {
            return Some(e);
        }
        if self.shared.remote.is_some() {
            return self.shared.read_through(ns, fp);
        }
        None
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Store for Cache {
    #[inline]
    fn get(&self, ns: Namespace, fp: &Fingerprint) -> Option<Arc<Entry>> {
        match self.shared.memory.get(ns, fp) {
            Some(e) => Some(e),
            None => self.miss(ns, fp),
        }
    }

    fn put(&self, ns: Namespace, entry: Entry) {
        if let Err(StoreError::Refused { reason, .. }) = self.try_put(ns, entry) {
            self.shared
                .notify(Notice::refused_entry(ns.name(), &reason));
        }
    }

    fn try_put(&self, ns: Namespace, mut entry: Entry) -> Result<(), StoreError> {
        self.shared
            .admissible(&self.shared.scope, ns.name(), &entry)
            .map_err(|reason| StoreError::Refused {
                namespace: ns.name().to_owned(),
                reason,
            })?;
        let fp = entry.fingerprint();
        self.shared.clamp(std::iter::once(&mut entry));
        // A result that will lose the merge to a later measurement of the same candidate
        // (another machine's clock) is kept out by the merge rule: say so.
        if let Some(stored) = self.shared.memory.get(ns, &fp) {
            for c in entry.candidates() {
                if let Some(kept) = stored.candidates().iter().find(|k| k.id == c.id)
                    && kept.measured_at > c.measured_at
                {
                    self.shared
                        .notify(Notice::lost_merge(&c.id.label(), kept.measured_at));
                }
            }
        }
        self.shared.memory.merge(ns, entry);
        self.shared.queue_publish([(ns, fp)]);
        let mut st = lock(&self.shared.state);
        st.dirty.insert((ns, fp));
        self.shared.mark_dirty(&mut st);
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.flush_inner(self.shared.flush_timeout)
    }
}

fn prepare_dir(paths: &Paths) -> Result<(), String> {
    std::fs::create_dir_all(&paths.dir)
        .map_err(|e| format!("cannot create {}: {e}", paths.dir.display()))?;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&paths.lock)
        .map(|_| ())
        .map_err(|e| format!("cannot open {}: {e}", paths.lock.display()))
}

/// The first read of [`Cache::open`] (see there): an unlocked read, then, with `writable` and
/// the lock free right now, a locked reconcile. Returns the reads to absorb, in order.
fn open_read(disk: &mut Disk, writable: bool, scope: &Scope) -> Result<Vec<Incoming>, Failure> {
    // The snapshot's entries of this scope stay in the file until used (see `lazy`).
    let first = disk.read_updates_keeping(false, Some(scope))?;
    let held = if writable {
        CacheLock::try_acquire(&disk.paths.lock, &disk.paths.dir)
            .ok()
            .flatten()
    } else {
        None
    };
    let Some(_held) = held else {
        return Ok(vec![first]);
    };
    fsio::remove_stale_temporaries(&disk.paths.snapshot);
    fsio::remove_stale_temporaries(&disk.paths.journal);
    let damaged = first.events.iter().any(|e| {
        matches!(
            e,
            Event::Unusable { .. } | Event::DamagedRecords { kept: None, .. }
        )
    });
    if damaged {
        disk.reset();
        return Ok(vec![disk.read_updates(true)?]);
    }
    let reconcile = disk.read_updates(true)?;
    Ok(vec![first, reconcile])
}
