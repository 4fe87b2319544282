//! The cache's side of its lower tiers: a miss in memory asks each tier in order, what a
//! [`Fill::Keep`] tier returns comes into memory and the file, and keys recorded here are
//! offered to the tiers that write.

use std::sync::Arc;

use cache_format::{Entry, Fingerprint};

use super::{Mode, Shared, lock};
use crate::namespace::Namespace;
use crate::tier::Fill;

impl Shared {
    /// A miss in memory: each tier in order, until one has the key.
    #[cold]
    pub(super) fn miss(&self, ns: Namespace, fp: &Fingerprint) -> Option<Arc<Entry>> {
        for tier in &self.tiers {
            let Some(found) = tier.get_many(ns, std::slice::from_ref(fp)).pop() else {
                continue;
            };
            return match tier.fill() {
                Fill::Serve => Some(found),
                Fill::Keep => {
                    self.absorb_from_tier(vec![(ns, unwrap_or_clone(found))]);
                    self.memory.get(ns, fp)
                }
            };
        }
        None
    }

    /// Asks each tier once for the keys of `fps` that memory and the tiers before it lack;
    /// returns how many the tiers had.
    pub(super) fn prefetch(&self, ns: Namespace, fps: &[Fingerprint]) -> usize {
        let mut missing: Vec<Fingerprint> = fps
            .iter()
            .filter(|fp| self.memory.get(ns, fp).is_none())
            .copied()
            .collect();
        let mut had = 0;
        for tier in &self.tiers {
            if missing.is_empty() {
                break;
            }
            let found = tier.get_many(ns, &missing);
            had += found.len();
            missing.retain(|fp| found.iter().all(|e| e.fingerprint() != *fp));
            if tier.fill() == Fill::Keep {
                self.absorb_from_tier(
                    found
                        .into_iter()
                        .map(|e| (ns, unwrap_or_clone(e)))
                        .collect(),
                );
            }
        }
        had
    }

    /// Merges entries a tier returned into memory and, for a persistent cache, queues the
    /// keys whose entry changed for the file (not for the tiers: they came from there).
    /// Returns how many changed.
    pub(crate) fn absorb_from_tier(&self, mut entries: Vec<(Namespace, Entry)>) -> usize {
        if entries.is_empty() {
            return 0;
        }
        self.clamp(entries.iter_mut().map(|(_, e)| e));
        let changed: Vec<(Namespace, Fingerprint)> = entries
            .iter()
            .filter(|(ns, e)| {
                self.memory.get(*ns, &e.fingerprint()).is_none_or(|held| {
                    let mut merged = Entry::clone(&held);
                    merged.merge(e.clone());
                    merged != *held
                })
            })
            .map(|(ns, e)| (*ns, e.fingerprint()))
            .collect();
        self.memory.merge_many(entries);
        if !changed.is_empty() && lock(&self.diag).mode == Mode::Persistent {
            let mut st = lock(&self.state);
            st.dirty.extend(changed.iter().copied());
            self.mark_dirty(&mut st);
        }
        changed.len()
    }

    /// Offers keys recorded here to the tiers that write.
    #[inline]
    pub(super) fn offer(&self, keys: &[(Namespace, Fingerprint)]) {
        for tier in &self.offered {
            tier.offer(keys);
        }
    }
}

/// The entry, copied only if another reference to it is alive.
fn unwrap_or_clone(e: Arc<Entry>) -> Entry {
    Arc::try_unwrap(e).unwrap_or_else(|shared| Entry::clone(&shared))
}
