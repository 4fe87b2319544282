//! The tuned keys a prediction is made from, kept as an index ([`KeyIndex`]) per operation,
//! so a miss among 100k tuned keys costs a search of the index, not a walk of the namespace.
//!
//! The index is made from a walk of the namespace and stamped with [`Cache::changes`] as read
//! before the walk. It is made again on a miss once the stamp moved: at once while it holds
//! fewer than [`FRESH_BELOW`] keys (a walk is cheap then, and the prediction sees every key,
//! as a walk on every miss did), else at most every [`REBUILD_EVERY`]. Between rebuilds what
//! this operation records itself is kept beside the index (`fresher`) and votes in place of
//! the index's version of the same key, so only other processes' new results can wait, at
//! most [`REBUILD_EVERY`], to be seen. One thread rebuilds while the others go on with the
//! index they have. No lock is held during the walk or a prediction.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cache_core::Cache;
use cache_core::cache_format::{Entry, Key};
use cache_core::{Namespace, Store};

use crate::predict::KeyIndex;

/// Below this many keys the index is made again on any change.
pub(crate) const FRESH_BELOW: usize = 4096;

/// At or above [`FRESH_BELOW`] keys, the index is made again at most this often.
pub(crate) const REBUILD_EVERY: Duration = Duration::from_secs(1);

/// What the rebuild decision looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Built {
    /// [`Cache::changes`] when the index was made.
    pub(crate) stamp: u64,
    /// Its age.
    pub(crate) age: Duration,
    /// How many keys it holds.
    pub(crate) keys: usize,
}

/// Whether a miss should make the index again (pure: see the module docs). `building`:
/// another thread is making one now.
pub(crate) fn rebuild_due(built: Option<Built>, stamp: u64, building: bool) -> bool {
    match built {
        None => true,
        Some(b) if b.stamp == stamp => false,
        Some(_) if building => false,
        Some(b) if b.keys < FRESH_BELOW => true,
        Some(b) => b.age >= REBUILD_EVERY,
    }
}

/// One operation's index and what it was made from.
#[derive(Debug, Default)]
pub(crate) struct Neighbours {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    index: Option<(Arc<KeyIndex>, u64, Instant)>,
    /// Entries this operation recorded since the index was made (as stored, merged).
    fresher: Vec<Arc<Entry>>,
    building: bool,
}

impl Neighbours {
    /// The index to predict from and the entries recorded since it was made, made again
    /// first if due.
    pub(crate) fn current(&self, cache: &Cache, ns: Namespace) -> (Arc<KeyIndex>, Vec<Arc<Entry>>) {
        let stamp = cache.changes();
        {
            let mut st = self.lock();
            let built = st.index.as_ref().map(|(index, stamp, at)| Built {
                stamp: *stamp,
                age: at.elapsed(),
                keys: index.len(),
            });
            match &st.index {
                Some((index, ..)) if !rebuild_due(built, stamp, st.building) => {
                    return (Arc::clone(index), st.fresher.clone());
                }
                _ => st.building = true,
            }
        }
        let entries = cache.entries_of(ns);
        let index = Arc::new(KeyIndex::new(entries.into_iter().map(|(_, e)| e)));
        let mut st = self.lock();
        st.building = false;
        st.fresher.clear();
        st.index = Some((Arc::clone(&index), stamp, Instant::now()));
        (index, Vec::new())
    }

    /// Notes what was just recorded for `key` (its stored entry, `cache.lookup` after the
    /// put), while an index exists.
    pub(crate) fn recorded(&self, cache: &Cache, ns: Namespace, key: &Key) {
        if self.lock().index.is_none() {
            return;
        }
        if let Some(stored) = cache.lookup(ns, key) {
            let mut st = self.lock();
            let fp = stored.fingerprint();
            st.fresher.retain(|e| e.fingerprint() != fp);
            st.fresher.push(stored);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every critical section leaves the state consistent: a poisoned lock is usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn built(stamp: u64, age_ms: u64, keys: usize) -> Option<Built> {
        Some(Built {
            stamp,
            age: Duration::from_millis(age_ms),
            keys,
        })
    }

    #[test]
    fn the_first_miss_makes_the_index() {
        assert!(rebuild_due(None, 0, false));
        assert!(
            rebuild_due(None, 7, true),
            "nothing to go on with meanwhile"
        );
    }

    #[test]
    fn an_index_nothing_changed_since_is_kept_at_any_age() {
        assert!(!rebuild_due(built(5, 0, 10), 5, false));
        assert!(!rebuild_due(built(5, 3_600_000, 1_000_000), 5, false));
    }

    #[test]
    fn a_small_index_is_made_again_on_any_change() {
        assert!(rebuild_due(built(5, 0, FRESH_BELOW - 1), 6, false));
    }

    #[test]
    fn a_large_index_is_made_again_at_most_every_period() {
        let keys = FRESH_BELOW;
        assert!(!rebuild_due(built(5, 999, keys), 6, false));
        assert!(rebuild_due(built(5, 1000, keys), 6, false));
    }

    #[test]
    fn while_another_thread_rebuilds_the_old_index_serves() {
        assert!(!rebuild_due(built(5, 0, 10), 6, true));
        assert!(!rebuild_due(built(5, 5000, FRESH_BELOW), 6, true));
    }
}
