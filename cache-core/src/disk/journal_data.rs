//! A table's journal as lookups read it: the entries of its records since the last fold,
//! merged, in two parts shared with the views that read them.
//!
//! A save appends one record, and lookups must then see it. Kept as one merged map shared
//! with the views, every save copied the whole map to add its record: a cost that grows with
//! the journal (up to its 256 KiB bound), which made a record + flush on a journal of 250
//! entries of nine candidates cost 580 µs where the append and its `fdatasync` take 150. So
//! the entries sit in an older part and a newer one: a record is merged into a copy of the
//! newer part alone, and the newer part is moved into the older once it holds more than about
//! the square root of the older part's entries. A save then copies O(√n) entries amortised,
//! and a lookup probes two maps. The merge rule is a join (commutative and associative), so an
//! entry held in both parts is the two merged, whichever came first.

use std::borrow::Cow;
use std::sync::Arc;

use cache_format::{CacheData, Entry, Fingerprint, Scope};

/// The newer part moves into the older once it holds more than this many entries, or the
/// square root of the older part's entries, whichever is more.
const NEWER_AT_LEAST: usize = 16;

/// The journal's entries (see the module docs). Cloning shares both parts.
#[derive(Debug, Clone, Default)]
pub(crate) struct JournalData {
    older: Arc<CacheData>,
    newer: Arc<CacheData>,
}

impl JournalData {
    /// Whether it holds no entry.
    pub(crate) fn is_empty(&self) -> bool {
        self.older.is_empty() && self.newer.is_empty()
    }

    /// This journal with `data` merged in: a copy of the newer part, and of the older one
    /// only when the newer part is moved into it ([`moves_newer`]).
    pub(crate) fn with(&self, data: CacheData) -> JournalData {
        let mut newer = CacheData::clone(&self.newer);
        newer.merge(data);
        if moves_newer(newer.len(), self.older.len()) {
            let mut older = CacheData::clone(&self.older);
            older.merge(newer);
            JournalData {
                older: Arc::new(older),
                newer: Arc::default(),
            }
        } else {
            JournalData {
                older: Arc::clone(&self.older),
                newer: Arc::new(newer),
            }
        }
    }

    /// The entry of `fp` in namespace `ns` of `scope`: the two parts' merged when both hold
    /// it.
    pub(crate) fn get(&self, scope: &Scope, ns: &str, fp: &Fingerprint) -> Option<Cow<'_, Entry>> {
        match (self.older.get(scope, ns, fp), self.newer.get(scope, ns, fp)) {
            (Some(old), Some(new)) => {
                let mut merged = old.clone();
                merged.merge_from(new);
                Some(Cow::Owned(merged))
            }
            (Some(e), None) | (None, Some(e)) => Some(Cow::Borrowed(e)),
            (None, None) => None,
        }
    }

    /// Both parts, older first: a walk over them meets an entry held in both twice, and must
    /// merge the two (or take [`JournalData::get`] the first time it meets the key).
    pub(crate) fn parts(&self) -> [&CacheData; 2] {
        [&self.older, &self.newer]
    }

    /// Every entry, the parts merged into one map (a copy: for folds and rewrites, which
    /// read them all).
    pub(crate) fn to_data(&self) -> CacheData {
        let mut all = CacheData::clone(&self.older);
        all.merge(CacheData::clone(&self.newer));
        all
    }
}

/// Whether a newer part of `newer` entries moves into an older one of `older` entries.
fn moves_newer(newer: usize, older: usize) -> bool {
    newer > NEWER_AT_LEAST.max(older.isqrt())
}

#[cfg(test)]
mod tests {
    use cache_format::{Candidate, Fields, Key, Origin, Stats, Value};

    use super::*;

    fn entry(m: i64, algo: &str, median: f64) -> Entry {
        let stats = Stats {
            median_ns: median,
            min_ns: median,
            spread_ns: 0.0,
            samples: 3,
        };
        Entry::new(
            Key::new(Fields::from([("m".to_owned(), Value::Int(m))])),
            Fingerprint::default(),
            Origin::Measured("t".into()),
            1,
            [Candidate::measured(algo, Fields::new(), stats)],
        )
    }

    fn one(m: i64, algo: &str, median: f64) -> CacheData {
        let mut d = CacheData::new();
        d.insert(&Scope::default(), "ns", entry(m, algo, median));
        d
    }

    #[test]
    fn the_newer_part_moves_past_sixteen_or_the_square_root_of_the_older() {
        assert!(!moves_newer(16, 0));
        assert!(moves_newer(17, 0));
        assert!(!moves_newer(17, 289) && moves_newer(18, 289));
        assert!(!moves_newer(18, 324) && moves_newer(19, 324));
        assert!(!moves_newer(100, 10_000) && moves_newer(101, 10_000));
    }

    /// Against a model (one map every record is merged into): after every record, the same
    /// entry for every key, whichever part holds it, and the same entries when merged whole.
    #[test]
    fn it_reads_as_one_map_every_record_was_merged_into() {
        let mut journal = JournalData::default();
        let mut model = CacheData::new();
        let mut moved = 0;
        for i in 0..2_000i64 {
            // Keys come back (updates land in either part) and new ones keep coming.
            let m = (i * 7919) % 300;
            let record = one(m, &format!("a{}", i % 5), 100.0 + (i % 13) as f64);
            model.merge(record.clone());
            let before = journal.newer.len();
            journal = journal.with(record);
            if journal.newer.len() < before {
                moved += 1;
            }
            let fp = entry(m, "x", 1.0).fingerprint();
            assert_eq!(
                journal.get(&Scope::default(), "ns", &fp).as_deref(),
                model.get(&Scope::default(), "ns", &fp),
                "record {i}"
            );
        }
        assert!(moved > 10, "the newer part moved {moved} times");
        assert!(!journal.newer.is_empty() || !journal.older.is_empty());
        assert_eq!(journal.to_data(), model);
        let absent = entry(100_000, "x", 1.0).fingerprint();
        assert!(journal.get(&Scope::default(), "ns", &absent).is_none());
        assert!(JournalData::default().is_empty() && !journal.is_empty());
    }

    /// A view keeps the parts it was given: a later record changes neither.
    #[test]
    fn a_record_never_changes_what_an_earlier_view_reads() {
        let a = JournalData::default().with(one(1, "a", 10.0));
        let b = a.with(one(1, "b", 5.0));
        let fp = entry(1, "x", 1.0).fingerprint();
        let seen = |j: &JournalData| {
            j.get(&Scope::default(), "ns", &fp)
                .map(|e| e.candidates().len())
        };
        assert_eq!(seen(&a), Some(1));
        assert_eq!(seen(&b), Some(2));
    }
}
