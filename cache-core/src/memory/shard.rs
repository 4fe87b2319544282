//! The shards of the memory tier: slots keyed by namespace and fingerprint, hashed by a
//! multiply (the fingerprint is already a uniform digest), and each published version of a
//! shard: a large shared base and a small delta of what changed since.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

use cache_format::Fingerprint;

use super::Held;
use crate::namespace::Namespace;

/// Enough shards that copying one on a write stays cheap: a write copies what its shard holds
/// (or its delta, about √(2·shard) entries, once a shard passes `DELTA_FROM`), so the cost of a
/// put follows the store's size over this number: about three entries at 50,000 entries and
/// 61 (a delta of about 11) at a million. 16 bytes each (an `ArcSwap` and a mutex).
pub(super) const SHARDS: usize = 16_384;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct Slot {
    ns: u32,
    lo: u64,
    hi: u64,
}

impl Slot {
    pub(super) fn new(ns: Namespace, fp: &Fingerprint) -> Self {
        let mut lo = [0u8; 8];
        lo.copy_from_slice(&fp.0[8..]);
        Slot {
            ns: ns.id(),
            lo: u64::from_le_bytes(lo),
            hi: hi_of(fp),
        }
    }

    /// Its shard: chosen by the fingerprint alone, so every namespace's key of a fingerprint
    /// is in the same one ([`Slot::shard_of`]).
    #[inline]
    pub(super) fn shard(&self) -> usize {
        (self.hi as usize) % SHARDS
    }

    /// The shard of the keys of fingerprint `fp`, in any namespace.
    pub(super) fn shard_of(fp: &Fingerprint) -> usize {
        (hi_of(fp) as usize) % SHARDS
    }

    pub(super) fn fingerprint(&self) -> Fingerprint {
        let mut fp = [0u8; 16];
        fp[..8].copy_from_slice(&self.hi.to_le_bytes());
        fp[8..].copy_from_slice(&self.lo.to_le_bytes());
        Fingerprint(fp)
    }

    fn mixed(&self) -> u64 {
        self.lo ^ u64::from(self.ns).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }
}

fn hi_of(fp: &Fingerprint) -> u64 {
    let mut hi = [0u8; 8];
    hi.copy_from_slice(&fp.0[..8]);
    u64::from_le_bytes(hi)
}

impl Hash for Slot {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.mixed());
    }
}

/// Passes the already-uniform slot hash through.
#[derive(Default, Clone, Copy)]
pub(super) struct PassThrough(u64);

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
pub(super) struct BuildPassThrough;

impl BuildHasher for BuildPassThrough {
    type Hasher = PassThrough;
    fn build_hasher(&self) -> PassThrough {
        PassThrough(0)
    }
}

pub(super) type Map = HashMap<Slot, (Namespace, Held), BuildPassThrough>;

/// One published version of a shard: the delta's entries replace the base's.
#[derive(Clone)]
pub(super) struct Shard {
    base: Arc<Map>,
    delta: Map,
    /// Entries of the delta that the base does not have.
    added: usize,
}

impl Shard {
    pub(super) fn empty() -> Self {
        Shard {
            base: Arc::new(Map::with_hasher(BuildPassThrough)),
            delta: Map::with_hasher(BuildPassThrough),
            added: 0,
        }
    }

    #[cfg(test)]
    pub(super) fn base_len(&self) -> usize {
        self.base.len()
    }

    #[cfg(test)]
    pub(super) fn delta_len(&self) -> usize {
        self.delta.len()
    }

    #[inline]
    pub(super) fn get(&self, slot: &Slot) -> Option<&(Namespace, Held)> {
        if self.delta.is_empty() {
            return self.base.get(slot);
        }
        self.delta.get(slot).or_else(|| self.base.get(slot))
    }

    pub(super) fn items(&self) -> impl Iterator<Item = (&Slot, &(Namespace, Held))> {
        self.delta.iter().chain(
            self.base
                .iter()
                .filter(|(slot, _)| !self.delta.contains_key(slot)),
        )
    }

    /// This version with `updates` applied: in the delta, or folded into a new base once the
    /// delta would pass about √(2·base) entries. A write copies the delta (half that on
    /// average) and, amortised, the base once per that many writes: about √(2·base) entries
    /// per write in all, against the whole shard (at a million entries over 16,384 shards,
    /// about 17 instead of 61).
    pub(super) fn with(&self, updates: Map, delta_from: usize) -> Shard {
        let added = updates
            .keys()
            .filter(|slot| !self.delta.contains_key(slot) && !self.base.contains_key(slot))
            .count();
        // A small shard is copied whole (a structural copy, cheaper than rebuilding a delta
        // entry by entry); a large one keeps a delta of up to about √(2·base) entries.
        let limit = if self.base.len() < delta_from {
            0
        } else {
            (2 * self.base.len()).isqrt()
        };
        if self.delta.len() + updates.len() > limit {
            let mut base = Map::clone(&self.base);
            // One insert at a time: `extend` would reserve room for every item, growing (and
            // rehashing) the map although most of them replace an entry already there.
            for (k, v) in self
                .delta
                .iter()
                .map(|(k, v)| (*k, v.clone()))
                .chain(updates)
            {
                base.insert(k, v);
            }
            return Shard {
                base: Arc::new(base),
                delta: Map::with_hasher(BuildPassThrough),
                added: 0,
            };
        }
        let mut delta = self.delta.clone();
        for (k, v) in updates {
            delta.insert(k, v);
        }
        Shard {
            base: Arc::clone(&self.base),
            delta,
            added: self.added + added,
        }
    }
}

impl Shard {
    /// This version without the slots `gone`.
    pub(super) fn without(&self, gone: &[Slot]) -> Shard {
        let mut base = Map::clone(&self.base);
        for (k, v) in &self.delta {
            base.insert(*k, v.clone());
        }
        for slot in gone {
            base.remove(slot);
        }
        Shard {
            base: Arc::new(base),
            delta: Map::with_hasher(BuildPassThrough),
            added: 0,
        }
    }
}
