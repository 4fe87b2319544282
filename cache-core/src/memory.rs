//! The in-memory tier: a sharded table of `Arc<Entry>` keyed by namespace and fingerprint.
//!
//! Each shard is immutable behind an `ArcSwap`: a reader loads the current version (no lock,
//! and no write to memory shared with other threads), probes it and lets go. A writer makes a
//! new version and publishes it (read-copy-update), serialised per shard by a mutex readers
//! never touch. A version is a large shared *base* map plus a small *delta* of the entries
//! changed since the base was built: a write copies only the delta and shares the base, and
//! folds the delta into a new base once it passes about √(2·base) entries, so a put copies
//! about the square root of a shard instead of all of it. A hit costs one
//! atomic load and one or two hash probes (the delta, usually empty, then the base) and, for
//! [`MemoryStore::get`], one reference-count increment; [`MemoryStore::with_entry`] skips even
//! that, so threads hitting the same key do not contend at all. The fingerprint is already a
//! uniform digest, so hashing is a multiply.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use cache_format::{Entry, Fingerprint};

use crate::error::StoreError;
use crate::lazy::StoredEntry;
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

    fn fingerprint(&self) -> Fingerprint {
        let mut fp = [0u8; 16];
        fp[..8].copy_from_slice(&self.hi.to_le_bytes());
        fp[8..].copy_from_slice(&self.lo.to_le_bytes());
        Fingerprint(fp)
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

/// What memory holds for a key, found without I/O.
pub(crate) enum Resident {
    /// Decoded.
    Ready(Arc<Entry>),
    /// Kept in the snapshot file, not read yet.
    Stored,
    /// Nothing.
    Absent,
}

/// An entry as memory holds it: decoded, or where its bytes are in the snapshot file (decoded
/// on first use; see `lazy`).
#[derive(Clone)]
enum Held {
    Ready(Arc<Entry>),
    Stored(Arc<StoredEntry>),
}

impl Held {
    #[inline]
    fn entry(&self, ns: Namespace, slot: &Slot) -> Option<Arc<Entry>> {
        match self {
            Held::Ready(e) => Some(Arc::clone(e)),
            Held::Stored(s) => s.entry(ns.name(), &slot.fingerprint()),
        }
    }
}

type Map = HashMap<Slot, (Namespace, Held), BuildPassThrough>;

/// One published version of a shard: the delta's entries replace the base's.
#[derive(Clone)]
struct Shard {
    base: Arc<Map>,
    delta: Map,
    /// Entries of the delta that the base does not have.
    added: usize,
}

impl Shard {
    fn empty() -> Self {
        Shard {
            base: Arc::new(Map::with_hasher(BuildPassThrough)),
            delta: Map::with_hasher(BuildPassThrough),
            added: 0,
        }
    }

    #[inline]
    fn get(&self, slot: &Slot) -> Option<&(Namespace, Held)> {
        if self.delta.is_empty() {
            return self.base.get(slot);
        }
        self.delta.get(slot).or_else(|| self.base.get(slot))
    }

    fn len(&self) -> usize {
        self.base.len() + self.added
    }

    fn items(&self) -> impl Iterator<Item = (&Slot, &(Namespace, Held))> {
        self.delta.iter().chain(
            self.base
                .iter()
                .filter(|(slot, _)| !self.delta.contains_key(slot)),
        )
    }

    /// This version with `updates` applied: in the delta, or folded into a new base once the
    /// delta would pass about √(2·base) entries. A write copies the delta (half that on
    /// average) and, amortised, the base once per that many writes: about √(2·base) entries
    /// per write in all, against the whole shard before (at a million entries, ~45 instead
    /// of ~1,000 per shard of 1,024).
    fn with(&self, updates: Map, delta_from: usize) -> Shard {
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

struct ShardCell {
    map: ArcSwap<Shard>,
    writer: Mutex<()>,
}

/// An in-memory store: concurrent readers, merge-on-insert, nothing persisted.
pub struct MemoryStore {
    shards: Box<[ShardCell]>,
    /// Shards smaller than this are copied whole on a write (see `Shard::with`).
    delta_from: usize,
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
        Self::with_delta_from(256)
    }

    fn with_delta_from(delta_from: usize) -> Self {
        MemoryStore {
            delta_from,
            shards: (0..SHARDS)
                .map(|_| ShardCell {
                    map: ArcSwap::from_pointee(Shard::empty()),
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
            .and_then(|(ns, held)| held.entry(*ns, &slot))
    }

    /// The entry for `fp` in `ns` if it is decoded; [`Resident::Stored`] if it is still kept
    /// in the file (reading it would be I/O). Never any I/O.
    #[inline]
    pub(crate) fn resident(&self, ns: Namespace, fp: &Fingerprint) -> Resident {
        let slot = Slot::new(ns, fp);
        match self.shard(&slot).map.load().get(&slot) {
            None => Resident::Absent,
            Some((_, Held::Ready(e))) => Resident::Ready(Arc::clone(e)),
            Some((_, Held::Stored(s))) => match s.decoded() {
                Some(Some(e)) => Resident::Ready(e),
                Some(None) => Resident::Absent,
                None => Resident::Stored,
            },
        }
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
        match self.shard(&slot).map.load().get(&slot)? {
            (_, Held::Ready(e)) => Some(f(e)),
            (ns, Held::Stored(s)) => s.entry(ns.name(), fp).map(|e| f(&e)),
        }
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
                // A stored entry that no longer decodes is replaced (see `lazy`).
                let existing = current
                    .get(&slot)
                    .and_then(|(held_ns, held)| held.entry(*held_ns, &slot));
                match (updates.get_mut(&slot), existing) {
                    (Some((_, queued)), _) => queued.merge(entry),
                    (None, Some(existing)) => {
                        let mut merged = Entry::clone(&existing);
                        merged.merge(entry);
                        if merged != *existing {
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
            let updates: Map = updates
                .into_iter()
                .map(|(slot, (ns, entry))| (slot, (ns, Held::Ready(Arc::new(entry)))))
                .collect();
            cell.map
                .store(Arc::new(current.with(updates, self.delta_from)));
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

    /// Takes in the entries of a snapshot that were checked but not decoded (see `lazy`):
    /// each is decoded on first use. One whose key memory holds already (or that comes twice)
    /// is decoded now and merged. Returns how many were taken in.
    pub(crate) fn insert_stored(
        &self,
        items: impl IntoIterator<Item = (Namespace, Fingerprint, Arc<StoredEntry>)>,
    ) -> usize {
        let mut by_shard: Vec<Vec<(Slot, Namespace, Arc<StoredEntry>)>> =
            (0..SHARDS).map(|_| Vec::new()).collect();
        for (ns, fp, stored) in items {
            let slot = Slot::new(ns, &fp);
            by_shard[(slot.hi as usize) % SHARDS].push((slot, ns, stored));
        }
        let mut taken = 0;
        let mut merges = Vec::new();
        for (index, items) in by_shard.into_iter().enumerate() {
            if items.is_empty() {
                continue;
            }
            let cell = &self.shards[index];
            let _writer = cell.writer.lock().unwrap_or_else(|p| p.into_inner());
            let current = cell.map.load_full();
            let mut updates = Map::with_capacity_and_hasher(items.len(), BuildPassThrough);
            for (slot, ns, stored) in items {
                if current.get(&slot).is_some() || updates.contains_key(&slot) {
                    merges.push((ns, slot, stored));
                    continue;
                }
                updates.insert(slot, (ns, Held::Stored(stored)));
            }
            taken += updates.len();
            if !updates.is_empty() {
                cell.map
                    .store(Arc::new(current.with(updates, self.delta_from)));
            }
        }
        let merges: Vec<(Namespace, Entry)> = merges
            .into_iter()
            .filter_map(|(ns, slot, stored)| {
                let entry = stored.entry(ns.name(), &slot.fingerprint())?;
                Some((ns, Arc::unwrap_or_clone(entry)))
            })
            .collect();
        let merged = merges.len();
        self.merge_many(merges);
        taken + merged
    }

    /// Decodes and keeps every entry still in its file, reading each file once: before many
    /// entries are merged into the store (a whole file read again), which would otherwise
    /// read them back one by one.
    pub(crate) fn decode_stored(&self) {
        let shards: Vec<_> = self.shards.iter().map(|s| s.map.load_full()).collect();
        let stored: Vec<(&str, Fingerprint, &StoredEntry)> = shards
            .iter()
            .flat_map(|shard| shard.items())
            .filter_map(|(slot, (ns, held))| match held {
                Held::Stored(s) => Some((ns.name(), slot.fingerprint(), &**s)),
                Held::Ready(_) => None,
            })
            .collect();
        if !stored.is_empty() {
            crate::lazy::decode_all(&stored, true);
        }
    }

    /// A copy of every entry with its namespace, sorted (not for the hot path). Entries not
    /// yet decoded are decoded for the copy but not kept.
    pub fn snapshot(&self) -> Vec<(Namespace, Arc<Entry>)> {
        let mut out = Vec::new();
        let mut stored = Vec::new();
        let shards: Vec<_> = self.shards.iter().map(|s| s.map.load_full()).collect();
        for shard in &shards {
            for (slot, (ns, held)) in shard.items() {
                match held {
                    Held::Ready(e) => out.push((*ns, Arc::clone(e))),
                    Held::Stored(s) => stored.push((*ns, slot.fingerprint(), s)),
                }
            }
        }
        if !stored.is_empty() {
            let wanted: Vec<(&str, Fingerprint, &StoredEntry)> = stored
                .iter()
                .map(|(ns, fp, s)| (ns.name(), *fp, &***s))
                .collect();
            let decoded = crate::lazy::decode_all(&wanted, false);
            out.extend(
                stored
                    .iter()
                    .zip(decoded)
                    .filter_map(|((ns, _, _), e)| Some((*ns, e?))),
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

#[cfg(test)]
mod tests {
    use super::*;
    use cache_format::{Candidate, Fields, Key, Origin, Stats, Value};

    fn entry(id: u64, algo: &str, median: f64) -> Entry {
        let key = Key::new(Fields::from([("id".to_owned(), Value::Int(id as i64))]));
        let stats = Stats {
            median_ns: median,
            min_ns: median,
            spread_ns: 0.0,
            samples: 1,
        };
        let mut c = Candidate::measured(algo, Fields::new(), stats);
        c.measured_at = id + 1;
        Entry::new(key, Fingerprint::default(), Origin::here(), 1, [c])
    }

    /// Many writes, one at a time and in batches, with updates of keys already stored: the
    /// store agrees with a plain map merged the same way, across every delta and fold of its
    /// shards (len, get, snapshot).
    #[test]
    fn the_store_agrees_with_a_plain_map_across_deltas_and_folds() {
        // Small shards keep deltas too here, so 20,000 keys exercise deltas and folds.
        let store = MemoryStore::with_delta_from(4);
        let ns = Namespace::new("t").expect("name");
        let mut model: HashMap<Fingerprint, Entry> = HashMap::new();
        let put = |e: Entry, model: &mut HashMap<Fingerprint, Entry>| {
            model
                .entry(e.fingerprint())
                .and_modify(|m| m.merge(e.clone()))
                .or_insert_with(|| e.clone());
            e
        };
        // Pseudo-random order, so shards grow unevenly and fold at different times.
        let mut x: u64 = 7;
        for round in 0..30_000u64 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let id = (x >> 33) % 20_000;
            let algo = if round % 3 == 0 { "a" } else { "b" };
            let e = put(entry(id, algo, (round % 97) as f64 + 1.0), &mut model);
            if round % 1000 == 0 {
                let batch: Vec<(Namespace, Entry)> = (0..50)
                    .map(|i| (ns, put(entry(50_000 + round + i, "c", 5.0), &mut model)))
                    .collect();
                store.merge_many(batch);
            }
            store.merge(ns, e);
        }
        assert_eq!(store.len(), model.len());
        for (fp, want) in &model {
            assert_eq!(store.get(ns, fp).as_deref(), Some(want));
        }
        let all = store.snapshot();
        assert_eq!(all.len(), model.len());
        for (_, e) in all {
            assert_eq!(Some(&*e), model.get(&e.fingerprint()));
        }
    }
}
