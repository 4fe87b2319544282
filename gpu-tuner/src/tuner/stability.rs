//! How far stored winners can be trusted: a key's current candidates are measured again,
//! several times, exactly as a tune measures them (all together, interleaved), without
//! recording anything. Per key: how often a run's winner differs from the stored one (the
//! *flip rate*) and the stored winner's *regret*, its median over the runs against the best
//! candidate's, minus one; per namespace, the geometric mean of the regrets.
//!
//! Near-ties flip without harm: two candidates within each other's noise trade places from
//! run to run, and counting that as disagreement said 9 of 27 winners agreed on a real H200
//! where the stored winners cost 0.8% on average. So a key counts towards agreement only when
//! its winner is *clearly* best ([`KeyStability::clear_gap`]: every run's time of the
//! runner-up above every run's time of the best), and what a flip costs is measured directly:
//! each run's winner timed in every other run against that run's best (*cross-run regret*).
//!
//! The CPU (`cargo run --release -p cache-cli -- stability`) and GPU figures are in docs/cli.md.

use std::collections::BTreeMap;

use cache_core::Store as _;
use cache_core::cache_format::{CandidateId, Key};

use super::plan::ranked_current;
use super::{TuneError, Tuned};
use crate::measure::measure_all;
use crate::operation::Operation;

/// One key's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyStability {
    /// The cache key (bucketed).
    pub key: Key,
    /// The stored winner, if the key was stored; otherwise the runs' most frequent winner
    /// stands in for it.
    pub stored: Option<CandidateId>,
    /// Each run's winner, by label, with how many runs it won.
    pub winners: BTreeMap<String, usize>,
    /// Runs made.
    pub runs: usize,
    /// Share of the runs whose winner was not the stored one.
    pub flip_rate: f64,
    /// The stored winner's median over the runs against the best candidate's, minus one
    /// (0: it is the best).
    pub regret: f64,
    /// Whether the best candidate (by its median over the runs) is clearly ahead of the
    /// runner-up: every run's time of the runner-up is above every run's time of the best. Only
    /// such keys count towards agreement ([`StabilityReport::agreement`]).
    pub clear_gap: bool,
    /// For each pair of runs (i, j), i ≠ j: run i's winner timed in run j against run j's best,
    /// minus one (a winner that failed in run j counts as 300%).
    pub cross_regrets: Vec<f64>,
}

/// A namespace's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct StabilityReport {
    /// The namespace.
    pub namespace: String,
    /// Per key measured, in the order asked.
    pub keys: Vec<KeyStability>,
    /// The keys that could not be measured here (no candidate prepares, the problem cannot be
    /// made, every candidate fails), each with why: left out of the figures, not an error.
    pub skipped: Vec<(String, TuneError)>,
}

impl StabilityReport {
    /// Geometric mean of (1 + regret) over the keys, minus one.
    pub fn geomean_regret(&self) -> f64 {
        let n = self.keys.len().max(1) as f64;
        (self.keys.iter().map(|k| k.regret.ln_1p()).sum::<f64>() / n).exp() - 1.0
    }

    /// The largest flip rate of a key whose winner is clearly best ([`KeyStability::clear_gap`];
    /// near-ties flip without harm: their cost is the cross-run regret).
    pub fn worst_flip_rate(&self) -> f64 {
        self.keys
            .iter()
            .filter(|k| k.clear_gap)
            .map(|k| k.flip_rate)
            .fold(0.0, f64::max)
    }

    /// Of the keys whose winner is clearly best, the share on whose winner every run agreed
    /// with the stored one; `None` when no key's winner is clearly best.
    pub fn agreement(&self) -> Option<f64> {
        let clear: Vec<&KeyStability> = self.keys.iter().filter(|k| k.clear_gap).collect();
        (!clear.is_empty()).then(|| {
            clear.iter().filter(|k| k.flip_rate == 0.0).count() as f64 / clear.len() as f64
        })
    }

    /// The keys whose winner is clearly best.
    pub fn clear_keys(&self) -> usize {
        self.keys.iter().filter(|k| k.clear_gap).count()
    }

    /// The cross-run regret at quantile `q` (0.5, 0.9, 1.0 for the worst) over every key's
    /// pairs of runs; 0 when there are none.
    pub fn cross_regret(&self, q: f64) -> f64 {
        let mut all: Vec<f64> = self
            .keys
            .iter()
            .flat_map(|k| k.cross_regrets.iter().copied())
            .collect();
        if all.is_empty() {
            return 0.0;
        }
        all.sort_by(f64::total_cmp);
        let at = ((all.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
        all[at]
    }
}

impl<O: Operation> Tuned<O> {
    /// Measures each of `keys` `runs` times (at least two) and reports how stable its stored
    /// winner is. Records nothing; a key that cannot be measured here is skipped and listed
    /// with why ([`StabilityReport::skipped`]), and the others are still measured.
    pub fn stability(&self, keys: &[O::Key], runs: usize) -> Result<StabilityReport, TuneError> {
        let mut report = StabilityReport {
            namespace: self.inner.namespace().to_owned(),
            keys: Vec::with_capacity(keys.len()),
            skipped: Vec::new(),
        };
        for key in keys {
            match self.key_stability(key, runs.max(2)) {
                Ok(k) => report.keys.push(k),
                Err(e) => {
                    let name = self.inner.cache_key(key).map_or_else(
                        |_| "(a key that does not encode)".to_owned(),
                        |k| k.to_string(),
                    );
                    report.skipped.push((name, e));
                }
            }
        }
        Ok(report)
    }

    fn key_stability(&self, key: &O::Key, runs: usize) -> Result<KeyStability, TuneError> {
        let inner = &self.inner;
        let ckey = inner.cache_key(key)?;
        let current = inner.current(key);
        let stored = inner
            .cache()
            .get(inner.ns, &ckey.fingerprint())
            .and_then(|e| ranked_current(&e, &current).first().map(|c| c.id.clone()));
        let no_candidate = |reasons: String| TuneError::NoCandidate {
            namespace: inner.namespace().to_owned(),
            key: ckey.to_string(),
            reasons,
        };
        let mut prepared = Vec::new();
        for spec in &current {
            if let Ok(handle) = inner.op.prepare(spec, key) {
                prepared.push((spec.clone(), handle));
            }
        }
        if prepared.is_empty() {
            return Err(no_candidate("no candidate prepares".into()));
        }
        let mut problem = inner.op.problem(key).map_err(|reason| TuneError::Problem {
            namespace: inner.namespace().to_owned(),
            key: ckey.to_string(),
            reason: reason.to_string(),
        })?;
        let handles: Vec<&O::Handle> = prepared.iter().map(|(_, h)| h).collect();
        // Per candidate, its median in each run; per run, its winner and every median.
        let mut medians: Vec<Vec<f64>> = vec![Vec::new(); prepared.len()];
        let mut run_winners: Vec<usize> = Vec::with_capacity(runs);
        let mut per_run: Vec<Vec<Option<f64>>> = Vec::with_capacity(runs);
        for _ in 0..runs {
            let results = measure_all(
                &inner.op,
                &handles,
                &mut problem,
                &inner.config.measure,
                None,
            );
            per_run.push(
                results
                    .iter()
                    .map(|r| r.as_ref().ok().map(|m| m.stats.median_ns))
                    .collect(),
            );
            let mut best: Option<(usize, f64)> = None;
            for (i, r) in results.iter().enumerate() {
                if let Ok(m) = r {
                    medians[i].push(m.stats.median_ns);
                    if best.is_none_or(|(_, b)| m.stats.median_ns < b) {
                        best = Some((i, m.stats.median_ns));
                    }
                }
            }
            run_winners.extend(best.map(|(i, _)| i));
        }
        if run_winners.is_empty() {
            return Err(no_candidate("every candidate failed in every run".into()));
        }
        let mut counts = vec![0usize; prepared.len()];
        for &w in &run_winners {
            counts[w] += 1;
        }
        let reference = stored
            .as_ref()
            .and_then(|s| prepared.iter().position(|(c, _)| c == s))
            .unwrap_or_else(|| most_frequent(&counts));
        let pooled: Vec<f64> = medians.iter_mut().map(|m| median(m)).collect();
        let (clear_gap, cross_regrets) = judge(&pooled, &per_run);
        let best = pooled.iter().copied().fold(f64::INFINITY, f64::min);
        let regret = match pooled[reference] {
            p if p.is_finite() && best > 0.0 => p / best - 1.0,
            _ => f64::INFINITY,
        };
        Ok(KeyStability {
            key: ckey,
            stored,
            winners: counts
                .iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .map(|(i, n)| (prepared[i].0.label(), *n))
                .collect(),
            runs: run_winners.len(),
            flip_rate: run_winners.iter().filter(|w| **w != reference).count() as f64
                / run_winners.len() as f64,
            regret,
            clear_gap,
            cross_regrets,
        })
    }
}

/// A failed candidate's regret in the cross-run figures: 300%, a slowdown of
/// `predict::FAILED_SLOWDOWN`.
const FAILED_REGRET: f64 = crate::predict::FAILED_SLOWDOWN - 1.0;

/// From each candidate's median over the runs (`pooled`) and every run's medians (`per_run`,
/// `None` where a candidate failed): whether the best is clearly ahead of the runner-up
/// (every run's time of the runner-up above every run's time of the best; a lone candidate
/// is), and each ordered pair of runs' cross-run regret (see [`KeyStability`]). Pure.
fn judge(pooled: &[f64], per_run: &[Vec<Option<f64>>]) -> (bool, Vec<f64>) {
    let mut order: Vec<usize> = (0..pooled.len())
        .filter(|&i| pooled[i].is_finite())
        .collect();
    order.sort_by(|&a, &b| pooled[a].total_cmp(&pooled[b]).then(a.cmp(&b)));
    let times = |c: usize| {
        per_run
            .iter()
            .filter_map(move |run| run.get(c).copied().flatten())
    };
    let clear_gap = match order.as_slice() {
        [] => false,
        [_] => true,
        [best, second, ..] => {
            let slowest_best = times(*best).fold(f64::NEG_INFINITY, f64::max);
            let fastest_second = times(*second).fold(f64::INFINITY, f64::min);
            fastest_second > slowest_best
        }
    };
    let winner = |run: &[Option<f64>]| -> Option<(usize, f64)> {
        run.iter()
            .enumerate()
            .filter_map(|(i, t)| Some((i, (*t)?)))
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
    };
    let mut cross = Vec::new();
    for (i, a) in per_run.iter().enumerate() {
        let Some((w, _)) = winner(a) else { continue };
        for (j, b) in per_run.iter().enumerate() {
            let Some((_, best)) = winner(b).filter(|_| i != j) else {
                continue;
            };
            cross.push(match b.get(w).copied().flatten() {
                Some(t) if best > 0.0 => t / best - 1.0,
                Some(_) => 0.0,
                None => FAILED_REGRET,
            });
        }
    }
    (clear_gap, cross)
}

fn most_frequent(counts: &[usize]) -> usize {
    (0..counts.len())
        .max_by_key(|&i| (counts[i], std::cmp::Reverse(i)))
        .unwrap_or(0)
}

/// The median of `values` (infinite when empty: a candidate that never ran).
fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::INFINITY;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(times: &[Option<f64>]) -> Vec<Option<f64>> {
        times.to_vec()
    }

    #[test]
    fn a_gap_is_clear_only_beyond_both_candidates_run_to_run_spread() {
        // a: 10-11, b: 12-13 in every run: clearly a.
        let clear = [
            run(&[Some(10.0), Some(12.0)]),
            run(&[Some(11.0), Some(13.0)]),
        ];
        let (gap, cross) = judge(&[10.5, 12.5], &clear);
        assert!(gap);
        assert_eq!(cross, [0.0, 0.0], "each run's winner is the other's best");
        // a: 10 then 12, b: 11 twice: the ranges overlap, a near-tie. Run 1's winner (a) is 12
        // in run 2 against b's 11 (9.1%); run 2's winner (b) is 11 in run 1 against a's 10
        // (10%).
        let tie = [
            run(&[Some(10.0), Some(11.0)]),
            run(&[Some(12.0), Some(11.0)]),
        ];
        let (gap, cross) = judge(&[11.0, 11.0], &tie);
        assert!(!gap);
        assert!((cross[0] - (12.0 / 11.0 - 1.0)).abs() < 1e-12, "{cross:?}");
        assert!((cross[1] - (11.0 / 10.0 - 1.0)).abs() < 1e-12, "{cross:?}");
        // A lone candidate is clearly best; a winner that fails in another run costs 300%.
        assert!(judge(&[5.0], &[run(&[Some(5.0)]), run(&[Some(5.0)])]).0);
        let failing = [run(&[Some(10.0), Some(20.0)]), run(&[None, Some(20.0)])];
        let (_, cross) = judge(&[10.0, 20.0], &failing);
        assert_eq!(cross, [FAILED_REGRET, 1.0]);
        // Nothing ran: no gap, no pairs.
        assert_eq!(
            judge(&[f64::INFINITY], &[run(&[None])]),
            (false, Vec::new())
        );
    }

    fn key(flip_rate: f64, clear_gap: bool, cross: &[f64]) -> KeyStability {
        KeyStability {
            key: cache_core::cache_format::Key::new(Default::default()),
            stored: None,
            winners: BTreeMap::new(),
            runs: 4,
            flip_rate,
            regret: 0.0,
            clear_gap,
            cross_regrets: cross.to_vec(),
        }
    }

    #[test]
    fn agreement_counts_only_clear_keys_and_cross_regret_has_quantiles() {
        let report = StabilityReport {
            namespace: "n".into(),
            keys: vec![
                key(0.0, true, &[0.0, 0.0]),
                key(0.5, true, &[0.2, 0.0]),
                key(0.75, false, &[0.01, 0.02]),
            ],
            skipped: Vec::new(),
        };
        assert_eq!(report.clear_keys(), 2);
        assert_eq!(report.agreement(), Some(0.5));
        assert_eq!(
            report.worst_flip_rate(),
            0.5,
            "the near-tie's 75% is not counted"
        );
        assert_eq!(report.cross_regret(1.0), 0.2);
        assert_eq!(report.cross_regret(0.5), 0.01);
        let none = StabilityReport {
            namespace: "n".into(),
            keys: vec![key(1.0, false, &[])],
            skipped: Vec::new(),
        };
        assert_eq!((none.agreement(), none.cross_regret(0.9)), (None, 0.0));
    }
}
