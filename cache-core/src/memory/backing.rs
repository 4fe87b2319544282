//! What memory knows of the file behind it: a key read from the file joins what memory holds
//! (complete, or known absent, while no newer view of the file was published), and a file
//! change makes the keys it changed partial again (or unknown), visiting only their shards.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use cache_format::{Entry, Fingerprint};

use super::shard::{BuildPassThrough, Map, SHARDS, Slot};
use super::{Held, MemoryStore};
use crate::namespace::Namespace;

impl MemoryStore {
    /// What a read of the file found for `fp` in `ns` (`None`: nothing), as of the file view
    /// of `epoch`, joined with what memory holds: complete (or known absent) if `current` is
    /// still `epoch` (no newer view was published meanwhile: the publisher then makes entries
    /// partial again under the same shard lock), partial otherwise. Returns the entry.
    pub(crate) fn fill(
        &self,
        ns: Namespace,
        fp: &Fingerprint,
        found: Option<Entry>,
        epoch: u64,
        current: &std::sync::atomic::AtomicU64,
    ) -> Option<Arc<Entry>> {
        let slot = Slot::new(ns, fp);
        let cell = self.shard(&slot);
        let _writer = cell.writer.lock().unwrap_or_else(|p| p.into_inner());
        let now = cell.map.load_full();
        let fresh = current.load(std::sync::atomic::Ordering::Acquire) == epoch;
        let held = now.get(&slot).map(|(_, h)| h);
        let next = match (held, found) {
            // Another thread completed it meanwhile.
            (
                Some(Held::Ready {
                    entry,
                    complete: true,
                }),
                _,
            ) => return Some(Arc::clone(entry)),
            (Some(Held::Absent), None) => return None,
            (Some(Held::Ready { entry, .. }), found) => {
                let mut merged = Entry::clone(entry);
                if let Some(found) = found {
                    merged.merge(found);
                }
                Held::Ready {
                    entry: Arc::new(merged),
                    complete: fresh,
                }
            }
            (Some(Held::Absent) | None, Some(found)) => Held::Ready {
                entry: Arc::new(found),
                complete: fresh,
            },
            (None, None) if fresh => Held::Absent,
            (None, None) => return None,
        };
        let out = next.entry().cloned();
        let mut updates = Map::with_hasher(BuildPassThrough);
        updates.insert(slot, (ns, next));
        cell.map.store(Arc::new(now.with(updates, self.delta_from)));
        out
    }

    /// The file changed for the keys of fingerprint in `changed` (of any namespace): a complete
    /// entry of one becomes partial (the file is read again when it is used), an absent one
    /// unknown. `None`: every key. Only the shards of those keys are visited.
    pub(crate) fn forget_file(&self, changed: Option<&HashSet<Fingerprint>>) {
        let Some(fps) = changed else {
            for index in 0..SHARDS {
                self.forget_in(index, |_| true);
            }
            return;
        };
        // A key's shard follows from its fingerprint alone.
        let shards: BTreeSet<usize> = fps.iter().map(Slot::shard_of).collect();
        for index in shards {
            self.forget_in(index, |slot| fps.contains(&slot.fingerprint()));
        }
    }

    /// [`MemoryStore::forget_file`] in shard `index`, for the slots `changed` says yes to.
    fn forget_in(&self, index: usize, changed: impl Fn(&Slot) -> bool) {
        let cell = &self.shards[index];
        let _writer = cell.writer.lock().unwrap_or_else(|p| p.into_inner());
        let now = cell.map.load_full();
        let mut updates = Map::with_hasher(BuildPassThrough);
        let mut removed = Vec::new();
        for (slot, (ns, held)) in now.items() {
            if !changed(slot) {
                continue;
            }
            match held {
                Held::Ready {
                    entry,
                    complete: true,
                } => {
                    updates.insert(
                        *slot,
                        (
                            *ns,
                            Held::Ready {
                                entry: Arc::clone(entry),
                                complete: false,
                            },
                        ),
                    );
                }
                Held::Absent => removed.push(*slot),
                Held::Ready { .. } => {}
            }
        }
        if updates.is_empty() && removed.is_empty() {
            return;
        }
        let mut next = now.with(updates, self.delta_from);
        if !removed.is_empty() {
            next = next.without(&removed);
        }
        cell.map.store(Arc::new(next));
    }
}
