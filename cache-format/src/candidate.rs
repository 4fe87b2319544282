//! Candidates: the identity of one implementation ([`CandidateId`]: algorithm + params, shared
//! by what is stored and what a tuner offers), its measurement, and the one ranking rule.

use std::cmp::Ordering;
use std::fmt;

use crate::clock::{Millis, now_millis};
use crate::value::{Fields, Value};

/// The identity of a candidate implementation: a stable algorithm name and its parameters.
/// Never a position in a list: the cache stores this identity, so reordering or extending a
/// candidate list keeps every measurement valid.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CandidateId {
    /// The algorithm, e.g. `tiled`.
    pub algorithm: String,
    /// Its parameters, e.g. `{"tile": 32}`.
    pub params: Fields,
}

impl CandidateId {
    /// A candidate with integer params.
    pub fn new(algorithm: impl Into<String>, params: &[(&str, i64)]) -> Self {
        CandidateId {
            algorithm: algorithm.into(),
            params: params
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Value::Int(*v)))
                .collect(),
        }
    }

    /// A candidate with any params.
    pub fn with_params(algorithm: impl Into<String>, params: Fields) -> Self {
        CandidateId {
            algorithm: algorithm.into(),
            params,
        }
    }

    /// An integer param.
    pub fn int(&self, name: &str) -> Option<i64> {
        match self.params.get(name) {
            Some(Value::Int(v)) => Some(*v),
            _ => None,
        }
    }

    /// Whether a stored candidate is this one.
    pub fn matches(&self, c: &Candidate) -> bool {
        c.id == *self
    }

    /// `tiled {"tile":32}`, or just `naive` without params.
    pub fn label(&self) -> String {
        if self.params.is_empty() {
            self.algorithm.clone()
        } else {
            format!("{} {}", self.algorithm, Value::Map(self.params.clone()))
        }
    }

    /// The identity as bytes that order the same in every language: the algorithm name's
    /// UTF-8, a zero byte, the canonical encoding of the params.
    pub fn identity_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.algorithm.len() + 16);
        out.extend_from_slice(self.algorithm.as_bytes());
        out.push(0);
        crate::value::encode_fields(&self.params, &mut out);
        out
    }
}

impl fmt::Display for CandidateId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

/// Timing statistics of one candidate, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    /// Median of the samples.
    pub median_ns: f64,
    /// Fastest sample.
    pub min_ns: f64,
    /// Spread of the samples (the tuner records the median absolute deviation).
    pub spread_ns: f64,
    /// Number of timed samples (warm-up runs excluded).
    pub samples: u32,
}

impl Stats {
    /// What makes a new measurement implausible, said so a front door that records one (C,
    /// Python) can refuse it where the caller can be told, rather than every reader of a
    /// shared tier refusing it later: a time that is not finite or is negative, a fastest
    /// sample slower than the median. `None`: plausible. (Zero samples is not one of them: it
    /// marks a value recorded rather than measured, which stays off shared tiers. An import
    /// takes what an export wrote, whatever it holds.)
    pub fn problem(&self) -> Option<String> {
        for (what, v) in [
            ("median_ns", self.median_ns),
            ("min_ns", self.min_ns),
            ("spread_ns", self.spread_ns),
        ] {
            if !v.is_finite() || v < 0.0 {
                return Some(format!("{what} is {v}; a time is finite and >= 0"));
            }
        }
        if self.min_ns > self.median_ns {
            return Some(format!(
                "min_ns ({}) is greater than median_ns ({}): the fastest sample is at most the median",
                self.min_ns, self.median_ns
            ));
        }
        None
    }
}

/// What happened when a candidate was measured.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// It ran and was timed.
    Measured(Stats),
    /// It failed to compile or launch; the reason is kept for inspection. A failed candidate
    /// ranks after every measured one and is never chosen.
    Failed(String),
    /// Another tool chose it (a shipped config, an imported winner) without figures this
    /// format can hold; the text says who (e.g. `vllm config`). It ranks after every measured
    /// candidate and before the failed ones: a measurement always wins over it.
    Chosen(String),
}

/// One candidate implementation and its measurement.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// Which implementation: algorithm name and params.
    pub id: CandidateId,
    /// The measurement, or why there is none.
    pub outcome: Outcome,
    /// When it was measured.
    pub measured_at: Millis,
    /// Time spent preparing (compiling) and measuring it, in nanoseconds, if known: what a
    /// later hit saves.
    pub tuning_ns: Option<u64>,
    /// How it was measured (FORMAT.md, "Measurement policy"): the timer, warm-up, samples, L2
    /// flush, interleaving, clocks. `None`: unknown (results of format 1, or of a tool that
    /// does not say).
    pub policy: Option<Fields>,
}

impl Candidate {
    /// A candidate with this identity and outcome, measured now.
    pub fn new(id: CandidateId, outcome: Outcome) -> Self {
        Candidate {
            id,
            outcome,
            measured_at: now_millis(),
            tuning_ns: None,
            policy: None,
        }
    }

    /// A measured candidate.
    pub fn measured(algorithm: impl Into<String>, params: Fields, stats: Stats) -> Self {
        Candidate {
            id: CandidateId::with_params(algorithm, params),
            outcome: Outcome::Measured(stats),
            measured_at: now_millis(),
            tuning_ns: None,
            policy: None,
        }
    }

    /// A candidate that failed to run.
    pub fn failed(algorithm: impl Into<String>, params: Fields, reason: impl Into<String>) -> Self {
        Candidate {
            id: CandidateId::with_params(algorithm, params),
            outcome: Outcome::Failed(reason.into()),
            measured_at: now_millis(),
            tuning_ns: None,
            policy: None,
        }
    }

    /// A candidate another tool chose, without figures (see [`Outcome::Chosen`]).
    pub fn chosen(algorithm: impl Into<String>, params: Fields, by: impl Into<String>) -> Self {
        Candidate {
            id: CandidateId::with_params(algorithm, params),
            outcome: Outcome::Chosen(by.into()),
            measured_at: now_millis(),
            tuning_ns: None,
            policy: None,
        }
    }

    /// Whether it may be served as a winner: measured, or chosen by another tool.
    pub fn usable(&self) -> bool {
        !matches!(self.outcome, Outcome::Failed(_))
    }

    /// The same candidate, recorded as measured under `policy`.
    pub fn with_policy(mut self, policy: Fields) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Its statistics, if it was measured.
    pub fn stats(&self) -> Option<&Stats> {
        match &self.outcome {
            Outcome::Measured(stats) => Some(stats),
            Outcome::Failed(_) | Outcome::Chosen(_) => None,
        }
    }

    /// Which of two measurements of the same candidate is kept: the later one, with a total
    /// tie-break over every field so merging is deterministic and order-independent.
    pub(crate) fn version_cmp(&self, other: &Candidate) -> Ordering {
        self.measured_at.cmp(&other.measured_at).then_with(|| {
            match (&self.outcome, &other.outcome) {
                (Outcome::Measured(a), Outcome::Measured(b)) => a
                    .samples
                    .cmp(&b.samples)
                    .then_with(|| b.median_ns.total_cmp(&a.median_ns))
                    .then_with(|| b.min_ns.total_cmp(&a.min_ns))
                    .then_with(|| b.spread_ns.total_cmp(&a.spread_ns)),
                (Outcome::Chosen(a), Outcome::Chosen(b))
                | (Outcome::Failed(a), Outcome::Failed(b)) => a.cmp(b),
                // At the same instant: a measurement is kept over a choice, a failure over
                // both (as before choices existed).
                (a, b) => version_rank(a).cmp(&version_rank(b)),
            }
            .then_with(|| self.tuning_ns.cmp(&other.tuning_ns))
            .then_with(|| {
                policy_bytes(self.policy.as_ref()).cmp(&policy_bytes(other.policy.as_ref()))
            })
        })
    }
}

/// Which of two results of one candidate, recorded at the same instant, is kept (higher).
fn version_rank(o: &Outcome) -> u8 {
    match o {
        Outcome::Chosen(_) => 0,
        Outcome::Measured(_) => 1,
        Outcome::Failed(_) => 2,
    }
}

/// The fields of a measurement policy that say only how precise a measurement is, not what
/// it measures: two policies equal but for these are comparable.
pub(crate) const PRECISION_FIELDS: [&str; 3] = ["samples", "warmup_ns", "warmup_runs"];

/// The comparable part of a policy (without `PRECISION_FIELDS`); `None` for unknown.
pub fn policy_class(policy: Option<&Fields>) -> Option<Fields> {
    policy.map(|p| {
        p.iter()
            .filter(|(k, _)| !PRECISION_FIELDS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    })
}

/// Whether two candidates' results may be ranked against each other: their policies'
/// comparable parts are equal (unknown is equal only to unknown).
pub fn comparable(a: &Candidate, b: &Candidate) -> bool {
    same_class(a.policy.as_ref(), b.policy.as_ref())
}

/// [`policy_class`] equality without building either class (ranking runs on every merge).
fn same_class(a: Option<&Fields>, b: Option<&Fields>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(x), Some(y)) => {
            let keep = |(k, _): &(&String, &crate::Value)| !PRECISION_FIELDS.contains(&k.as_str());
            x.iter().filter(keep).eq(y.iter().filter(keep))
        }
        _ => false,
    }
}

/// The canonical encoding of a policy (empty for unknown), for total orders.
fn policy_bytes(policy: Option<&Fields>) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(p) = policy {
        crate::value::encode_fields(p, &mut out);
    }
    out
}

/// Ranks candidates best first (FORMAT.md, "Ranking"): the same order on every machine for
/// the same measurements.
///
/// Measured candidates come first, by median, then fastest sample, then identity
/// ([`CandidateId::identity_bytes`]) for exact ties; then candidates another tool chose, the
/// latest choice first, then by identity; failed candidates come last, by identity.
/// There is no tie band: ordering candidates within a band by name let one up to the band's
/// width slower win, and made runs agree no more often than the medians do (measured on the
/// CPU workload). Agreement comes from measuring candidates interleaved instead.
pub fn rank<'a>(candidates: impl IntoIterator<Item = &'a Candidate>) -> Vec<&'a Candidate> {
    let all: Vec<&Candidate> = candidates.into_iter().collect();
    rank_refs(&all).into_iter().map(|i| all[i]).collect()
}

/// The candidate whose policy class the ranking leads with: the most recently measured one
/// (ties: the larger encoding of its class), or `None` when every measured candidate's policy
/// is comparable with the first's (nothing to separate, the common case, decided without
/// allocating).
fn leading_class<'a>(all: &[&'a Candidate]) -> Option<&'a Candidate> {
    let mut measured = all.iter().copied().filter(|c| c.stats().is_some());
    let first = measured.next()?;
    if measured.all(|c| same_class(c.policy.as_ref(), first.policy.as_ref())) {
        return None;
    }
    all.iter()
        .copied()
        .filter(|c| c.stats().is_some())
        .max_by(|a, b| {
            a.measured_at.cmp(&b.measured_at).then_with(|| {
                policy_bytes(policy_class(a.policy.as_ref()).as_ref())
                    .cmp(&policy_bytes(policy_class(b.policy.as_ref()).as_ref()))
            })
        })
}

pub(crate) fn rank_indices(candidates: &[std::sync::Arc<Candidate>]) -> Vec<usize> {
    let refs: Vec<&Candidate> = candidates.iter().map(|c| &**c).collect();
    rank_refs(&refs)
}

fn rank_refs(all: &[&Candidate]) -> Vec<usize> {
    // Identities (an encoding each) are only needed to break exact ties, which are rare:
    // computed when two candidates compare equal otherwise, not for every candidate.
    let by_identity =
        |i: usize, j: usize| all[i].id.identity_bytes().cmp(&all[j].id.identity_bytes());
    let lead = leading_class(all);
    // Measured under the leading policy first: results of another policy never outrank them.
    let mut measured: Vec<(bool, usize, Stats)> = Vec::with_capacity(all.len());
    let mut failed: Vec<usize> = Vec::new();
    let mut chosen: Vec<usize> = Vec::new();
    for (i, c) in all.iter().enumerate() {
        match &c.outcome {
            Outcome::Measured(s) => {
                let other =
                    lead.is_some_and(|lead| !same_class(c.policy.as_ref(), lead.policy.as_ref()));
                measured.push((other, i, *s));
            }
            Outcome::Chosen(_) => chosen.push(i),
            Outcome::Failed(_) => failed.push(i),
        }
    }
    measured.sort_by(|(oa, i, a), (ob, j, b)| {
        oa.cmp(ob)
            .then_with(|| a.median_ns.total_cmp(&b.median_ns))
            .then_with(|| a.min_ns.total_cmp(&b.min_ns))
            .then_with(|| by_identity(*i, *j))
    });
    chosen.sort_by(|&i, &j| {
        all[j]
            .measured_at
            .cmp(&all[i].measured_at)
            .then_with(|| by_identity(i, j))
    });
    failed.sort_by(|&i, &j| by_identity(i, j));
    let mut order: Vec<usize> = Vec::with_capacity(all.len());
    order.extend(measured.into_iter().map(|(_, i, _)| i));
    order.extend(chosen);
    order.extend(failed);
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Value;

    #[test]
    fn a_measurement_is_implausible_for_bad_times_or_a_min_above_its_median() {
        let ok = Stats {
            median_ns: 10.0,
            min_ns: 9.0,
            spread_ns: 1.0,
            samples: 3,
        };
        assert_eq!(ok.problem(), None);
        assert_eq!(
            Stats {
                samples: 0,
                median_ns: 0.0,
                min_ns: 0.0,
                ..ok
            }
            .problem(),
            None
        );
        for bad in [
            Stats {
                median_ns: f64::NAN,
                ..ok
            },
            Stats { min_ns: -1.0, ..ok },
            Stats {
                spread_ns: f64::INFINITY,
                ..ok
            },
            Stats { min_ns: 11.0, ..ok },
        ] {
            assert!(bad.problem().is_some(), "{bad:?}");
        }
    }

    fn timed(name: &str, median: f64, at: Millis, policy: Option<(&str, i64)>) -> Candidate {
        let stats = Stats {
            median_ns: median,
            min_ns: median,
            spread_ns: 0.0,
            samples: 5,
        };
        let mut c = Candidate::measured(name, Fields::new(), stats);
        c.measured_at = at;
        c.policy = policy.map(|(timer, samples)| {
            Fields::from([
                ("timer".to_owned(), Value::from(timer)),
                ("samples".to_owned(), Value::Int(samples)),
            ])
        });
        c
    }

    fn names(ranked: &[&Candidate]) -> Vec<String> {
        ranked.iter().map(|c| c.id.algorithm.clone()).collect()
    }

    #[test]
    fn results_of_another_policy_never_outrank_the_latest_policys() {
        // b was measured last, under CUDA events: it leads though a's wall-clock median is
        // lower; c shares b's policy but for the sample count, so it is ranked with b.
        let all = [
            timed("a", 100.0, 1, Some(("wall", 5))),
            timed("b", 200.0, 3, Some(("cuda-events", 20))),
            timed("c", 150.0, 2, Some(("cuda-events", 9))),
            timed("unknown", 50.0, 0, None),
        ];
        assert_eq!(names(&rank(&all)), ["c", "b", "unknown", "a"]);
        assert!(comparable(&all[1], &all[2]) && !comparable(&all[0], &all[1]));
        assert!(!comparable(&all[3], &all[0]));
        // One policy throughout (or unknown throughout): by median, as before.
        let same = [
            timed("a", 100.0, 1, Some(("wall", 5))),
            timed("b", 90.0, 2, Some(("wall", 7))),
        ];
        assert_eq!(names(&rank(&same)), ["b", "a"]);
        let old = [timed("a", 100.0, 1, None), timed("b", 90.0, 2, None)];
        assert_eq!(names(&rank(&old)), ["b", "a"]);
    }

    #[test]
    fn a_chosen_winner_ranks_after_every_measurement_and_before_failures() {
        let mut old_choice = Candidate::chosen("x", Fields::new(), "vllm config");
        old_choice.measured_at = 1;
        let mut new_choice = Candidate::chosen("y", Fields::new(), "sglang config");
        new_choice.measured_at = 5;
        let failed = Candidate::failed("a", Fields::new(), "no");
        let slow = timed("slow", 1e9, 0, None);
        let all = [old_choice.clone(), failed.clone(), new_choice.clone(), slow];
        assert_eq!(names(&rank(&all)), ["slow", "y", "x", "a"]);
        // Alone, the latest choice leads and is the entry's winner (not a failure).
        let only = [old_choice.clone(), failed, new_choice.clone()];
        assert_eq!(names(&rank(&only)), ["y", "x", "a"]);
        assert!(new_choice.usable() && new_choice.stats().is_none());
        // The same candidate chosen and measured at one instant: the measurement is kept,
        // whichever order they are compared in.
        let mut measured = timed("x", 10.0, 1, None);
        measured.id = old_choice.id.clone();
        assert_eq!(old_choice.version_cmp(&measured), Ordering::Less);
        assert_eq!(measured.version_cmp(&old_choice), Ordering::Greater);
    }

    #[test]
    fn the_same_candidate_measured_under_two_policies_keeps_the_later_one() {
        let wall = timed("a", 100.0, 1, Some(("wall", 5)));
        let events = timed("a", 200.0, 1, Some(("cuda-events", 5)));
        // Same time: the tie-break is total and symmetric.
        assert_eq!(
            wall.version_cmp(&events),
            events.version_cmp(&wall).reverse()
        );
        assert_ne!(wall.version_cmp(&events), Ordering::Equal);
    }
}
