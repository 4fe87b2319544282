//! The in-memory tier: a sharded table of `Arc<Entry>` keyed by namespace and fingerprint.
//!
//! A hit is one shard read-lock, one hash probe and one reference-count increment: no
//! allocation and no hashing beyond mixing two integers, because the fingerprint is already
//! a uniform 128-bit digest. Readers of different keys land on different shards (64 of
//! them), so many threads do not serialise on one lock.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use cache_format::{Entry, Fingerprint};

use crate::error::StoreError;
use crate::namespace::Namespace;
use crate::store::Store;

const SHARDS: usize = 64;

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

/// An in-memory store: concurrent readers, merge-on-insert, nothing persisted.
pub struct MemoryStore {
    shards: Box<[RwLock<Shard>]>,
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
                .map(|_| RwLock::new(Shard::with_hasher(BuildPassThrough)))
                .collect(),
        }
    }

    fn shard(&self, slot: &Slot) -> &RwLock<Shard> {
        &self.shards[(slot.hi as usize) % SHARDS]
    }

    fn read(&self, slot: &Slot) -> RwLockReadGuard<'_, Shard> {
        // Writers never leave a shard half-updated (one insert per lock), so a poisoned
        // shard is still consistent.
        self.shard(slot).read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self, slot: &Slot) -> RwLockWriteGuard<'_, Shard> {
        self.shard(slot).write().unwrap_or_else(|p| p.into_inner())
    }

    /// The entry for `fp` in `ns`, if any. The hot path: no allocation.
    #[inline]
    pub fn get(&self, ns: Namespace, fp: &Fingerprint) -> Option<Arc<Entry>> {
        let slot = Slot::new(ns, fp);
        self.read(&slot).get(&slot).map(|(_, e)| Arc::clone(e))
    }

    /// Merges `entry` into the store; returns whether the stored entry changed.
    pub fn merge(&self, ns: Namespace, entry: Entry) -> bool {
        let slot = Slot::new(ns, &entry.fingerprint());
        let mut shard = self.write(&slot);
        match shard.get_mut(&slot) {
            Some((_, existing)) => {
                let mut merged = Entry::clone(existing);
                merged.merge(entry);
                if merged == **existing {
                    false
                } else {
                    *existing = Arc::new(merged);
                    true
                }
            }
            None => {
                shard.insert(slot, (ns, Arc::new(entry)));
                true
            }
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.read().unwrap_or_else(|p| p.into_inner()).len())
            .sum()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of every entry with its namespace (not for the hot path).
    pub fn snapshot(&self) -> Vec<(Namespace, Arc<Entry>)> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard.read().unwrap_or_else(|p| p.into_inner());
            out.extend(shard.values().map(|(ns, e)| (*ns, Arc::clone(e))));
        }
        out.sort_by(|a, b| (a.0.name(), a.1.fingerprint()).cmp(&(b.0.name(), b.1.fingerprint())));
        out
    }
}

impl Store for MemoryStore {
    fn get(&self, ns: Namespace, fp: &Fingerprint) -> Option<Arc<Entry>> {
        MemoryStore::get(self, ns, fp)
    }

    fn put(&self, ns: Namespace, entry: Entry) {
        self.merge(ns, entry);
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
}
