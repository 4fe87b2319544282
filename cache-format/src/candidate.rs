//! Candidates: the identity of one implementation ([`CandidateId`]: algorithm + params, shared
//! by what is stored and what a tuner offers), its measurement, and the one ranking rule.

use std::cmp::Ordering;
use std::fmt;

use crate::model::{Millis, now_millis};
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

/// What happened when a candidate was measured.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// It ran and was timed.
    Measured(Stats),
    /// It failed to compile or launch; the reason is kept for inspection. A failed candidate
    /// ranks after every measured one and is never chosen.
    Failed(String),
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
}

impl Candidate {
    /// A candidate with this identity and outcome, measured now.
    pub fn new(id: CandidateId, outcome: Outcome) -> Self {
        Candidate {
            id,
            outcome,
            measured_at: now_millis(),
            tuning_ns: None,
        }
    }

    /// A measured candidate.
    pub fn measured(algorithm: impl Into<String>, params: Fields, stats: Stats) -> Self {
        Candidate {
            id: CandidateId::with_params(algorithm, params),
            outcome: Outcome::Measured(stats),
            measured_at: now_millis(),
            tuning_ns: None,
        }
    }

    /// A candidate that failed to run.
    pub fn failed(algorithm: impl Into<String>, params: Fields, reason: impl Into<String>) -> Self {
        Candidate {
            id: CandidateId::with_params(algorithm, params),
            outcome: Outcome::Failed(reason.into()),
            measured_at: now_millis(),
            tuning_ns: None,
        }
    }

    /// Its statistics, if it was measured.
    pub fn stats(&self) -> Option<&Stats> {
        match &self.outcome {
            Outcome::Measured(stats) => Some(stats),
            Outcome::Failed(_) => None,
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
                (Outcome::Measured(_), Outcome::Failed(_)) => Ordering::Less,
                (Outcome::Failed(_), Outcome::Measured(_)) => Ordering::Greater,
                (Outcome::Failed(a), Outcome::Failed(b)) => a.cmp(b),
            }
            .then_with(|| self.tuning_ns.cmp(&other.tuning_ns))
        })
    }
}

/// Ranks candidates best first (FORMAT.md, "Ranking"): the same order on every machine for
/// the same measurements.
///
/// Measured candidates come first, by median, then fastest sample, then identity
/// ([`CandidateId::identity_bytes`]) for exact ties; failed candidates come last, by identity.
/// There is no tie band: ordering candidates within a band by name let one up to the band's
/// width slower win, and made runs agree no more often than the medians do (measured on the
/// CPU workload). Agreement comes from measuring candidates interleaved instead.
pub fn rank<'a>(candidates: impl IntoIterator<Item = &'a Candidate>) -> Vec<&'a Candidate> {
    let all: Vec<&Candidate> = candidates.into_iter().collect();
    rank_refs(&all).into_iter().map(|i| all[i]).collect()
}

pub(crate) fn rank_indices(candidates: &[Candidate]) -> Vec<usize> {
    let refs: Vec<&Candidate> = candidates.iter().collect();
    rank_refs(&refs)
}

fn rank_refs(all: &[&Candidate]) -> Vec<usize> {
    // Identities (an encoding each) are only needed to break exact ties, which are rare:
    // computed when two candidates compare equal otherwise, not for every candidate.
    let by_identity =
        |i: usize, j: usize| all[i].id.identity_bytes().cmp(&all[j].id.identity_bytes());
    let mut measured: Vec<(usize, Stats)> = Vec::with_capacity(all.len());
    let mut failed: Vec<usize> = Vec::new();
    for (i, c) in all.iter().enumerate() {
        match &c.outcome {
            Outcome::Measured(s) => measured.push((i, *s)),
            Outcome::Failed(_) => failed.push(i),
        }
    }
    measured.sort_by(|(i, a), (j, b)| {
        a.median_ns
            .total_cmp(&b.median_ns)
            .then_with(|| a.min_ns.total_cmp(&b.min_ns))
            .then_with(|| by_identity(*i, *j))
    });
    failed.sort_by(|&i, &j| by_identity(i, j));
    let mut order: Vec<usize> = Vec::with_capacity(all.len());
    order.extend(measured.into_iter().map(|(i, _)| i));
    order.extend(failed);
    order
}
