//! The in-memory tier: a sharded table of `Arc<Entry>` keyed by namespace and fingerprint.
//!
//! Each shard is immutable behind an `ArcSwap`: a reader loads the current version (no lock,
//! and no write to memory shared with other threads), probes it and lets go. A writer makes a
//! new version and publishes it (read-copy-update), serialised per shard by a mutex readers
//! never touch. A version is a large shared *base* map plus a small *delta* of the entries
//! changed since the base was built: a write copies only the delta and shares the base, and
//! folds the delta into a new base once it passes about √(2·base) entries, so a put copies
//! about the square root of a shard instead of all of it; with 16,384 shards a shard holds a
//! few entries at 50,000 (copied whole) and about 61 at a million (a delta of about 11), and a
//! put into a store of 10,000 to 200,000 entries costs 0.9 µs instead of 2.8 µs with 1,024
//! (ARCHITECTURE.md, "The memory tier's write side", says why not per-key cells). A hit costs one
//! atomic load and one or two hash probes (the delta, usually empty, then the base) and, for
//! [`MemoryStore::get`], one reference-count increment; [`MemoryStore::with_entry`] skips even
//! that, so threads hitting the same key do not contend at all. The fingerprint is already a
//! uniform digest, so hashing is a multiply.

mod backing;
mod shard;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use cache_format::{Entry, Fingerprint};

use crate::error::StoreError;
use crate::namespace::Namespace;
use crate::store::Store;
use shard::{BuildPassThrough, Map, SHARDS, Shard, Slot};

/// What memory holds for a key, found without I/O.
pub(crate) enum Resident {
    /// The whole entry: memory holds everything the file had for it when read, and since.
    Complete(Arc<Entry>),
    /// What this process recorded or learned, which the file may add to: reading the file
    /// completes it.
    Partial,
    /// The file did not have it when last read (and nothing was recorded since).
    Absent,
    /// Nothing known: the file may have it.
    Unknown,
}

/// An entry as memory holds it (see [`Resident`]).
#[derive(Clone)]
enum Held {
    Ready {
        entry: Arc<Entry>,
        complete: bool,
    },
    /// Known to be missing from the file (a lookup read it and found nothing).
    Absent,
}

impl Held {
    #[inline]
    fn entry(&self) -> Option<&Arc<Entry>> {
        match self {
            Held::Ready { entry, .. } => Some(entry),
            Held::Absent => None,
        }
    }
}

struct ShardCell {
    map: ArcSwap<Shard>,
    writer: Mutex<()>,
}

/// Shards of at least this many entries keep a delta (see `Shard::with`); smaller ones are
/// copied whole on a write.
const DELTA_FROM: usize = 32;

/// An in-memory store: concurrent readers, merge-on-insert, nothing persisted.
///
/// In front of a cache file (a table, read a key at a time) it is a cache of that file, not a
/// copy of it: an entry is *complete* when it holds everything the file had for its key when
/// read (and what was recorded since), *partial* when it holds only what this process
/// recorded or learned (the file may add to it), and a key can be remembered as absent from
/// the file. Standing alone, every entry is complete.
pub struct MemoryStore {
    shards: Box<[ShardCell]>,
    /// Shards smaller than this are copied whole on a write (see `Shard::with`).
    delta_from: usize,
    /// A file stands behind it: a new key recorded here is partial until the file is read.
    backed: std::sync::atomic::AtomicBool,
    /// How many merges changed an entry (see [`MemoryStore::changes`]).
    changes: std::sync::atomic::AtomicU64,
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
        Self::with_delta_from(DELTA_FROM)
    }

    fn with_delta_from(delta_from: usize) -> Self {
        // One empty version shared by every shard until its first write: a store costs its
        // shard array (16 bytes a shard) and nothing more until it is used.
        let empty = Arc::new(Shard::empty());
        MemoryStore {
            delta_from,
            backed: std::sync::atomic::AtomicBool::new(false),
            changes: std::sync::atomic::AtomicU64::new(0),
            shards: (0..SHARDS)
                .map(|_| ShardCell {
                    map: ArcSwap::new(Arc::clone(&empty)),
                    writer: Mutex::new(()),
                })
                .collect(),
        }
    }

    fn shard(&self, slot: &Slot) -> &ShardCell {
        &self.shards[slot.shard()]
    }

    /// The entry for `fp` in `ns`, if any (complete or not). No allocation, no lock.
    #[inline]
    pub fn get(&self, ns: Namespace, fp: &Fingerprint) -> Option<Arc<Entry>> {
        let slot = Slot::new(ns, fp);
        self.shard(&slot)
            .map
            .load()
            .get(&slot)
            .and_then(|(_, held)| held.entry().cloned())
    }

    /// What memory holds for `fp` in `ns` (see [`Resident`]). Never any I/O.
    #[inline]
    pub(crate) fn resident(&self, ns: Namespace, fp: &Fingerprint) -> Resident {
        let slot = Slot::new(ns, fp);
        match self.shard(&slot).map.load().get(&slot) {
            None => Resident::Unknown,
            Some((
                _,
                Held::Ready {
                    entry,
                    complete: true,
                },
            )) => Resident::Complete(Arc::clone(entry)),
            Some((_, Held::Ready { .. })) => Resident::Partial,
            Some((_, Held::Absent)) => Resident::Absent,
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
        self.shard(&slot)
            .map
            .load()
            .get(&slot)
            .and_then(|(_, held)| held.entry())
            .map(|e| f(e))
    }

    /// Says whether a file stands behind this store (a key recorded here is then partial
    /// until the file is read).
    pub(crate) fn set_backed(&self, backed: bool) {
        self.backed
            .store(backed, std::sync::atomic::Ordering::Release);
    }

    /// Merges `entry` into the store; returns whether the stored entry changed.
    pub fn merge(&self, ns: Namespace, entry: Entry) -> bool {
        self.merge_many(std::iter::once((ns, entry))) > 0
    }

    /// Merges many entries, copying each affected shard once; returns how many changed. A key
    /// memory knew nothing of is complete unless a file stands behind the store; one known to
    /// be absent from the file is complete.
    pub fn merge_many(&self, entries: impl IntoIterator<Item = (Namespace, Entry)>) -> usize {
        let backed = self.backed.load(std::sync::atomic::Ordering::Acquire);
        self.update(entries, |held, entry| {
            merged_into(held, entry, |entry| {
                Some(Held::Ready {
                    entry: Arc::new(entry),
                    complete: !backed,
                })
            })
        })
    }

    /// Entries read from the file (a journal's new records) merged into the keys memory holds
    /// (one known to be absent becomes complete with it); keys it does not hold are left to be
    /// read when they are used. Returns how many changed.
    pub(crate) fn merge_held(
        &self,
        entries: impl IntoIterator<Item = (Namespace, Entry)>,
    ) -> usize {
        self.update(entries, |held, entry| merged_into(held, entry, |_| None))
    }

    /// Applies `f` to each entry's slot under its shard's writer lock, copying each affected
    /// shard once; `f` returns the new value, or `None` to leave the slot as it is. Returns how
    /// many slots changed.
    fn update(
        &self,
        entries: impl IntoIterator<Item = (Namespace, Entry)>,
        mut f: impl FnMut(Option<&Held>, Entry) -> Option<Held>,
    ) -> usize {
        let mut entries = entries.into_iter();
        let (Some(first), second) = (entries.next(), entries.next()) else {
            return 0;
        };
        let changed = match second {
            // One entry (a put): its shard, without grouping.
            None => {
                let slot = Slot::new(first.0, &first.1.fingerprint());
                let index = slot.shard();
                self.update_shard(index, vec![(slot, first.0, first.1)], &mut f)
            }
            Some(second) => {
                let mut by_shard: HashMap<usize, Vec<(Slot, Namespace, Entry)>> = HashMap::new();
                for (ns, entry) in [first, second].into_iter().chain(entries) {
                    let slot = Slot::new(ns, &entry.fingerprint());
                    by_shard
                        .entry(slot.shard())
                        .or_default()
                        .push((slot, ns, entry));
                }
                by_shard
                    .into_iter()
                    .map(|(index, items)| self.update_shard(index, items, &mut f))
                    .sum()
            }
        };
        if changed > 0 {
            self.changes
                .fetch_add(changed as u64, std::sync::atomic::Ordering::Release);
        }
        changed
    }

    /// [`MemoryStore::update`] of the entries of one shard: one new version of it, published
    /// once. Returns how many slots changed.
    fn update_shard(
        &self,
        index: usize,
        items: Vec<(Slot, Namespace, Entry)>,
        f: &mut impl FnMut(Option<&Held>, Entry) -> Option<Held>,
    ) -> usize {
        let cell = &self.shards[index];
        // The writer mutex guards no data, only the order of publications; a panic while
        // holding it cannot leave anything half-done.
        let _writer = cell.writer.lock().unwrap_or_else(|p| p.into_inner());
        let current = cell.map.load_full();
        // Work out the changes against the published map first: merging what is already known
        // (a refresh re-reading our own records) then copies nothing.
        let mut updates = Map::with_hasher(BuildPassThrough);
        for (slot, ns, entry) in items {
            let held = updates
                .get(&slot)
                .map(|(_, h)| h)
                .or_else(|| current.get(&slot).map(|(_, h)| h));
            if let Some(next) = f(held, entry) {
                updates.insert(slot, (ns, next));
            }
        }
        let changed = updates.len();
        if changed > 0 {
            cell.map
                .store(Arc::new(current.with(updates, self.delta_from)));
        }
        changed
    }

    /// A count that grows with every entry a merge changed: read before the entries, it
    /// tells whether what was read may be out of date.
    pub fn changes(&self) -> u64 {
        self.changes.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Number of entries (complete or not; keys known absent are not entries).
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let shard = s.map.load();
                shard
                    .items()
                    .filter(|(_, (_, h))| matches!(h, Held::Ready { .. }))
                    .count()
            })
            .sum()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of every entry with its namespace, sorted (not for the hot path).
    pub fn snapshot(&self) -> Vec<(Namespace, Arc<Entry>)> {
        let mut out = Vec::new();
        for cell in self.shards.iter() {
            let shard = cell.map.load_full();
            for (_, (ns, held)) in shard.items() {
                if let Some(e) = held.entry() {
                    out.push((*ns, Arc::clone(e)));
                }
            }
        }
        out.sort_by(|a, b| (a.0.name(), a.1.fingerprint()).cmp(&(b.0.name(), b.1.fingerprint())));
        out
    }

    /// Every entry memory holds with whether it is complete (for walks that join memory with
    /// the file).
    pub(crate) fn held(&self) -> Vec<(Namespace, Arc<Entry>, bool)> {
        let mut out = Vec::new();
        for cell in self.shards.iter() {
            let shard = cell.map.load_full();
            for (_, (ns, held)) in shard.items() {
                if let Held::Ready { entry, complete } = held {
                    out.push((*ns, Arc::clone(entry), *complete));
                }
            }
        }
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

/// What memory holds for a key after `entry` is merged into `held`: the merge of a ready entry
/// (`None` if it changes nothing), the entry itself for a key known to be absent from the file
/// (then complete), and `unknown`'s answer for a key memory knows nothing of.
fn merged_into(
    held: Option<&Held>,
    entry: Entry,
    unknown: impl FnOnce(Entry) -> Option<Held>,
) -> Option<Held> {
    match held {
        Some(Held::Ready {
            entry: old,
            complete,
        }) => {
            // The update takes in the held entry (the same result as the held entry taking in
            // the update): only what the held entry still wins is copied.
            let mut merged = entry;
            merged.merge_from(old);
            (merged != **old).then(|| Held::Ready {
                entry: Arc::new(merged),
                complete: *complete,
            })
        }
        Some(Held::Absent) => Some(Held::Ready {
            entry: Arc::new(entry),
            complete: true,
        }),
        None => unknown(entry),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cache_format::{Candidate, Fields, Key, Stats, Value};

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
        Entry::new(key, Fingerprint::default(), crate::measured_here(), 1, [c])
    }

    /// Many writes, one at a time and in batches, with updates of keys already stored: the
    /// store agrees with a plain map merged the same way, across every delta and fold of its
    /// shards (len, get, snapshot).
    /// A file change for some fingerprints makes their keys, in every namespace, partial (or
    /// unknown, if known absent), and leaves every other key as it was.
    #[test]
    fn forgetting_changed_keys_touches_those_keys_only() {
        let store = MemoryStore::new();
        let (a, b) = (
            Namespace::new("a").expect("name"),
            Namespace::new("b").expect("name"),
        );
        let changed = entry(1, "x", 1.0);
        let kept = entry(2, "x", 1.0);
        for ns in [a, b] {
            store.merge(ns, changed.clone());
            store.merge(ns, kept.clone());
        }
        let gone = entry(3, "x", 1.0).fingerprint();
        let epoch = std::sync::atomic::AtomicU64::new(7);
        assert!(store.fill(a, &gone, None, 7, &epoch).is_none());
        assert!(matches!(store.resident(a, &gone), Resident::Absent));
        let fps = std::collections::HashSet::from([changed.fingerprint(), gone]);
        store.forget_file(Some(&fps));
        for ns in [a, b] {
            assert!(matches!(
                store.resident(ns, &changed.fingerprint()),
                Resident::Partial
            ));
            assert!(matches!(
                store.resident(ns, &kept.fingerprint()),
                Resident::Complete(_)
            ));
        }
        assert!(matches!(store.resident(a, &gone), Resident::Unknown));
        store.forget_file(None);
        assert!(matches!(
            store.resident(b, &kept.fingerprint()),
            Resident::Partial
        ));
    }

    /// The shard array is what an unused store costs: 16 bytes a shard.
    #[test]
    fn a_shard_costs_sixteen_bytes_until_it_is_written() {
        assert!(std::mem::size_of::<ShardCell>() <= 16);
        let store = MemoryStore::new();
        let first = store.shards[0].map.load_full();
        assert!(
            store
                .shards
                .iter()
                .all(|s| Arc::ptr_eq(&s.map.load(), &first))
        );
    }

    #[test]
    fn the_store_agrees_with_a_plain_map_across_deltas_and_folds() {
        // Small shards keep deltas too here, so 60,000 keys (about four a shard) exercise
        // deltas and folds.
        let store = MemoryStore::with_delta_from(2);
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
        for round in 0..120_000u64 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let id = (x >> 33) % 60_000;
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
        let folded = store
            .shards
            .iter()
            .filter(|s| s.map.load().base_len() > 0)
            .count();
        let with_delta = store
            .shards
            .iter()
            .filter(|s| s.map.load().delta_len() > 0)
            .count();
        assert!(folded > 1000 && with_delta > 1000, "{folded} {with_delta}");
        let all = store.snapshot();
        assert_eq!(all.len(), model.len());
        for (_, e) in all {
            assert_eq!(Some(&*e), model.get(&e.fingerprint()));
        }
    }
}
