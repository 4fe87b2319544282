//! `Cache`: the in-memory tier in front of the disk tier and the lower tiers, with a
//! background saver.
//!
//! `put` merges into memory and queues the key; it never waits on I/O. One saver thread per
//! cache does all writing: it gathers changes for `save_delay`, takes the file lock (bounded
//! wait), reads what other processes wrote (through the version gate), appends one journal
//! record or compacts, and retries with back-off when the lock is busy or the disk fails. The
//! queue is emptied only by a save that succeeded, so a failure never loses a result.
//!
//! When a caller may wait on I/O, and for how long (ARCHITECTURE.md, "The I/O promise"):
//! - `get` of an entry memory holds whole: never. The first use of a key (or of one whose
//!   entry another process changed since) reads the file: the table's nodes on the key's path
//!   and its entry, a few `pread`s, each block checked (`file.rs`). A key the file lacks goes to
//!   the lower tiers in order, each within its own budget (the system tier reads its files a
//!   key at a time; the shared tier one round trip). [`Cache::get_in_memory`] says which of
//!   these a lookup would be, without doing any.
//! - `entries`, `len`: a walk of the scope's part of the table.
//! - `flush`, `flush_within`, `close` and drop: at most the flush timeout (and each tier's
//!   own close budget); `refresh` the flush timeout; `claim` the wait it is given.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cache_format::{CacheData, Entry, Fingerprint, Scope};
use cache_migrate::Report;

use crate::claim::Claim;
use crate::config::CacheBuilder;
use crate::error::StoreError;
use crate::memory::{MemoryStore, Resident};
use crate::namespace::Namespace;
use crate::store::Store;
use crate::tier::{Tier, TierHealth};

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

/// What [`Cache::get_in_memory`] found.
#[derive(Debug, Clone)]
pub enum MemoryLookup {
    /// The entry, decoded in memory.
    Hit(Arc<Entry>),
    /// Nothing, and nowhere else to look.
    Miss,
    /// [`Store::get`] would read: an entry still kept in the file, or lower tiers to ask.
    NeedsIo,
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
    /// The lower tiers, in the order a miss asks them.
    pub tiers: Vec<TierHealth>,
}

struct State {
    /// Keys of the current scope changed in memory and not yet durable; the saver reads
    /// their merged entries from memory when it writes, so `put` copies nothing.
    dirty: HashSet<(Namespace, Fingerprint)>,
    /// Keys of the current scope this process recorded: written again if the file is replaced
    /// by one that may lack them (an old copy restored).
    own: HashSet<(Namespace, Fingerprint)>,
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
    /// A flush before exit waiting out other processes' saves (see `patient.rs`).
    patient: patient::Patient,
}

pub(crate) struct Shared {
    pub(crate) memory: MemoryStore,
    /// The application's registry: its name, current schema and migration steps.
    registry: Arc<cache_migrate::Migrations>,
    /// What every reader accepts: an entry beyond it is refused where it enters.
    limits: cache_format::Limits,
    /// The file as lookups read it (see `file.rs`).
    file: file::FileSide,
    /// The background rewrite of the file, if one runs (see `compact.rs`).
    compactor: compactor::Compactor,
    scope: Scope,
    /// Where the saver and callers meet (see `queue.rs`, `saver.rs`).
    saving: Saving,
    /// What the cache has told its user, and what its health says of the file.
    diag: notice::Notices,
    /// The lower tiers (see `tiers.rs`).
    lower: tiers::Lower,
    /// Claims among this process's threads, when there is no file to share them through.
    local_claims: Arc<crate::claim::LocalClaims>,
}

/// Where the saver and callers meet: what waits to be saved and how saving goes, the condition
/// both wait on, and the time bounds the builder gave.
struct Saving {
    state: Mutex<State>,
    cv: Condvar,
    /// How long the saver gathers changes, waits for the lock, lets `flush` wait, refreshes
    /// and backs off.
    timings: Timings,
}

/// The saver's and callers' time bounds, as the builder gave them.
#[derive(Debug, Clone, Copy)]
struct Timings {
    save_delay: Duration,
    lock_timeout: Duration,
    flush_timeout: Duration,
    refresh_interval: Option<Duration>,
    max_retry_delay: Duration,
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

mod compactor;
mod file;
mod notice;
pub(crate) use notice::log_events;
mod open;
mod patient;
mod queue;
mod save;
pub(crate) mod system;
mod tiers;

pub use queue::Imported;
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

    /// The application's registry (name, current schema, migration steps).
    pub fn registry(&self) -> &cache_migrate::Migrations {
        &self.shared.registry
    }

    /// The current scope.
    pub fn scope(&self) -> &Scope {
        &self.shared.scope
    }

    /// The cache file, if the cache has one.
    pub fn path(&self) -> Option<&Path> {
        self.shared.file.path.as_deref()
    }

    /// Number of entries of the current scope: the file's and those recorded here since.
    /// Counts from the table's directory, and looks up the keys memory and the journal hold.
    pub fn len(&self) -> usize {
        self.shared.count()
    }

    /// Whether the current scope has no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every entry of the current scope, by namespace and fingerprint: a walk of the file's
    /// part for this scope (each entry read once, not kept) joined with what memory holds.
    pub fn entries(&self) -> Vec<(Namespace, Arc<Entry>)> {
        self.shared.all_entries(None)
    }

    /// A count that grows whenever what [`Cache::entries`] returns may have changed: an entry
    /// recorded or imported here, brought by a lower tier, or read from the file after another
    /// process's save. Read before the entries, it tells a caller that keeps something made
    /// from them (the tuner's index of tuned keys) when to make it again.
    pub fn changes(&self) -> u64 {
        self.shared.memory.changes()
            + self
                .shared
                .file
                .epoch
                .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Every entry of namespace `ns` in the current scope (as [`Cache::entries`], walking only
    /// that namespace's part of the file).
    pub fn entries_of(&self, ns: Namespace) -> Vec<(Namespace, Arc<Entry>)> {
        self.shared.all_entries(Some(ns))
    }

    /// Claims the key `fp` of `ns` across the processes that share this cache's file (or,
    /// with no file to share claims through, across the threads of this process: see
    /// [`crate::ClaimGuard::is_shared`]), waiting at most `wait` for another holder. A tuner
    /// takes it before measuring, so one caller measures a key while the others wait and then
    /// read its result. The claim ends when the guard is dropped or the process dies.
    pub fn claim(&self, ns: Namespace, fp: &Fingerprint, wait: Duration) -> Claim {
        let shared = match self.shared.file.path.as_deref() {
            Some(path) if self.shared.diag.lock().mode == Mode::Persistent => {
                crate::claim::claim_file_lock(&crate::fsio::resolve_link(path), ns, fp, wait)
            }
            _ => None,
        };
        shared.unwrap_or_else(|| self.shared.local_claims.take((ns, *fp), wait))
    }

    /// The entries recorded for `fp` in `ns` under scopes other than the current one (the
    /// same device with an older driver, another device), for warm starts.
    pub fn lookup_other_scopes(&self, ns: Namespace, fp: &Fingerprint) -> Vec<(Scope, Entry)> {
        self.shared.other_scopes(ns, fp)
    }

    /// Reads what other processes recorded since the last read, now, waiting a bounded time
    /// (the saver thread does the reading). A memory-only cache has nothing to read.
    pub fn refresh(&self) -> Result<(), StoreError> {
        let timeout = self.shared.saving.timings.flush_timeout;
        let deadline = crate::deadline_after(timeout);
        let mut st = lock(&self.shared.saving.state);
        if !st.saver_running {
            return Ok(());
        }
        st.refresh_requested += 1;
        let request = st.refresh_requested;
        self.shared.saving.cv.notify_all();
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
        let st = lock(&self.shared.saving.state);
        let diag = self.shared.diag.lock();
        Health {
            mode: diag.mode,
            path: self.shared.file.path.clone(),
            reason: diag.reason.clone(),
            last_error: st.last_error.as_ref().map(ToString::to_string),
            quarantined: diag.quarantined.clone(),
            migration: diag.migration.clone(),
            pending: st.dirty.len() + st.other.len(),
            tiers: self.shared.lower.tiers.iter().map(|t| t.health()).collect(),
        }
    }

    /// What [`Store::get`] would find, found without any I/O: the entry if memory holds it
    /// whole, a definite miss if neither memory, the file nor any tier can have it, and
    /// [`MemoryLookup::NeedsIo`] otherwise (the file to read, or a tier to ask). A binding that
    /// holds a lock of its own around calls (Python's GIL) releases it only for the last case.
    #[inline]
    pub fn get_in_memory(&self, ns: Namespace, fp: &Fingerprint) -> MemoryLookup {
        match self.shared.memory.resident(ns, fp) {
            Resident::Complete(e) => MemoryLookup::Hit(e),
            Resident::Partial => MemoryLookup::NeedsIo,
            Resident::Unknown if self.shared.file_has_more() => MemoryLookup::NeedsIo,
            Resident::Absent | Resident::Unknown => {
                // Tiers with no time budget read memory only: ask them.
                if self.shared.lower.tiers.is_empty() {
                    MemoryLookup::Miss
                } else if self.shared.lower.tiers.iter().all(|t| t.budget().is_zero()) {
                    self.shared
                        .miss(ns, fp)
                        .map_or(MemoryLookup::Miss, MemoryLookup::Hit)
                } else {
                    MemoryLookup::NeedsIo
                }
            }
        }
    }

    /// The lower tiers, in the order a miss asks them.
    pub fn tiers(&self) -> &[Arc<dyn Tier>] {
        &self.shared.lower.tiers
    }

    /// Reads the keys of `fps` that memory lacks from the lower tiers, each asked once for
    /// all the keys the tiers before it lacked (a tuner about to ask for many keys calls
    /// this first: one round trip to a shared tier instead of one per key); returns how many
    /// the tiers had.
    pub fn prefetch(&self, ns: Namespace, fps: &[Fingerprint]) -> usize {
        self.shared.prefetch(ns, fps)
    }

    /// The handle of type `T` a lower tier gave this cache when it opened (see
    /// [`crate::TierContext::provide`]): how a tier's crate reaches what only that tier does
    /// (cache-remote's `RemoteCache::remote`). `None` if no tier gave one.
    pub fn handle<T: Send + Sync + 'static>(&self) -> Option<Arc<T>> {
        self.shared
            .lower
            .handles
            .iter()
            .find_map(|h| Arc::clone(h).downcast::<T>().ok())
    }

    /// Flushes, then stops the saver. Equivalent to dropping, but reports the outcome.
    pub fn close(mut self) -> Result<(), StoreError> {
        let result = self.flush_inner(self.shared.saving.timings.flush_timeout);
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
        let mut st = lock(&self.shared.saving.state);
        st.paused += 1;
        while st.saving {
            st = self
                .shared
                .saving
                .cv
                .wait(st)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Ends one [`Cache::pause_saves`].
    pub fn resume_saves(&self) {
        let mut st = lock(&self.shared.saving.state);
        st.paused = st.paused.saturating_sub(1);
        self.shared.saving.cv.notify_all();
    }

    /// Whether the latest save failed and the saver is retrying (a lock held by another
    /// process, a full disk): results are safe in memory but not yet durable. A caller that
    /// would wait for durability can skip the wait while this holds.
    pub fn is_saving_behind(&self) -> bool {
        lock(&self.shared.saving.state).failures > 0
    }

    fn flush_inner(&self, timeout: Duration) -> Result<(), StoreError> {
        let deadline = crate::deadline_after(timeout);
        let mut st = lock(&self.shared.saving.state);
        if !st.saver_running || self.shared.diag.lock().mode != Mode::Persistent {
            let reason = self
                .shared
                .diag
                .lock()
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
        self.shared.saving.cv.notify_all();
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
                        reason: self
                            .shared
                            .diag
                            .lock()
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
        self.shared
            .compactor
            .stop(self.shared.saving.timings.flush_timeout);
        // Each tier makes its last attempt within its own budget.
        for tier in &self.shared.lower.tiers {
            tier.close();
        }
        self.shared.diag.summarize_repeats();
    }

    fn stop_saver(&mut self) {
        let Some(handle) = self.saver.take() else {
            return;
        };
        let deadline = crate::deadline_after(self.shared.saving.timings.flush_timeout);
        let mut st = lock(&self.shared.saving.state);
        st.shutdown = true;
        self.shared.saving.cv.notify_all();
        while st.saver_running {
            let now = Instant::now();
            if now >= deadline {
                let pending = st.dirty.len() + st.other.len();
                drop(st);
                self.shared.diag.notify(Notice::unsaved_at_close(
                    pending,
                    self.shared.saving.timings.flush_timeout,
                ));
                return; // detach: the thread finishes on its own
            }
            st = self
                .shared
                .saving
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
        let found = match self.shared.memory.resident(ns, fp) {
            Resident::Complete(e) => return Some(e),
            Resident::Absent => None,
            Resident::Partial | Resident::Unknown => self.shared.read_file(ns, fp),
        };
        match found {
            Some(e) => Some(e),
            None if self.shared.lower.tiers.is_empty() => None,
            None => self.shared.miss(ns, fp),
        }
    }

    fn put(&self, ns: Namespace, entry: Entry) {
        if let Err(StoreError::Refused { reason, .. }) = self.try_put(ns, entry) {
            self.shared
                .diag
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
                // A candidate appears once in an entry; the cheap comparison first.
                if let Some(kept) = stored
                    .candidates()
                    .iter()
                    .find(|k| k.measured_at > c.measured_at && k.id == c.id)
                {
                    self.shared
                        .diag
                        .notify(Notice::lost_merge(&c.id.label(), kept.measured_at));
                }
            }
            self.shared.say_if_full(ns, &stored, &entry);
        }
        self.shared.memory.merge(ns, entry);
        self.shared.lower.offer(&[(ns, fp)]);
        let mut st = lock(&self.shared.saving.state);
        st.own.insert((ns, fp));
        st.dirty.insert((ns, fp));
        self.shared.mark_dirty(&mut st);
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.flush_inner(self.shared.saving.timings.flush_timeout)
    }
}
