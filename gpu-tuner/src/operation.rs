//! What a kernel library implements to have an operation tuned: its candidates, and how to
//! prepare, run and time them.

use std::hash::Hash;
use std::time::{Duration, Instant};

use cache_core::cache_format::{CandidateId, Fields, Value};
use serde::Serialize;

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
    fn candidates(&self) -> Vec<CandidateId>;

    /// What else makes measurements comparable (a kernel-source hash, a measurement-policy
    /// version): part of the candidate-set checksum stored with each entry.
    fn salt(&self) -> Fields {
        Fields::new()
    }

    /// How [`Operation::time`] measures (FORMAT.md, "Measurement policy"): recorded with every
    /// result, with the tuner's warm-up, samples and interleaving, so results measured another
    /// way are never ranked against these. The default `time` uses the monotonic clock.
    fn measure_policy(&self) -> Fields {
        Fields::from([("timer".to_owned(), Value::from("wall"))])
    }

    /// Whether a candidate can run this key at all (e.g. a tile larger than the matrix).
    fn applies(&self, _candidate: &CandidateId, _key: &Self::Key) -> bool {
        true
    }

    /// Makes a ready-to-run handle (compile, load).
    fn prepare(&self, candidate: &CandidateId, key: &Self::Key) -> Result<Self::Handle, String>;

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
