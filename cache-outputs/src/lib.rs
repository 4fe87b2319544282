//! Output caching: the value of an expensive function, looked up by a key that covers every
//! input, computed and stored on a miss.
//!
//! torchcache's idea done with keys that cannot collide and limits that are limits:
//! - [`KeyBuilder`] hashes the function's identity, a required version, its configuration
//!   and every argument in order (kind, dtype, shape, byte order, and an XXH3-128 digest of
//!   all of its bytes). [`KeyBuilder::batch_keys`] keys each item of a batch on its own, so a
//!   hit does not depend on the batch it came in.
//! - Values are bytes with a small header ([`Tensor`] in, [`Output`] out), never a pickle;
//!   zstd per cache ([`Codec`]); a large raw value is memory-mapped, not copied.
//! - The directory is an [`cache_core::ArtifactStore`]: a byte limit over the whole
//!   directory (every process's values), least recently used evicted in one batch, a
//!   per-entry cap; in front of it a byte-bounded in-memory tier.
//! - Writes are atomic; a damaged value is a miss and is removed; one computation per key
//!   across threads and processes, with a bounded wait ([`OutputCache::get_or_compute`]).
//! - [`OutputCache::session`] makes a cache in a fresh directory that goes away with its
//!   owner, and reaps those of killed processes.
#![deny(missing_docs)]

mod dtype;
mod key;
mod memory;
mod session;
mod value;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use cache_core::cache_format::Fingerprint;
use cache_core::file::FileLock;
use cache_core::{ArtifactStore, Join, SingleFlight, StoreError};

pub use cache_core::cache_format::Fingerprint as OutputKey;
pub use cache_core::cache_format::{Fields, Value};
pub use dtype::{ByteOrder, DType};
pub use key::{Arg, KeyBuilder, TensorRef, content_hash};
pub use session::{default_root as default_session_root, reap as reap_sessions};
pub use value::{Codec, MAX_DIMS, Output, Tensor, ValueError, check_value};

use memory::Memory;
use session::Session;

/// Why an output cache could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// The directory could not be used.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A session directory could not be made.
    #[error("cannot make a session cache under {path}: {source}")]
    Session {
        /// Where.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Counters of an [`OutputCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutputStats {
    /// Served from memory.
    pub memory_hits: u64,
    /// Served from the directory.
    pub disk_hits: u64,
    /// Not found.
    pub misses: u64,
    /// Computed here.
    pub computed: u64,
    /// Found computed by another thread or process after waiting for it.
    pub waited: u64,
    /// Damaged values found (each removed).
    pub damaged: u64,
    /// Values not stored: over the per-entry cap, or the directory could not take them.
    pub not_stored: u64,
}

#[derive(Debug, Default)]
struct Counters {
    memory_hits: AtomicU64,
    disk_hits: AtomicU64,
    misses: AtomicU64,
    computed: AtomicU64,
    waited: AtomicU64,
    damaged: AtomicU64,
    not_stored: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Settings of an [`OutputCache`]; see [`OutputCache::builder`].
#[derive(Debug, Clone)]
pub struct OutputCacheBuilder {
    dir: PathBuf,
    max_bytes: u64,
    max_entry_bytes: u64,
    memory_bytes: u64,
    codec: Codec,
    wait: Duration,
    low_water: f64,
}

impl OutputCacheBuilder {
    /// The byte limit of the directory (default 10 GiB), measured over every file in it.
    pub fn max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = bytes;
        self
    }

    /// The largest value stored (default: no cap beyond `max_bytes`); a larger one is
    /// returned but not kept.
    pub fn max_entry_bytes(mut self, bytes: u64) -> Self {
        self.max_entry_bytes = bytes;
        self
    }

    /// The byte bound of the in-memory tier (default 256 MiB; 0 turns it off).
    pub fn memory_bytes(mut self, bytes: u64) -> Self {
        self.memory_bytes = bytes;
        self
    }

    /// How values are stored (default [`Codec::Raw`]).
    pub fn codec(mut self, codec: Codec) -> Self {
        self.codec = codec;
        self
    }

    /// The longest wait for another thread or process computing the same key (default 60 s);
    /// past it, this caller computes the value itself.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Eviction goes down to this share of the limit (default 1.0: exactly to the limit).
    pub fn low_water(mut self, share: f64) -> Self {
        self.low_water = share;
        self
    }

    /// Opens the cache, creating its directory.
    pub fn open(self) -> Result<OutputCache, OutputError> {
        self.open_with(None)
    }

    fn open_with(self, session: Option<Session>) -> Result<OutputCache, OutputError> {
        let store = ArtifactStore::open(&self.dir, self.max_bytes)?
            .with_entry_cap(self.max_entry_bytes)
            .with_low_water(self.low_water)
            .with_durable_writes(false);
        let claims = self.dir.join("claims");
        Ok(OutputCache {
            store,
            claims,
            memory: Mutex::new(Memory::new(self.memory_bytes)),
            codec: self.codec,
            wait: self.wait,
            flights: SingleFlight::new(),
            counters: Counters::default(),
            said: Mutex::default(),
            _session: session,
        })
    }
}

/// A directory of cached outputs; see the crate's documentation.
#[derive(Debug)]
pub struct OutputCache {
    store: ArtifactStore,
    claims: PathBuf,
    memory: Mutex<Memory>,
    codec: Codec,
    wait: Duration,
    flights: SingleFlight<Fingerprint, Arc<Output>>,
    counters: Counters,
    /// The conditions of failed stores already warned about (cleared once one is stored).
    said: Mutex<std::collections::HashSet<String>>,
    // Last: dropped after the store, so the directory is removed after everything in it.
    _session: Option<Session>,
}

impl OutputCache {
    /// Settings for a cache in `dir`.
    pub fn builder(dir: impl Into<PathBuf>) -> OutputCacheBuilder {
        OutputCacheBuilder {
            dir: dir.into(),
            max_bytes: 10 << 30,
            max_entry_bytes: u64::MAX,
            memory_bytes: 256 << 20,
            codec: Codec::Raw,
            wait: Duration::from_secs(60),
            low_water: 1.0,
        }
    }

    /// A session cache: a fresh directory under `root` (default
    /// [`default_session_root`]), removed when the cache is dropped or the process exits
    /// normally. Opening one first removes the sessions of processes that died.
    pub fn session(
        root: Option<&Path>,
        settings: impl FnOnce(OutputCacheBuilder) -> OutputCacheBuilder,
    ) -> Result<OutputCache, OutputError> {
        let root = root.map_or_else(default_session_root, Path::to_owned);
        let session = Session::create(&root).map_err(|source| OutputError::Session {
            path: root.clone(),
            source,
        })?;
        let builder = settings(OutputCache::builder(session.dir()));
        builder.open_with(Some(session))
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        self.store.dir()
    }

    /// The store under it (size, eviction, verification).
    pub fn store(&self) -> &ArtifactStore {
        &self.store
    }

    /// The counters so far.
    pub fn stats(&self) -> OutputStats {
        let c = &self.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        OutputStats {
            memory_hits: l(&c.memory_hits),
            disk_hits: l(&c.disk_hits),
            misses: l(&c.misses),
            computed: l(&c.computed),
            waited: l(&c.waited),
            damaged: l(&c.damaged),
            not_stored: l(&c.not_stored),
        }
    }

    fn lock_memory(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.memory.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The value stored under `key`: from memory, else from the directory (checked; a damaged
    /// one is removed and is a miss). An I/O error is a miss, with a warning.
    pub fn get(&self, key: &Fingerprint) -> Option<Arc<Output>> {
        let found = self.lookup(key);
        if found.is_none() {
            bump(&self.counters.misses);
        }
        found
    }

    fn lookup(&self, key: &Fingerprint) -> Option<Arc<Output>> {
        if let Some((out, touch)) = self.lock_memory().get(key) {
            bump(&self.counters.memory_hits);
            if touch {
                // Tell the directory's LRU the value is in use (at most once a second).
                let _ = fs::File::options()
                    .write(true)
                    .open(self.store.path_of(key))
                    .and_then(|f| f.set_modified(std::time::SystemTime::now()));
            }
            return Some(out);
        }
        self.read_disk(key)
    }

    fn read_disk(&self, key: &Fingerprint) -> Option<Arc<Output>> {
        let blob = match self.store.get_blob(key) {
            Ok(Some(b)) => b,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!("tunecache outputs: {e}");
                return None;
            }
        };
        match Output::from_blob(blob) {
            Ok(out) => {
                bump(&self.counters.disk_hits);
                let out = Arc::new(out);
                self.lock_memory().insert(*key, out.clone());
                Some(out)
            }
            Err(e) => {
                // The framing's checksum held, the value inside did not: a foreign or
                // newer writer. Not ours to use.
                bump(&self.counters.damaged);
                tracing::warn!(
                    "tunecache outputs: removing {}: {e}",
                    self.store.path_of(key).display()
                );
                self.store.remove(key);
                None
            }
        }
    }

    /// Stores `value` under `key`; false if it was not kept (over the per-entry cap, or the
    /// directory refused it: a warning says why). The value is in memory either way.
    pub fn put(&self, key: &Fingerprint, value: Tensor) -> (bool, Arc<Output>) {
        let stored = self.store_value(key, &value);
        let out = Arc::new(Output::from_tensor(value));
        self.lock_memory().insert(*key, out.clone());
        (stored, out)
    }

    fn store_value(&self, key: &Fingerprint, value: &Tensor) -> bool {
        let compressed = value::compress(&value.data, self.codec);
        let (codec, data) = match &compressed {
            Some(c) if c.len() < value.data.len() => (self.codec, c.as_slice()),
            _ => (Codec::Raw, value.data.as_slice()),
        };
        let header = value::encode_header(value, codec, data.len() as u64);
        match self.store.put_parts(key, &[&header, data]) {
            Ok(true) => {
                let mut said = self.said.lock().unwrap_or_else(PoisonError::into_inner);
                if !said.is_empty() {
                    said.clear();
                }
                true
            }
            Ok(false) => {
                bump(&self.counters.not_stored);
                false
            }
            Err(e) => {
                bump(&self.counters.not_stored);
                // Once per condition (a full disk is one, whichever temporary file failed),
                // until a value is stored again.
                let mut said = self.said.lock().unwrap_or_else(PoisonError::into_inner);
                if said.insert(e.condition()) {
                    drop(said);
                    tracing::warn!(
                        "tunecache outputs: a value was not stored: {e} (said once until values are stored again)"
                    );
                }
                false
            }
        }
    }

    /// The value under `key`, or `compute()`'s, stored before it is returned. One caller
    /// computes a key at a time, across threads and processes: the others wait (at most the
    /// configured wait, then compute themselves) and read what it stored. An error of
    /// `compute` is returned and nothing is stored; the cache's own failures are warnings.
    pub fn get_or_compute<E>(
        &self,
        key: &Fingerprint,
        compute: impl FnOnce() -> Result<Tensor, E>,
    ) -> Result<Arc<Output>, E> {
        if let Some(out) = self.lookup(key) {
            return Ok(out);
        }
        bump(&self.counters.misses);
        // In this process: one leader per key; the others wait (bounded) for its value, and
        // compute it themselves if it does not come.
        let leader = match self.flights.join(key, || None) {
            Join::Ready(out) => return Ok(out),
            Join::Leader(leader) => leader,
            Join::Follower(follower) => {
                if let Some(out) = follower.wait(self.wait) {
                    bump(&self.counters.waited);
                    return Ok(out);
                }
                let value = compute()?;
                bump(&self.counters.computed);
                return Ok(self.put(key, value).1);
            }
        };
        // Across processes: a claim file per key, locked (waiting, bounded, until the holder
        // stores the value or lets go).
        let _claim = ClaimFile(self.claim(key));
        // Whether we waited or not: a process may have stored it between our first look and
        // the claim.
        if let Some(out) = self.read_disk(key) {
            bump(&self.counters.waited);
            leader.finish(out.clone());
            return Ok(out);
        }
        let value = compute()?;
        bump(&self.counters.computed);
        let (_, out) = self.put(key, value);
        leader.finish(out.clone());
        Ok(out)
    }

    /// Takes the key's claim, waiting (bounded) for another process that holds it, and giving
    /// up the wait as soon as its value is on disk; `None` without a claim (then the caller
    /// re-reads the directory and computes if need be). No claims where the folder cannot be
    /// written (a read-only or full disk): compute without one.
    fn claim(&self, key: &Fingerprint) -> Option<FileLock> {
        fs::create_dir_all(&self.claims).ok()?;
        let path = self.claims.join(format!("{}.lock", key.to_hex()));
        FileLock::acquire_unless(&path, self.wait, || self.store.contains(key))
            .ok()
            .flatten()
    }

    /// The values of a batch's items (keys from [`KeyBuilder::batch_keys`]): the cached ones
    /// are read, and `compute` is called once with the indices of the missing ones (in
    /// order) and must return their values in that order; those are stored. Returns every
    /// item's value in order.
    pub fn get_or_compute_batch<E>(
        &self,
        keys: &[Fingerprint],
        compute: impl FnOnce(&[usize]) -> Result<Vec<Tensor>, E>,
    ) -> Result<Vec<Arc<Output>>, BatchError<E>> {
        let mut found: Vec<Option<Arc<Output>>> = keys.iter().map(|k| self.lookup(k)).collect();
        let missing: Vec<usize> = (0..keys.len()).filter(|i| found[*i].is_none()).collect();
        if !missing.is_empty() {
            for _ in &missing {
                bump(&self.counters.misses);
            }
            let values = compute(&missing).map_err(BatchError::Compute)?;
            if values.len() != missing.len() {
                return Err(BatchError::Count {
                    asked: missing.len(),
                    got: values.len(),
                });
            }
            for (i, v) in missing.iter().zip(values) {
                bump(&self.counters.computed);
                found[*i] = Some(self.put(&keys[*i], v).1);
            }
        }
        Ok(found.into_iter().flatten().collect())
    }
}

/// Why a batch could not be completed.
#[derive(Debug, thiserror::Error)]
pub enum BatchError<E> {
    /// The computation failed.
    #[error("the computation failed")]
    Compute(E),
    /// The computation returned a different number of values than it was asked for.
    #[error("asked for {asked} values, the computation returned {got}")]
    Count {
        /// Asked for.
        asked: usize,
        /// Returned.
        got: usize,
    },
}

/// A held claim file, removed while still held when the computation ends however it ends (a
/// value, an error, a panic): a process that opened it before finds it gone when granted,
/// locks a new one, and re-reads the directory, finding the value if there is one.
struct ClaimFile(Option<FileLock>);

impl Drop for ClaimFile {
    fn drop(&mut self) {
        if let Some(lock) = self.0.take() {
            lock.remove();
        }
    }
}
