//! Prediction on a miss: the current candidates of an unseen key ranked from the tuned keys of
//! the same namespace and scope. Pure: no I/O, no clock.
//!
//! The neighbours of a key are the tuned keys with the same fields and equal non-numeric values
//! (categorical fields match exactly); numeric fields are compared on a log scale (the key
//! distance of the tuner: the sum of |ln(a+1) − ln(b+1)| over integer fields), and among
//! neighbours at the same distance the smaller problem comes first (the prefer-lower rule of
//! vLLM's and Helion's config lookup). The `k` nearest vote: each gives every candidate it
//! measured its slowdown against its own best, ln(median / best median) (a failure counts as a
//! slowdown of [`FAILED_SLOWDOWN`]), weighted by 1 / (distance + [`SMOOTHING`]); a candidate's
//! score is its weighted mean slowdown over the neighbours that measured it, and candidates are
//! ranked by score, unmeasured ones last in their given order. With `k = 1` this is the
//! nearest key's ranking.

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};

use cache_core::cache_format::{CandidateId, Entry, Fields, Fingerprint, Key, Outcome, Value};

use crate::tuner::distance_within;

mod adapt;
mod evaluate;
mod folds;

pub use evaluate::{Evaluation, MethodScore, Methods, evaluate};
pub use folds::{CrossValidation, cross_validate, few_tuned, few_tuned_with, fold_of, transfer};

/// How many tuned keys vote, by default.
pub const DEFAULT_NEIGHBOURS: usize = 4;

/// The slowdown a neighbour's failed candidate counts as (its own best times four).
pub const FAILED_SLOWDOWN: f64 = 4.0;

/// How many of a top-k set are picked for diversity ([`Prediction::top`]).
pub const DIVERSE_PICKS: usize = 3;

/// How many params a diverse pick differs in from each earlier one, at least.
pub const DIVERSE_PARAMS: usize = 2;

/// Added to a neighbour's distance before weighting, so an exact match does not silence the
/// others completely.
pub const SMOOTHING: f64 = 0.25;

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
}

/// The predicted ranking of a key's current candidates.
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    /// Every current candidate, predicted best first, with its predicted slowdown against the
    /// predicted best (1.0 for the first; `None` for a candidate no neighbour measured).
    pub ranking: Vec<(CandidateId, Option<f64>)>,
    /// The tuned keys that voted, nearest first.
    pub neighbours: Vec<Neighbour>,
    /// Made from other scopes' results ([`Predictor::transfer`]: another device's), not
    /// this scope's tuned keys.
    pub transferred: bool,
}

impl Prediction {
    /// The predicted winner.
    pub fn winner(&self) -> &CandidateId {
        &self.ranking[0].0
    }

    /// The `n` candidates to measure: the first [`DIVERSE_PICKS`] as a diverse set (each the
    /// best ranked that differs from those already picked in its algorithm or in at least
    /// [`DIVERSE_PARAMS`] params, while there is one), the rest in ranking order. Near
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
        let mut picked: Vec<CandidateId> = Vec::with_capacity(n);
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
        format!("{how} {} from {}", self.winner(), near.join(", "))
    }
}

impl Predictor {
    /// The predicted ranking of `current` for the key `target` (its fields, bucketed), from
    /// `tuned` (entries of the same namespace and scope; `target`'s own entry, if among them,
    /// is left out). `None` when no tuned key is comparable, or `current` is empty.
    pub fn predict<'a>(
        &self,
        target: &Fields,
        tuned: impl IntoIterator<Item = &'a Entry>,
        current: &[CandidateId],
    ) -> Option<Prediction> {
        self.rank(target, tuned, current, true, &[])
    }

    /// The predicted ranking of `current` for `target` from `tuned` entries of *another*
    /// scope (another device, say): as [`Predictor::predict`], but an entry of the same key is
    /// the nearest neighbour there is (distance 0), not the target's own entry to leave out.
    pub fn transfer<'a>(
        &self,
        target: &Fields,
        tuned: impl IntoIterator<Item = &'a Entry>,
        current: &[CandidateId],
    ) -> Option<Prediction> {
        self.rank(target, tuned, current, false, &[])
    }

    /// [`Predictor::transfer`] once some candidates were measured on the target
    /// (`measured`: candidate and median): each tuned key votes in proportion to how well its
    /// ranking of those candidates agrees with the target's (see `adapt.rs`), so the devices
    /// that behave like this one lead. With fewer than three measured, as `transfer`.
    pub fn transfer_measured<'a>(
        &self,
        target: &Fields,
        tuned: impl IntoIterator<Item = &'a Entry>,
        current: &[CandidateId],
        measured: &[(CandidateId, f64)],
    ) -> Option<Prediction> {
        self.rank(target, tuned, current, false, measured)
    }

    fn rank<'a>(
        &self,
        target: &Fields,
        tuned: impl IntoIterator<Item = &'a Entry>,
        current: &[CandidateId],
        skip_own: bool,
        measured: &[(CandidateId, f64)],
    ) -> Option<Prediction> {
        if current.is_empty() {
            return None;
        }
        let ids = current;
        let current = Current::new(ids);
        let near = nearest(target, tuned, &current, self.neighbours.max(1), skip_own);
        if near.is_empty() {
            return None;
        }
        let agreement = adapt::agreement(&near, &current, measured);
        let scores = scores(&near, &current, &agreement);
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
                winner: measured_best(e, &current).map(|(id, _)| id.clone()),
            })
            .collect();
        Some(Prediction {
            ranking,
            neighbours,
            transferred: !skip_own,
        })
    }
}

/// A tuned key as the selection orders it: distance, then the smaller problem, then the
/// fingerprint.
type Near<'a> = (f64, f64, Fingerprint, &'a Entry);

/// A distance rounded to 1e-9: sums of logarithms that are equal in exact arithmetic (sizes
/// mirrored around the target on the log scale) can differ in their last bits, and the
/// prefer-lower rule must see them as the tie they are.
fn quantized(d: f64) -> f64 {
    (d * 1e9).round() / 1e9
}

fn near_cmp(a: &Near<'_>, b: &Near<'_>) -> Ordering {
    a.0.total_cmp(&b.0)
        .then(a.1.total_cmp(&b.1))
        .then(a.2.cmp(&b.2))
}

/// The `k` nearest tuned keys with a measured current candidate, nearest first, in one pass
/// that keeps only the `k` best so far: a key farther than the k-th is dismissed on its
/// distance alone, so a million tuned keys cost a million distances, not a sort.
fn nearest<'a>(
    target: &Fields,
    tuned: impl IntoIterator<Item = &'a Entry>,
    current: &Current<'_>,
    k: usize,
    skip_own: bool,
) -> Vec<Near<'a>> {
    let own = skip_own.then(|| Key::new(target.clone()).fingerprint());
    let mut best: Vec<Near<'a>> = Vec::with_capacity(k + 1);
    for e in tuned {
        // Past the k-th's distance (with room for the rounding below) a key cannot enter.
        let bound = match best.last() {
            Some(w) if best.len() == k => w.0 + 1e-6,
            _ => f64::INFINITY,
        };
        let Some(d) = distance_within(target, e.key().fields(), bound).map(quantized) else {
            continue;
        };
        // Only a key within the k-th's distance can enter (ties go on to the finer order).
        if best.len() == k && best.last().is_some_and(|w| d > w.0) {
            continue;
        }
        if Some(e.fingerprint()) == own || measured_best(e, current).is_none() {
            continue;
        }
        let cand = (d, lower_first(target, e.key().fields()), e.fingerprint(), e);
        if best.len() == k
            && best
                .last()
                .is_some_and(|w| near_cmp(&cand, w) != Ordering::Less)
        {
            continue;
        }
        let at = best
            .binary_search_by(|x| near_cmp(x, &cand))
            .unwrap_or_else(|i| i);
        best.insert(at, cand);
        best.truncate(k);
    }
    best
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

/// For ties in distance: how much larger the neighbour is than the target, on the log scale
/// (negative: smaller), so the smaller neighbour comes first.
fn lower_first(target: &Fields, other: &Fields) -> f64 {
    target
        .iter()
        .zip(other.iter())
        .map(|((_, a), (_, b))| signed(a, b))
        .sum()
}

fn signed(a: &Value, b: &Value) -> f64 {
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => {
            let f = |v: i64| ((v.max(0) as f64) + 1.0).ln();
            f(*y) - f(*x)
        }
        (Value::List(x), Value::List(y)) => x.iter().zip(y).map(|(p, q)| signed(p, q)).sum(),
        (Value::Map(x), Value::Map(y)) => lower_first(x, y),
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use cache_core::cache_format::{Candidate, Origin, Stats};

    use super::*;
    use crate::tuner::distance;

    #[test]
    fn the_one_pass_selection_equals_sorting_every_key() {
        let current = vec![CandidateId::new("a", &[]), CandidateId::new("b", &[])];
        // Many keys at equal distances (mirror sizes around the target), some without a
        // measured current candidate, one of another layout.
        let mut entries = Vec::new();
        for (i, (m, n)) in (1..40i64)
            .flat_map(|m| (1..6i64).map(move |n| (m, n)))
            .enumerate()
        {
            let layout = if i % 17 == 0 { "nt" } else { "nn" };
            let key = Key::new(Fields::from([
                ("m".to_owned(), Value::Int(m * 8)),
                ("n".to_owned(), Value::Int(n * 8)),
                ("layout".to_owned(), Value::from(layout)),
            ]));
            let stats = Stats {
                median_ns: 10.0 + (i % 5) as f64,
                min_ns: 10.0,
                spread_ns: 0.0,
                samples: 3,
            };
            let algo = if i % 11 == 0 { "retired" } else { "a" };
            let c = Candidate::measured(algo, Fields::new(), stats);
            entries.push(Entry::new(
                key,
                Fingerprint::default(),
                Origin::Measured("t".into()),
                0,
                [c],
            ));
        }
        for (m, n) in [(160, 24), (8, 8), (333, 40), (1, 1)] {
            let target = Fields::from([
                ("m".to_owned(), Value::Int(m)),
                ("n".to_owned(), Value::Int(n)),
                ("layout".to_owned(), Value::from("nn")),
            ]);
            let own = Key::new(target.clone()).fingerprint();
            let mut all: Vec<Near<'_>> = entries
                .iter()
                .filter(|e| {
                    e.fingerprint() != own && measured_best(e, &Current::new(&current)).is_some()
                })
                .filter_map(|e| {
                    let d = quantized(distance(&target, e.key().fields())?);
                    Some((
                        d,
                        lower_first(&target, e.key().fields()),
                        e.fingerprint(),
                        e,
                    ))
                })
                .collect();
            all.sort_by(near_cmp);
            for k in [1, 4, 10] {
                let fast: Vec<Fingerprint> =
                    nearest(&target, &entries, &Current::new(&current), k, true)
                        .iter()
                        .map(|n| n.2)
                        .collect();
                let slow: Vec<Fingerprint> = all.iter().take(k).map(|n| n.2).collect();
                assert_eq!(fast, slow, "target {m}x{n}, k {k}");
            }
        }
        // An exact tie met larger first: ln 64 - ln 16 = ln 16 - ln 4, so for m = 15 the keys
        // m = 63 and m = 3 are equally near, and the smaller one must win the one place.
        let key = |m: i64| {
            let stats = Stats {
                median_ns: 10.0,
                min_ns: 10.0,
                spread_ns: 0.0,
                samples: 3,
            };
            let c = Candidate::measured("a", Fields::new(), stats);
            let fields = Fields::from([("m".to_owned(), Value::Int(m))]);
            Entry::new(
                Key::new(fields),
                Fingerprint::default(),
                Origin::Measured("t".into()),
                0,
                [c],
            )
        };
        let pair = [key(63), key(3)];
        let target = Fields::from([("m".to_owned(), Value::Int(15))]);
        let got = nearest(&target, &pair, &Current::new(&current), 1, true);
        assert_eq!(got[0].3.key().fields().get("m"), Some(&Value::Int(3)));
    }

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
    }
}
