//! The in-memory tier: a sharded table of `Arc<Entry>` keyed by namespace and fingerprint.
//!
//! Each shard is an immutable hash map behind an `ArcSwap`: a reader loads the current map
//! (no lock, and no write to memory shared with other threads), probes it and lets go. A
//! writer copies the shard, changes the copy and publishes it (read-copy-update), serialised
//! per shard by a mutex readers never touch. So a hit costs one atomic load, one hash probe
//! and, for [`MemoryStore::get`], one reference-count increment; [`MemoryStore::with_entry`]
//! skips even that, so threads hitting the same key do not contend at all. The fingerprint
//! is already a uniform digest, so hashing is a multiply.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use cache_format::{Entry, Fingerprint};

use crate::error::StoreError;
use crate::namespace::Namespace;
use crate::store::Store;

/// Enough shards that copying one on a write stays cheap for a large cache.
const SHARDS: usize = 1024;

#[derive(Clone, Copy, PartialEq, Eq)]
struct Slot {
    ns: u32,
    lo: u64,
    hi: u64,
}

impl Slot {
    fn new(ns: Namespace, fp: &Fingerprint) -> Self {
        let mut lo = [0u8; 8];
        let mut hi = [0u8; 8];
        lo.copy_from_slice(&fp.0[8..]);
        hi.copy_from_slice(&fp.0[..8]);
        Slot {
            ns: ns.id(),
            lo: u64::from_le_bytes(lo),
            hi: u64::from_le_bytes(hi),
        }
    }

    fn mixed(&self) -> u64 {
        self.lo ^ u64::from(self.ns).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }
}

impl Hash for Slot {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.mixed());
    }
}

/// Passes the already-uniform slot hash through.
#[derive(Default, Clone, Copy)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0 ^ u64::from_le_bytes(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

#[derive(Default, Clone, Copy)]
struct BuildPassThrough;

impl BuildHasher for BuildPassThrough {
    type Hasher = PassThrough;
    fn build_hasher(&self) -> PassThrough {
        PassThrough(0)
    }
}

type Shard = HashMap<Slot, (Namespace, Arc<Entry>), BuildPassThrough>;

struct ShardCell {
    map: ArcSwap<Shard>,
    writer: Mutex<()>,
}

/// An in-memory store: concurrent readers, merge-on-insert, nothing persisted.
pub struct MemoryStore {
    shards: Box<[ShardCell]>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("len", &self.len())
            .finish()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        MemoryStore {
            shards: (0..SHARDS)
                .map(|_| ShardCell {
                    map: ArcSwap::from_pointee(Shard::with_hasher(BuildPassThrough)),
                    writer: Mutex::new(()),
                })
                .collect(),
        }
    }

    fn shard(&self, slot: &Slot) -> &ShardCell {
        &self.shards[(slot.hi as usize) % SHARDS]
    }

    /// The entry for `fp` in `ns`, if any. No allocation, no lock.
    #[inline]
    pub fn get(&self, ns: Namespace, fp: &Fingerprint) -> Option<Arc<Entry>> {
        let slot = Slot::new(ns, fp);
        self.shard(&slot)
            .map
            .load()
            .get(&slot)
            .map(|(_, e)| Arc::clone(e))
    }

    /// Calls `f` with the entry for `fp` in `ns`, if any, without touching its reference
    /// count: the contention-free form of [`MemoryStore::get`].
    #[inline]
    pub fn with_entry<R>(
        &self,
        ns: Namespace,
        fp: &Fingerprint,
        f: impl FnOnce(&Entry) -> R,
    ) -> Option<R> {
        let slot = Slot::new(ns, fp);
        self.shard(&slot).map.load().get(&slot).map(|(_, e)| f(e))
    }

    /// Merges `entry` into the store; returns whether the stored entry changed.
    pub fn merge(&self, ns: Namespace, entry: Entry) -> bool {
        self.merge_many(std::iter::once((ns, entry))) > 0
    }

    /// Merges many entries, copying each affected shard once; returns how many changed.
    pub fn merge_many(&self, entries: impl IntoIterator<Item = (Namespace, Entry)>) -> usize {
        let mut by_shard: HashMap<usize, Vec<(Slot, Namespace, Entry)>> = HashMap::new();
        for (ns, entry) in entries {
            let slot = Slot::new(ns, &entry.fingerprint());
            by_shard
                .entry((slot.hi as usize) % SHARDS)
                .or_default()
                .push((slot, ns, entry));
        }
        let mut changed = 0;
        for (index, items) in by_shard {
            let cell = &self.shards[index];
            // The writer mutex guards no data, only the order of publications; a panic
            // while holding it cannot leave anything half-done.
            let _writer = cell.writer.lock().unwrap_or_else(|p| p.into_inner());
            let current = cell.map.load_full();
            // Work out the changes against the published map first: merging what is already
            // known (a refresh re-reading our own records) then copies nothing.
            let mut updates: HashMap<Slot, (Namespace, Entry), BuildPassThrough> =
                HashMap::with_hasher(BuildPassThrough);
            for (slot, ns, entry) in items {
                match (updates.get_mut(&slot), current.get(&slot)) {
                    (Some((_, queued)), _) => queued.merge(entry),
                    (None, Some((_, existing))) => {
                        let mut merged = Entry::clone(existing);
                        merged.merge(entry);
                        if merged != **existing {
                            updates.insert(slot, (ns, merged));
                        }
                    }
                    (None, None) => {
                        updates.insert(slot, (ns, entry));
                    }
                }
            }
            if updates.is_empty() {
                continue;
            }
            changed += updates.len();
            let mut map = Shard::clone(&current);
            for (slot, (ns, entry)) in updates {
                map.insert(slot, (ns, Arc::new(entry)));
            }
            cell.map.store(Arc::new(map));
        }
        changed
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.map.load().len()).sum()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of every entry with its namespace, sorted (not for the hot path).
    pub fn snapshot(&self) -> Vec<(Namespace, Arc<Entry>)> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            out.extend(
                shard
                    .map
                    .load()
                    .values()
                    .map(|(ns, e)| (*ns, Arc::clone(e))),
            );
        }
        out.sort_by(|a, b| (a.0.name(), a.1.fingerprint()).cmp(&(b.0.name(), b.1.fingerprint())));
        out
    }
}

impl Store for MemoryStore {
    fn get(&self, ns: Namespace, fp: &Fingerprint) -> Option<Arc<Entry>> {
        MemoryStore::get(self, ns, fp)
    }

    /// Merges without checks: a memory store writes nothing a reader could refuse.
    fn try_put(&self, ns: Namespace, entry: Entry) -> Result<(), StoreError> {
        self.merge(ns, entry);
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
}
