//! What a kernel library implements to have an operation tuned: its candidates, and how to
//! prepare, run and time them.

use std::hash::Hash;
use std::time::{Duration, Instant};

use cache_core::cache_format::{Candidate, Fields, Value};
use serde::Serialize;

/// A candidate implementation: a stable algorithm name and its parameters. Never a position
/// in a list: the cache stores this identity, so reordering or extending the candidate list
/// keeps every measurement valid.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CandidateSpec {
    /// The algorithm, e.g. `tiled`.
    pub algorithm: String,
    /// Its parameters, e.g. `{"tile": 32}`.
    pub params: Fields,
}

impl CandidateSpec {
    /// A candidate with integer params.
    pub fn new(algorithm: impl Into<String>, params: &[(&str, i64)]) -> Self {
        CandidateSpec {
            algorithm: algorithm.into(),
            params: params
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Value::Int(*v)))
                .collect(),
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
        c.algorithm == self.algorithm && c.params == self.params
    }

    /// `tiled {"tile":32}`, or just `naive` without params.
    pub fn label(&self) -> String {
        if self.params.is_empty() {
            self.algorithm.clone()
        } else {
            format!("{} {}", self.algorithm, Value::Map(self.params.clone()))
        }
    }
}

impl std::fmt::Display for CandidateSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.label())
    }
}

/// One tunable operation family (one cache namespace) on one backend.
///
/// The tuner calls [`Operation::prepare`] to get a ready-to-run handle for a candidate (e.g.
/// compile and load a kernel), [`Operation::problem`] once per key to set up inputs to measure
/// on, [`Operation::verify`] once per candidate to check its result, and [`Operation::time`]
/// to take samples. Errors are strings: a candidate that fails to prepare, verify or run is
/// recorded as failed and never chosen.
pub trait Operation: Send + Sync + 'static {
    /// The problem signature, e.g. `{m, n, k, dtype}`. Its serialized fields are the cache key.
    type Key: Serialize + Clone + Eq + Hash + Send + Sync + 'static;
    /// What the caller runs: a compiled kernel, a closure.
    type Handle: Send + Sync + 'static;
    /// Inputs and outputs to measure on.
    type Problem: Send;

    /// The cache namespace, e.g. `matmul`.
    fn namespace(&self) -> &str;

    /// The candidates, in a preferred order (the first applicable one is the fallback of last
    /// resort).
    fn candidates(&self) -> Vec<CandidateSpec>;

    /// What else makes measurements comparable (a kernel-source hash, a measurement-policy
    /// version): part of the candidate-set checksum stored with each entry.
    fn salt(&self) -> Fields {
        Fields::new()
    }

    /// Whether a candidate can run this key at all (e.g. a tile larger than the matrix).
    fn applies(&self, _candidate: &CandidateSpec, _key: &Self::Key) -> bool {
        true
    }

    /// Makes a ready-to-run handle (compile, load).
    fn prepare(&self, candidate: &CandidateSpec, key: &Self::Key) -> Result<Self::Handle, String>;

    /// Sets up inputs for measuring `key`.
    fn problem(&self, key: &Self::Key) -> Result<Self::Problem, String>;

    /// Runs once, to completion.
    fn run(&self, handle: &Self::Handle, problem: &mut Self::Problem) -> Result<(), String>;

    /// Checks the result of the last run (a candidate that computes the wrong answer must
    /// never win).
    fn verify(&self, _handle: &Self::Handle, _problem: &mut Self::Problem) -> Result<(), String> {
        Ok(())
    }

    /// Times `iterations` back-to-back runs. The default uses the monotonic clock; a GPU
    /// backend overrides it with device events.
    fn time(
        &self,
        handle: &Self::Handle,
        problem: &mut Self::Problem,
        iterations: u32,
    ) -> Result<Duration, String> {
        let start = Instant::now();
        for _ in 0..iterations {
            self.run(handle, problem)?;
        }
        Ok(start.elapsed())
    }
}
