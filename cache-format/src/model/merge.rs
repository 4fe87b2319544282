//! The one merge rule (FORMAT.md, "Merging"): how two entries for the same key become one,
//! wherever entries meet (memory, journal replay, a fold, an import).

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use super::Entry;
use crate::candidate::{Candidate, CandidateId, rank_indices};

/// The most candidates one entry holds (FORMAT.md, "Bounds"): what every reader accepts, and
/// what a merge keeps (the winner and the most recently measured).
pub(crate) const MAX_CANDIDATES: usize = 1 << 16;

impl Entry {
    /// Adds or replaces one candidate's measurement and re-ranks (keeping at most 65,536, the
    /// format's bound, as [`Entry::merge`] does).
    pub fn record(&mut self, candidate: Candidate) {
        self.absorb_all([Arc::new(candidate)]);
        self.rank();
        self.cap();
    }

    /// A merge that unites more than `MAX_CANDIDATES` keeps the winner and the most recently
    /// measured of the others (FORMAT.md, "Merging"): every reader accepts what a merge makes,
    /// so no write of a merged entry is ever refused. What goes is the oldest news: a failure
    /// or a slower re-measurement just recorded stays, so an older copy's faster version of
    /// the same candidate cannot come back as the winner.
    fn cap(&mut self) {
        let n = self.candidates.len();
        if n <= MAX_CANDIDATES {
            return;
        }
        // Ranked: index 0 is the winner; among the others, the later measured first, then by
        // rank (a total order, so the same union keeps the same candidates everywhere).
        let mut others: Vec<usize> = (1..n).collect();
        others.sort_by(|&a, &b| {
            let (ca, cb) = (&self.candidates[a], &self.candidates[b]);
            cb.measured_at.cmp(&ca.measured_at).then(a.cmp(&b))
        });
        let mut keep = vec![false; n];
        keep[0] = true;
        for &i in &others[..MAX_CANDIDATES - 1] {
            keep[i] = true;
        }
        let mut at = 0;
        self.candidates.retain(|_| {
            at += 1;
            keep[at - 1]
        });
    }

    /// Unites `incoming` with the candidates by identity (a candidate measured twice keeps
    /// the later measurement). Linear in the number of candidates: past a handful, matching
    /// goes through a hash index instead of a scan, so a hostile entry of N candidates costs
    /// O(N), not O(N²).
    pub(super) fn absorb_all(&mut self, incoming: impl IntoIterator<Item = Arc<Candidate>>) {
        const SCAN_UP_TO: usize = 16;
        let mut index: Option<HashMap<CandidateId, usize>> = None;
        let incoming = incoming.into_iter();
        if self.candidates.is_empty() {
            // A new entry: one allocation of the right size (bounded, in case the hint lies).
            self.candidates
                .reserve_exact(incoming.size_hint().0.min(1 << 16));
        }
        for candidate in incoming {
            if index.is_none() && self.candidates.len() >= SCAN_UP_TO {
                index = Some(
                    self.candidates
                        .iter()
                        .enumerate()
                        .map(|(i, c)| (c.id.clone(), i))
                        .collect(),
                );
            }
            let found = match &index {
                Some(index) => {
                    #[cfg(test)]
                    probes::add(1);
                    index.get(&candidate.id).copied()
                }
                None => {
                    #[cfg(test)]
                    probes::add(self.candidates.len() as u64);
                    self.candidates.iter().position(|c| c.id == candidate.id)
                }
            };
            match found {
                Some(i) => {
                    if candidate.version_cmp(&self.candidates[i]) == Ordering::Greater {
                        self.candidates[i] = candidate;
                    }
                }
                None => {
                    if let Some(index) = &mut index {
                        index.insert(candidate.id.clone(), self.candidates.len());
                    }
                    self.candidates.push(candidate);
                }
            }
        }
    }

    pub(super) fn rank(&mut self) {
        if self.candidates.len() < 2 {
            return;
        }
        let order: Vec<usize> = rank_indices(&self.candidates);
        if order.iter().enumerate().all(|(at, i)| at == *i) {
            // Already in rank order (an entry read back from a file always is).
            return;
        }
        let mut slots: Vec<Option<Arc<Candidate>>> = std::mem::take(&mut self.candidates)
            .into_iter()
            .map(Some)
            .collect();
        self.candidates = order
            .into_iter()
            .map(|i| slots[i].take().expect("rank_indices is a permutation"))
            .collect();
    }

    fn header_cmp(&self, other: &Entry) -> Ordering {
        self.recorded_at
            .cmp(&other.recorded_at)
            .then_with(|| self.candidate_set.cmp(&other.candidate_set))
            .then_with(|| self.origin.cmp(&other.origin))
    }

    /// Merges another entry for the same key into this one.
    ///
    /// This is the one merge rule used everywhere (memory, journal replay, merge-on-save,
    /// import): candidates are united by identity, a candidate measured twice keeps the later
    /// measurement, and the entry's candidate-set checksum, timestamp and origin come from
    /// the later entry. Ties are broken by comparing every field, so the result does not
    /// depend on the order merges happen in (it is commutative, associative and idempotent).
    /// A union of more than 65,536 candidates (the format's bound on one entry) keeps the
    /// winner and the most recently measured of the rest; only there can which ones depend on
    /// the order of merges (a candidate dropped before another version of it arrives).
    pub fn merge(&mut self, other: Entry) {
        debug_assert_eq!(self.key, other.key, "merging entries of different keys");
        if other.header_cmp(self) == Ordering::Greater {
            self.candidate_set = other.candidate_set;
            self.recorded_at = other.recorded_at;
            self.origin = other.origin;
        }
        self.absorb_all(other.candidates);
        self.rank();
        self.cap();
    }

    /// How many candidates merging `other` into this entry drops at the bound on one entry
    /// (65,536; those measured longest ago go, see [`Entry::merge`]): 0 below it. What a
    /// writer says when a merge loses candidates.
    pub fn dropped_by_merging(&self, other: &Entry) -> usize {
        if self.candidates.len() + other.candidates.len() <= MAX_CANDIDATES {
            return 0;
        }
        let held: std::collections::HashSet<&CandidateId> =
            self.candidates.iter().map(|c| &c.id).collect();
        let united = self.candidates.len()
            + other
                .candidates
                .iter()
                .filter(|c| !held.contains(&c.id))
                .count();
        united.saturating_sub(MAX_CANDIDATES)
    }

    /// Whether this entry already holds everything of `other`: merging `other` into it
    /// changes nothing (what a writer checks before writing `other` again).
    pub fn covers(&self, other: &Entry) -> bool {
        let mut merged = self.clone();
        merged.merge_from(other);
        merged == *self
    }

    /// [`Entry::merge`] of a borrowed entry: the same result as `self.merge(other.clone())`,
    /// copying only what of `other` wins (its header when later, the candidates this entry
    /// lacks or measured earlier). Merging an update into the entry a store holds this way
    /// round copies nothing when the update is the later measurement of every candidate.
    pub fn merge_from(&mut self, other: &Entry) {
        debug_assert_eq!(self.key, other.key, "merging entries of different keys");
        if other.header_cmp(self) == Ordering::Greater {
            self.candidate_set = other.candidate_set;
            self.recorded_at = other.recorded_at;
            self.origin = other.origin.clone();
        }
        let wins = |c: &Candidate, mine: Option<&Candidate>| {
            mine.is_none_or(|m| c.version_cmp(m) == Ordering::Greater)
        };
        // Past a handful, matching goes through an index, as in `absorb_all`.
        let winners: Vec<Arc<Candidate>> = if self.candidates.len() < 16 {
            other
                .candidates
                .iter()
                .filter(|c| {
                    wins(
                        c,
                        self.candidates.iter().find(|m| m.id == c.id).map(|m| &**m),
                    )
                })
                .cloned()
                .collect()
        } else {
            let index: HashMap<&CandidateId, &Candidate> =
                self.candidates.iter().map(|c| (&c.id, &**c)).collect();
            other
                .candidates
                .iter()
                .filter(|c| wins(c, index.get(&c.id).copied()))
                .cloned()
                .collect()
        };
        if !winners.is_empty() {
            self.absorb_all(winners);
            self.rank();
            self.cap();
        }
    }
}

/// Counts identity comparisons in tests, to check that matching stays linear.
#[cfg(test)]
mod probes {
    use std::cell::Cell;

    thread_local! {
        static PROBES: Cell<u64> = const { Cell::new(0) };
    }

    pub(crate) fn add(n: u64) {
        PROBES.with(|p| p.set(p.get() + n));
    }

    pub(crate) fn take() -> u64 {
        PROBES.with(|p| p.replace(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::candidate::Stats;
    use crate::model::{Fingerprint, Key, Origin};
    use crate::value::{Fields, Value};

    fn many(n: u64, offset: u64) -> Vec<Candidate> {
        (0..n)
            .map(|i| {
                let params = Fields::from([("i".to_owned(), Value::Int((i + offset) as i64))]);
                let stats = Stats {
                    median_ns: 1.0 + i as f64,
                    min_ns: 1.0,
                    spread_ns: 0.0,
                    samples: 1,
                };
                Candidate::measured("a", params, stats)
            })
            .collect()
    }

    #[test]
    fn matching_candidates_is_linear_in_their_number() {
        let key = Key::new(Fields::new());
        for n in [1_000u64, 10_000] {
            probes::take();
            let mut entry = Entry::new(
                key.clone(),
                Fingerprint::default(),
                Origin::Imported("t".into()),
                1,
                many(n, 0),
            );
            let other = Entry::new(
                key.clone(),
                Fingerprint::default(),
                Origin::Imported("t".into()),
                2,
                many(n, n / 2),
            );
            entry.merge(other);
            assert_eq!(entry.candidates().len() as u64, n + n / 2);
            let probes = probes::take();
            // A scan per candidate made ~n²/2 comparisons (5·10⁷ at n = 10,000).
            assert!(
                probes <= 4 * n + 1_000,
                "{probes} comparisons for {n} candidates"
            );
        }
    }
}
