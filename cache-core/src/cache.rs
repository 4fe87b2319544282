//! `Cache`: the in-memory tier in front of the disk tier, with a background saver.
//!
//! Callers only ever touch memory: `get` is a shard lookup, `put` merges into memory and
//! queues the entry. One saver thread per cache does all file I/O: it gathers changes for
//! `save_delay`, takes the file lock (bounded wait), reads what other processes wrote
//! (through the version gate), appends one journal record or compacts, and retries with
//! back-off when the lock is busy or the disk fails. The queue is emptied only by a save that
//! succeeded, so a failure never loses a result. No caller waits on I/O except `flush` and
//! drop, and both wait a bounded time.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cache_format::{CacheData, Entry, Fingerprint, Scope};
use cache_migrate::Report;

use crate::config::{CacheBuilder, Location};
use crate::disk::{Disk, DiskOptions, Event, Failure, Incoming, Paths};
use crate::error::StoreError;
use crate::lock::FileLock;
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
}

struct Diagnostics {
    mode: Mode,
    reason: Option<String>,
    warned: HashSet<String>,
    quarantined: Vec<PathBuf>,
    migration: Option<Report>,
}

struct Shared {
    memory: MemoryStore,
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
}

/// A persistent autotune cache for one application and scope. See the crate docs.
pub struct Cache {
    shared: Arc<Shared>,
    saver: Option<JoinHandle<()>>,
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
        let (location, warnings) = builder.resolve();
        let (path, read_only) = match &location {
            Location::File { path, read_only } => (Some(path.clone()), *read_only),
            Location::Memory(_) => (None, false),
        };
        let shared = Arc::new(Shared {
            memory: MemoryStore::new(),
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
            }),
            cv: Condvar::new(),
            diag: Mutex::new(Diagnostics {
                mode: Mode::Memory,
                reason: None,
                warned: HashSet::new(),
                quarantined: Vec::new(),
                migration: None,
            }),
        });
        for w in warnings {
            shared.warn_once(w.clone(), &w);
        }
        let mut cache = Cache {
            shared: Arc::clone(&shared),
            saver: None,
        };
        let path = match location {
            Location::Memory(reason) => {
                if reason != "disabled" {
                    shared.warn_once(
                        "memory".into(),
                        &format!("tunecache keeps results in memory only: {reason}"),
                    );
                }
                lock(&shared.diag).reason = Some(reason);
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
        if mode == Mode::Persistent
            && let Err(reason) = prepare_dir(&paths)
        {
            shared.warn_once(
                "unwritable".into(),
                &format!("tunecache cannot write its cache at {}: {reason}; results are kept in memory only", path.display()),
            );
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
        };
        let mut disk = Disk::new(paths, Arc::new(builder.registry), options);
        // The first read never waits for the lock: with it free, repairs happen now;
        // otherwise the saver does them once it gets the lock.
        let held = if mode == Mode::Persistent {
            FileLock::try_acquire(&disk.paths.lock).ok().flatten()
        } else {
            None
        };
        match disk.read_updates(held.is_some()) {
            Ok(inc) => {
                drop(held);
                shared.absorb(inc, mode == Mode::Persistent);
            }
            Err(Failure::Blocked(b)) => {
                drop(held);
                shared.block(&b.path, &b.reason);
                return cache;
            }
            Err(Failure::Retry(e)) => {
                drop(held);
                shared.warn_once(
                    format!("read:{e}"),
                    &format!("tunecache could not read its cache yet: {e}; will retry"),
                );
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
                    shared.warn_once("spawn".into(), &format!("tunecache could not start its saver thread: {e}; results are kept in memory only"));
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

    /// The entries recorded for `fp` in `ns` under scopes other than the current one (the
    /// same device with an older driver, another device), for warm starts.
    pub fn lookup_other_scopes(&self, ns: Namespace, fp: &Fingerprint) -> Vec<(Scope, Entry)> {
        let others = lock(&self.shared.others);
        others
            .scopes()
            .filter_map(|(scope, data)| {
                data.namespaces
                    .get(ns.name())
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
        }
    }

    /// Queues entries of any scope for saving (e.g. an import); entries of the current scope
    /// are also merged into memory. Returns the namespace names that were refused (see
    /// [`Namespace::new`]); their entries are skipped.
    pub fn import(&self, data: CacheData) -> Vec<String> {
        let mut refused = Vec::new();
        let mut mine = Vec::new();
        let mut others = CacheData::new();
        for (scope, data) in data.into_scopes() {
            for (ns_name, entries) in data.namespaces {
                let Ok(ns) = Namespace::new(&ns_name) else {
                    refused.push(ns_name);
                    continue;
                };
                for entry in entries.into_values() {
                    if scope == self.shared.scope {
                        mine.push((ns, entry));
                    } else {
                        others.insert(&scope, &ns_name, entry);
                    }
                }
            }
        }
        let keys: Vec<_> = mine.iter().map(|(ns, e)| (*ns, e.fingerprint())).collect();
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
        let result = self.flush_inner();
        self.stop();
        result
    }

    fn flush_inner(&self) -> Result<(), StoreError> {
        let timeout = self.shared.flush_timeout;
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
                self.shared.warn_once(
                    "unsaved".into(),
                    &format!("tunecache: {pending} results were not saved within {:?}; the saver keeps trying in the background", self.shared.flush_timeout),
                );
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

impl Drop for Cache {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Store for Cache {
    #[inline]
    fn get(&self, ns: Namespace, fp: &Fingerprint) -> Option<Arc<Entry>> {
        self.shared.memory.get(ns, fp)
    }

    fn put(&self, ns: Namespace, entry: Entry) {
        let fp = entry.fingerprint();
        self.shared.memory.merge(ns, entry);
        let mut st = lock(&self.shared.state);
        st.dirty.insert((ns, fp));
        self.shared.mark_dirty(&mut st);
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.flush_inner()
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

impl Shared {
    /// Waits for the saver to signal, until `deadline` at most; `FlushTimeout(timeout)` once
    /// the deadline has passed.
    fn wait_until<'a>(
        &self,
        st: MutexGuard<'a, State>,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<MutexGuard<'a, State>, StoreError> {
        let now = Instant::now();
        if now >= deadline {
            return Err(StoreError::FlushTimeout(timeout));
        }
        Ok(self
            .cv
            .wait_timeout(st, deadline - now)
            .unwrap_or_else(|p| p.into_inner())
            .0)
    }

    /// Counts a change; wakes the saver only when the cache goes from clean to dirty (it
    /// then sleeps until the save is due, so later changes need no wake-up).
    fn mark_dirty(&self, st: &mut State) {
        st.put_seq += 1;
        if st.dirty_since.is_none() {
            st.dirty_since = Some(Instant::now());
            self.cv.notify_all();
        }
    }

    /// The entries to write for the queued keys (read from memory now), plus other scopes.
    fn take_batch(&self, st: &mut State) -> CacheData {
        let mut batch = std::mem::take(&mut st.other);
        for (ns, fp) in st.dirty.drain() {
            if let Some(entry) = self.memory.get(ns, &fp) {
                batch.insert(&self.scope, ns.name(), Entry::clone(&entry));
            }
        }
        batch
    }

    /// Puts a batch that could not be written back in the queue.
    fn requeue(&self, st: &mut State, batch: CacheData) {
        for (scope, data) in batch.into_scopes() {
            for (ns_name, entries) in data.namespaces {
                match (scope == self.scope)
                    .then(|| Namespace::new(&ns_name).ok())
                    .flatten()
                {
                    Some(ns) => st.dirty.extend(entries.keys().map(|fp| (ns, *fp))),
                    None => {
                        for entry in entries.into_values() {
                            st.other.insert(&scope, &ns_name, entry);
                        }
                    }
                }
            }
        }
    }

    fn warn_once(&self, key: String, message: &str) {
        if lock(&self.diag).warned.insert(key) {
            tracing::warn!("{message}");
        }
    }

    /// The file must never be written by this build: stay in memory.
    fn block(&self, path: &Path, reason: &str) {
        self.warn_once(
            format!("blocked:{}", path.display()),
            &format!(
                "tunecache is leaving {} untouched ({reason}); results are kept in memory only",
                path.display()
            ),
        );
        let mut diag = lock(&self.diag);
        diag.mode = Mode::Memory;
        diag.reason = Some(format!("{} left untouched: {reason}", path.display()));
    }

    /// Takes what a read found into memory, and reports its events once each.
    fn absorb(&self, inc: Incoming, persistent: bool) {
        let Incoming {
            data,
            salvaged,
            events,
            needs_rewrite,
        } = inc;
        let mut mine = Vec::new();
        let mut others = CacheData::new();
        for (scope, scope_data) in data.into_scopes().chain(salvaged.clone().into_scopes()) {
            if scope != self.scope {
                for (ns, entries) in scope_data.namespaces {
                    for entry in entries.into_values() {
                        others.insert(&scope, &ns, entry);
                    }
                }
                continue;
            }
            for (ns, entries) in scope_data.namespaces {
                let Ok(ns) = Namespace::new(&ns) else {
                    self.warn_once(
                        format!("ns:{ns}"),
                        &format!("tunecache skips entries of unusable namespace {ns:?}"),
                    );
                    continue;
                };
                mine.extend(entries.into_values().map(|e| (ns, e)));
            }
        }
        self.memory.merge_many(mine);
        if !others.is_empty() {
            lock(&self.others).merge(others);
        }
        if persistent && (needs_rewrite || !salvaged.is_empty()) {
            let mut st = lock(&self.state);
            st.rewrite |= needs_rewrite;
            self.requeue(&mut st, salvaged);
            self.mark_dirty(&mut st);
        }
        for event in events {
            self.report(event);
        }
    }

    fn report(&self, event: Event) {
        match event {
            Event::Quarantined { original, moved_to, reason } => {
                self.warn_once(
                    format!("quarantine:{}", moved_to.display()),
                    &format!(
                        "tunecache: {} is unusable ({reason}); moved it to {} and continuing without it",
                        original.display(),
                        moved_to.display()
                    ),
                );
                lock(&self.diag).quarantined.push(moved_to);
            }
            Event::Unusable { path, reason } => self.warn_once(
                format!("unusable:{}", path.display()),
                &format!("tunecache: {} is unusable ({reason}); it will be moved aside once the lock is free", path.display()),
            ),
            Event::TornTail { path, offset, len, kept } => {
                let kept = kept.map(|k| format!("; a copy is at {}", k.display())).unwrap_or_default();
                self.warn_once(
                    format!("torn:{}:{offset}", path.display()),
                    &format!("tunecache: dropped {len} incomplete bytes at offset {offset} of {} (an interrupted write){kept}", path.display()),
                );
            }
            Event::DamagedRecords { path, count, kept } => {
                let kept = kept.map(|k| format!("; a copy is at {}", k.display())).unwrap_or_default();
                self.warn_once(
                    format!("damaged:{}", path.display()),
                    &format!("tunecache: skipped {count} damaged records in {}{kept}", path.display()),
                );
            }
            Event::StaleJournal { path } => {
                tracing::debug!("tunecache removed the stale journal {}", path.display());
            }
            Event::Migrated { path, report } => {
                for step in &report.steps {
                    tracing::info!("cache migration {step}");
                }
                for c in &report.collisions {
                    tracing::warn!("cache migration collision: {c}");
                }
                tracing::info!(
                    "migrated {} cache v{} → v{} ({} entries) in {}",
                    report.app,
                    report.from,
                    report.to,
                    report.entries,
                    path.display()
                );
                lock(&self.diag).migration = Some(report);
            }
            Event::Backup { path } => {
                tracing::info!("tunecache kept the pre-migration file as {}", path.display());
            }
        }
    }

    fn run_saver(self: Arc<Self>, mut disk: Disk, mode: Mode) {
        let persistent = mode == Mode::Persistent;
        let mut next_refresh = self.refresh_interval.map(|i| Instant::now() + i);
        let mut st = lock(&self.state);
        loop {
            let now = Instant::now();
            let flush_wanted = st.flush_requested > st.flush_served;
            let dirty = persistent && (st.dirty_since.is_some() || st.rewrite);
            if st.shutdown
                && (!dirty
                    || st.failures > 0 && !flush_wanted && st.retry_at.is_some_and(|r| r > now))
            {
                break;
            }
            let save_due = if !persistent {
                None
            } else if flush_wanted || st.shutdown {
                Some(now)
            } else if dirty {
                let gathered = st.dirty_since.map_or(now, |d| d + self.save_delay);
                Some(st.retry_at.map_or(gathered, |r| r.max(gathered)))
            } else {
                None
            };
            if save_due.is_some_and(|d| d <= now) {
                let batch = self.take_batch(&mut st);
                let seq = st.put_seq;
                let rewrite = st.rewrite;
                let served = st.flush_requested;
                st.dirty_since = None;
                drop(st);
                let result = self.save_once(&mut disk, batch, rewrite);
                st = lock(&self.state);
                match result {
                    Ok(inc) => {
                        st.durable_seq = st.durable_seq.max(seq);
                        if rewrite {
                            st.rewrite = false;
                        }
                        st.last_error = None;
                        st.retry_at = None;
                        st.failures = 0;
                        drop(st);
                        self.absorb(inc, true);
                        st = lock(&self.state);
                        if let Some(i) = self.refresh_interval {
                            next_refresh = Some(Instant::now() + i);
                        }
                    }
                    Err((failure, batch)) => {
                        self.requeue(&mut st, batch);
                        st.rewrite |= rewrite;
                        st.dirty_since.get_or_insert_with(Instant::now);
                        match failure {
                            Failure::Blocked(b) => {
                                st.last_error = Some(StoreError::NotPersistent {
                                    reason: b.reason.clone(),
                                });
                                st.flush_served = served;
                                st.saver_running = false;
                                self.cv.notify_all();
                                drop(st);
                                self.block(&b.path, &b.reason);
                                return;
                            }
                            Failure::Retry(e) => {
                                st.failures += 1;
                                let backoff = self
                                    .save_delay
                                    .max(Duration::from_millis(100))
                                    .saturating_mul(1 << st.failures.min(8))
                                    .min(self.max_retry_delay);
                                st.retry_at = Some(Instant::now() + backoff);
                                let key = match &e {
                                    StoreError::LockTimeout { .. } => "lock-timeout".to_owned(),
                                    other => format!("save:{other}"),
                                };
                                self.warn_once(key, &format!("tunecache could not save yet: {e}"));
                                st.last_error = Some(e);
                            }
                        }
                    }
                }
                st.flush_served = served;
                self.cv.notify_all();
                continue;
            }
            let refresh_wanted = st.refresh_requested > st.refresh_served;
            if refresh_wanted || next_refresh.is_some_and(|r| r <= now) {
                let serving = st.refresh_requested;
                drop(st);
                match disk.read_updates(false) {
                    Ok(inc) => self.absorb(inc, persistent),
                    Err(Failure::Blocked(b)) => {
                        let mut st = lock(&self.state);
                        st.saver_running = false;
                        self.cv.notify_all();
                        drop(st);
                        self.block(&b.path, &b.reason);
                        return;
                    }
                    Err(Failure::Retry(e)) => tracing::debug!("tunecache refresh failed: {e}"),
                }
                next_refresh = self.refresh_interval.map(|i| Instant::now() + i);
                st = lock(&self.state);
                st.refresh_served = st.refresh_served.max(serving);
                self.cv.notify_all();
                continue;
            }
            let wake = [save_due, next_refresh].into_iter().flatten().min();
            st = match wake {
                Some(at) => {
                    self.cv
                        .wait_timeout(st, at.saturating_duration_since(now))
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
                None => self.cv.wait(st).unwrap_or_else(|p| p.into_inner()),
            };
        }
        let unsaved = st.dirty.len() + st.other.len();
        st.saver_running = false;
        self.cv.notify_all();
        drop(st);
        if unsaved > 0 {
            self.warn_once(
                "unsaved-at-exit".into(),
                &format!("tunecache: {unsaved} results could not be saved before shutdown"),
            );
        }
    }

    /// One locked save: read others' updates (gated), then append or compact.
    #[allow(
        clippy::result_large_err,
        reason = "the batch must travel back to the queue on failure"
    )]
    fn save_once(
        &self,
        disk: &mut Disk,
        mut batch: CacheData,
        rewrite: bool,
    ) -> Result<Incoming, (Failure, CacheData)> {
        let guard = match FileLock::acquire(&disk.paths.lock, self.lock_timeout) {
            Ok(g) => g,
            Err(e) => return Err((Failure::Retry(e), batch)),
        };
        let mut inc = match disk.read_updates(true) {
            Ok(inc) => inc,
            Err(f) => return Err((f, batch)),
        };
        // Rescued entries exist nowhere else now: they travel with the batch until written,
        // and into memory with the rest of what was read.
        let salvaged = std::mem::take(&mut inc.salvaged);
        batch.merge(salvaged.clone());
        inc.data.merge(salvaged);
        let rewrite = rewrite || inc.needs_rewrite;
        inc.needs_rewrite = false;
        match disk.write(&batch, rewrite) {
            Ok(events) => {
                drop(guard);
                inc.events.extend(events);
                Ok(inc)
            }
            Err(f) => {
                drop(guard);
                // Whatever was read is still good to absorb; the batch goes back to the queue.
                self.absorb(
                    Incoming {
                        salvaged: CacheData::new(),
                        needs_rewrite: false,
                        ..inc
                    },
                    false,
                );
                Err((f, batch))
            }
        }
    }
}
