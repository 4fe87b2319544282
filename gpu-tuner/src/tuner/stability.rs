//! How far stored winners can be trusted: a key's current candidates are measured again,
//! several times, exactly as a tune measures them (all together, interleaved), without
//! recording anything. Per key: how often a run's winner differs from the stored one (the
//! *flip rate*) and the stored winner's *regret*, its median over the runs against the best
//! candidate's, minus one; per namespace, the geometric mean of the regrets.

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

    /// The largest flip rate of a key.
    pub fn worst_flip_rate(&self) -> f64 {
        self.keys.iter().map(|k| k.flip_rate).fold(0.0, f64::max)
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
        // Per candidate, its median in each run; per run, its winner.
        let mut medians: Vec<Vec<f64>> = vec![Vec::new(); prepared.len()];
        let mut run_winners: Vec<usize> = Vec::with_capacity(runs);
        for _ in 0..runs {
            let results = measure_all(
                &inner.op,
                &handles,
                &mut problem,
                &inner.config.measure,
                None,
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
        })
    }
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
