//! Prediction on a miss: the current candidates of an unseen key ranked from the tuned keys of
//! the same namespace and scope. Pure: no I/O, no clock.
//!
//! The neighbours of a key are the tuned keys with the same fields and equal text values
//! (categorical fields match exactly); sizes are compared on a log scale, a differing flag
//! adds 1 (`FLAG_DISTANCE`), and a field that restates other sizes in most tuned keys (a
//! stride) is not counted again (the key distance, `distance.rs`); among neighbours at the
//! same distance the smaller problem comes first (the prefer-lower rule of vLLM's and Helion's
//! config lookup). The `k` nearest vote: each gives every candidate it measured its slowdown
//! against its own best, ln(median / best median) (a failure counts as a slowdown of
//! `FAILED_SLOWDOWN`), weighted by 1 / (distance + `SMOOTHING`); a candidate's score is
//! its weighted mean slowdown over the neighbours that measured it, and candidates are ranked
//! by score, unmeasured ones last in their given order. With `k = 1` this is the
//! nearest key's ranking.

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use cache_core::cache_format::{CandidateId, Entry, Fields, Key, Outcome};

mod adapt;
mod distance;
pub(crate) mod early_stop;
mod evaluate;
mod folds;
mod index;
pub(crate) mod new_device;
mod query;
mod select;
mod static_list;

use distance::Restated;
pub use evaluate::{Evaluation, MethodScore, Methods, evaluate};
pub use folds::{CrossValidation, cross_validate, few_tuned, few_tuned_with, from_tuned, transfer};
pub use index::KeyIndex;
pub use query::{Query, TunedKeys, Voters};
use select::{Near, Selection, nearest};

/// How many tuned keys vote, by default.
pub const DEFAULT_NEIGHBOURS: usize = 4;

/// The slowdown a neighbour's failed candidate counts as (its own best times four).
pub(crate) const FAILED_SLOWDOWN: f64 = 4.0;

/// How many of a top-k set are picked for diversity ([`Prediction::top`]).
pub(crate) const DIVERSE_PICKS: usize = 3;

/// How many params a diverse pick differs in from each earlier one, at least.
pub(crate) const DIVERSE_PARAMS: usize = 2;

/// Added to a neighbour's distance before weighting, so an exact match does not silence the
/// others completely.
pub(crate) const SMOOTHING: f64 = 0.25;

/// The distance at which another scope's entry for the same key (another device's results for
/// this very problem) votes beside this scope's nearest tuned keys
/// ([`Voters::Scope`]). Chosen on the AutoHeuristic A100/H100 data from 0, 0.5, 1
/// and 2: with 10% to 90% of the H100's keys tuned, each beat this scope's keys alone (by 2.5
/// points at 10%, 0.3 at 90% on TIMM shapes); 0.5 was best or within 0.1 of it throughout.
pub(crate) const ELSEWHERE_DISTANCE: f64 = 0.5;

/// What a prediction is made from and how.
#[derive(Debug, Clone)]
pub struct Predictor {
    /// How many tuned keys vote.
    pub neighbours: usize,
}

impl Default for Predictor {
    fn default() -> Self {
        Predictor {
            neighbours: DEFAULT_NEIGHBOURS,
        }
    }
}

/// A tuned key that voted.
#[derive(Debug, Clone, PartialEq)]
pub struct Neighbour {
    /// Its key.
    pub key: Key,
    /// Its distance to the predicted key.
    pub distance: f64,
    /// Its winner among the current candidates.
    pub winner: Option<CandidateId>,
    /// Another scope's entry for the same key (another device's), voting beside this scope's
    /// keys at distance 0.5 ([`Voters::Scope`]).
    pub elsewhere: bool,
}

/// The predicted ranking of a key's current candidates.
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    /// Every current candidate, predicted best first, with its predicted slowdown against the
    /// predicted best (1.0 for the first; `None` for a candidate no neighbour measured).
    pub ranking: Vec<(CandidateId, Option<f64>)>,
    /// The tuned keys that voted, nearest first.
    pub neighbours: Vec<Neighbour>,
    /// Made from other scopes' results ([`Voters::Devices`]: another device's), not
    /// this scope's tuned keys.
    pub transferred: bool,
    /// The key's fields the distance counted only where a key gave them a size of their own:
    /// strides and the like, which restate the other sizes in most tuned keys (learnt from them, `distance.rs`).
    pub uncounted: Vec<String>,
}

impl Prediction {
    /// The predicted winner.
    pub fn winner(&self) -> &CandidateId {
        &self.ranking[0].0
    }

    /// The `n` candidates to measure: the first `DIVERSE_PICKS` as a diverse set (each the
    /// best ranked that differs from those already picked in its algorithm or in at least
    /// `DIVERSE_PARAMS` params, while there is one), the rest in ranking order. Near
    /// neighbours in a config space tend to win and lose together, so a second pick unlike the
    /// first covers the case where the prediction was wrong: on Inductor's published mm
    /// timings this took top-3 from 98.3% to 98.7% of the optimum for an H100 predicted from
    /// an A100 alone, and changed top-5 by at most 0.03 points (docs/rust.md).
    pub fn top(&self, n: usize) -> Vec<CandidateId> {
        let unlike = |a: &CandidateId, b: &CandidateId| {
            a.algorithm != b.algorithm
                || a.params
                    .iter()
                    .filter(|(k, v)| b.params.get(k) != Some(*v))
                    .count()
                    >= DIVERSE_PARAMS
        };
        // Never more than the ranking holds, whatever `n` asks (a huge `n` is "all").
        let mut picked: Vec<CandidateId> = Vec::with_capacity(n.min(self.ranking.len()));
        for (c, _) in &self.ranking {
            if picked.len() >= n.min(DIVERSE_PICKS) {
                break;
            }
            if picked.iter().all(|p| unlike(p, c)) {
                picked.push(c.clone());
            }
        }
        for (c, _) in &self.ranking {
            if picked.len() >= n {
                break;
            }
            if !picked.contains(c) {
                picked.push(c.clone());
            }
        }
        picked
    }

    /// One line for messages: the winner and the neighbours that voted.
    pub fn describe(&self) -> String {
        let near: Vec<String> = self
            .neighbours
            .iter()
            .map(|n| format!("{} (distance {:.2})", n.key, n.distance))
            .collect();
        let how = if self.transferred {
            "transferred from other devices' results for"
        } else {
            "predicted"
        };
        let mut line = format!("{how} {} from {}", self.winner(), near.join(", "));
        if !self.uncounted.is_empty() {
            line.push_str(&format!(
                " (not counted where they restate other sizes: {})",
                self.uncounted.join(", ")
            ));
        }
        line
    }
}

impl Predictor {
    /// A prediction from other scopes' `tuned` entries ([`Voters::Devices`]).
    fn across<'a>(
        &self,
        target: &Fields,
        tuned: impl IntoIterator<Item = &'a Entry>,
        current: &[CandidateId],
        measured: &[(CandidateId, f64)],
    ) -> Option<Prediction> {
        self.rank(target, tuned, current, false, measured, None)
    }

    /// A prediction from this scope's `tuned` entries walked one by one and the same key's
    /// `elsewhere` ([`Voters::Scope`] with [`TunedKeys::Entries`]), with the restating fields
    /// learnt beforehand when given (an evaluation walks the same tuned keys for every
    /// held-out key).
    fn walk_beside<'a>(
        &self,
        target: &Fields,
        tuned: impl IntoIterator<Item = &'a Entry>,
        elsewhere: impl IntoIterator<Item = &'a Entry>,
        current: &[CandidateId],
        learnt: Option<&Restated>,
    ) -> Option<Prediction> {
        if current.is_empty() {
            return None;
        }
        let set = Current::new(current);
        let (near, restated) = nearest(target, tuned, &set, self.neighbours, true, learnt);
        self.beside(near, elsewhere, current, &set, &restated)
    }

    /// A prediction from an index of this scope's tuned keys, `fresher` ones and the same
    /// key's `elsewhere` ([`Voters::Scope`] with [`TunedKeys::Indexed`]).
    fn indexed_beside<'a>(
        &self,
        target: &Fields,
        index: &'a KeyIndex,
        fresher: &'a [Arc<Entry>],
        elsewhere: impl IntoIterator<Item = &'a Entry>,
        current: &[CandidateId],
    ) -> Option<Prediction> {
        if current.is_empty() {
            return None;
        }
        let set = Current::new(current);
        let near = self.select_indexed(target, index, fresher, &set);
        self.beside(near, elsewhere, current, &set, index.restated())
    }

    /// This scope's nearest keys `near` and the other scopes' `elsewhere` voting together.
    fn beside<'a>(
        &self,
        mut near: Vec<Near<'a>>,
        elsewhere: impl IntoIterator<Item = &'a Entry>,
        ids: &[CandidateId],
        current: &Current<'_>,
        restated: &Restated,
    ) -> Option<Prediction> {
        if near.is_empty() {
            return None;
        }
        let own = near.len();
        near.extend(
            elsewhere
                .into_iter()
                .filter(|e| measured_best(e, current).is_some())
                .map(|e| (ELSEWHERE_DISTANCE, 0.0, e.fingerprint(), e)),
        );
        let mut p = self.ranked(near, ids, current, true, &[], restated)?;
        for n in &mut p.neighbours[own..] {
            n.elsewhere = true;
        }
        // Nearest first, as everywhere (stable: this scope's key first at an equal distance).
        p.neighbours
            .sort_by(|a, b| a.distance.total_cmp(&b.distance));
        Some(p)
    }

    /// The `k` nearest of `index` and `fresher` (see [`TunedKeys::Indexed`]).
    fn select_indexed<'a>(
        &self,
        target: &Fields,
        index: &'a KeyIndex,
        fresher: &'a [Arc<Entry>],
        set: &Current<'_>,
    ) -> Vec<Near<'a>> {
        let mut selection = Selection::new(target, set, index.restated(), self.neighbours, true);
        for e in fresher {
            selection.offer(e);
        }
        let skip: HashSet<_> = fresher.iter().map(|e| e.fingerprint()).collect();
        index.select(target, &mut selection, &skip);
        selection.finish()
    }

    /// The ranking a walk of `tuned` gives, with the restating fields learnt beforehand when
    /// given (see [`Predictor::walk_beside`]).
    fn rank<'a>(
        &self,
        target: &Fields,
        tuned: impl IntoIterator<Item = &'a Entry>,
        current: &[CandidateId],
        skip_own: bool,
        measured: &[(CandidateId, f64)],
        learnt: Option<&Restated>,
    ) -> Option<Prediction> {
        if current.is_empty() {
            return None;
        }
        let set = Current::new(current);
        let (near, restated) = nearest(target, tuned, &set, self.neighbours, skip_own, learnt);
        self.ranked(near, current, &set, skip_own, measured, &restated)
    }

    /// The ranking the selected keys `near` vote for.
    fn ranked(
        &self,
        near: Vec<Near<'_>>,
        ids: &[CandidateId],
        current: &Current<'_>,
        skip_own: bool,
        measured: &[(CandidateId, f64)],
        restated: &Restated,
    ) -> Option<Prediction> {
        if near.is_empty() {
            return None;
        }
        // Voters from other scopes that contradict each other, with nothing measured here to
        // tell which to follow, predict nothing (see `adapt::consensus`).
        if !skip_own
            && !adapt::measured_enough(measured)
            && adapt::consensus(&near, current).is_some_and(|c| c <= 0.0)
        {
            return None;
        }
        let agreement = adapt::agreement(&near, current, measured);
        let scores = scores(&near, current, &agreement);
        let mut order: Vec<usize> = (0..ids.len()).collect();
        order.sort_by(|&a, &b| match (scores[a], scores[b]) {
            (Some(x), Some(y)) => x.total_cmp(&y).then(a.cmp(&b)),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => a.cmp(&b),
        });
        let best = order.first().and_then(|&i| scores[i]).unwrap_or(0.0);
        let ranking = order
            .into_iter()
            .map(|i| (ids[i].clone(), scores[i].map(|s| (s - best).exp())))
            .collect();
        let neighbours = near
            .iter()
            .map(|(d, _, _, e)| Neighbour {
                key: e.key().clone(),
                distance: *d,
                winner: measured_best(e, current).map(|(id, _)| id.clone()),
                elsewhere: false,
            })
            .collect();
        Some(Prediction {
            ranking,
            neighbours,
            transferred: !skip_own,
            uncounted: restated.names().to_vec(),
        })
    }
}

/// The current candidates, with a set to look them up in when there are many (a Kernel Tuner
/// space has thousands: a linear search per candidate made a prediction quadratic).
struct Current<'c> {
    ids: &'c [CandidateId],
    set: Option<HashSet<&'c CandidateId>>,
}

impl<'c> Current<'c> {
    fn new(ids: &'c [CandidateId]) -> Self {
        let set = (ids.len() > 16).then(|| ids.iter().collect());
        Current { ids, set }
    }

    fn contains(&self, id: &CandidateId) -> bool {
        match &self.set {
            Some(set) => set.contains(id),
            None => self.ids.contains(id),
        }
    }
}

/// The fastest measured current candidate of `entry` and its median.
fn measured_best<'e>(entry: &'e Entry, current: &Current<'_>) -> Option<(&'e CandidateId, f64)> {
    entry
        .candidates()
        .iter()
        .filter(|c| current.contains(&c.id))
        .filter_map(|c| Some((&c.id, c.stats()?.median_ns)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
}

/// Each current candidate's weighted mean log slowdown over the neighbours that measured it
/// (or saw it fail), in `current`'s order; one pass over each neighbour's candidates.
fn scores(near: &[Near<'_>], current: &Current<'_>, agreement: &[f64]) -> Vec<Option<f64>> {
    let index: HashMap<&CandidateId, usize> = current
        .ids
        .iter()
        .enumerate()
        .map(|(i, c)| (c, i))
        .collect();
    let mut acc = vec![(0.0f64, 0.0f64); current.ids.len()];
    for (j, (d, _, _, entry)) in near.iter().enumerate() {
        let Some((_, best)) = measured_best(entry, current) else {
            continue;
        };
        let w = agreement.get(j).copied().unwrap_or(1.0) / (d + SMOOTHING);
        for c in entry.candidates() {
            let Some(&i) = index.get(&c.id) else {
                continue;
            };
            let slowdown = match (&c.outcome, c.stats()) {
                (Outcome::Failed(_), _) => FAILED_SLOWDOWN.ln(),
                (_, Some(s)) if best > 0.0 => (s.median_ns / best).max(1.0).ln(),
                _ => continue,
            };
            acc[i].0 += w * slowdown;
            acc[i].1 += w;
        }
    }
    acc.into_iter()
        .map(|(sum, weight)| (weight > 0.0).then(|| sum / weight))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_top_set_starts_diverse_and_then_follows_the_ranking() {
        let id =
            |m: i64, n: i64, w: i64| CandidateId::new("triton", &[("m", m), ("n", n), ("w", w)]);
        let ranking = vec![
            (id(64, 64, 4), Some(1.0)),
            (id(64, 64, 8), Some(1.01)),
            (id(64, 128, 8), Some(1.02)),
            (id(128, 128, 4), Some(1.03)),
            (CandidateId::new("extern_mm", &[]), Some(1.2)),
            (id(16, 16, 2), Some(1.5)),
        ];
        let p = Prediction {
            ranking,
            neighbours: Vec::new(),
            transferred: false,
            uncounted: Vec::new(),
        };
        // The second and third differ from the first by one param: skipped for the third
        // and the fourth-ranked algorithm, then the ranking resumes.
        assert_eq!(
            p.top(3),
            vec![id(64, 64, 4), id(64, 128, 8), id(128, 128, 4)]
        );
        assert_eq!(p.top(1), vec![id(64, 64, 4)]);
        assert_eq!(
            p.top(5),
            vec![
                id(64, 64, 4),
                id(64, 128, 8),
                id(128, 128, 4),
                id(64, 64, 8),
                CandidateId::new("extern_mm", &[])
            ]
        );
        assert_eq!(p.top(10).len(), 6, "never more than there are");
        assert_eq!(p.top(usize::MAX).len(), 6, "a huge k is all, not an abort");
    }
}
