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
/// to take samples. A candidate that fails to prepare, verify or run ([`OpError`]) is
/// recorded as failed, with the error's text, and never chosen.
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
    fn prepare(&self, candidate: &CandidateId, key: &Self::Key) -> Result<Self::Handle, OpError>;

    /// Sets up inputs for measuring `key`.
    fn problem(&self, key: &Self::Key) -> Result<Self::Problem, OpError>;

    /// Runs once, to completion.
    fn run(&self, handle: &Self::Handle, problem: &mut Self::Problem) -> Result<(), OpError>;

    /// Checks the result of the last run (a candidate that computes the wrong answer must
    /// never win).
    fn verify(&self, _handle: &Self::Handle, _problem: &mut Self::Problem) -> Result<(), OpError> {
        Ok(())
    }

    /// Times `iterations` back-to-back runs. The default uses the monotonic clock; a GPU
    /// backend overrides it with device events.
    fn time(
        &self,
        handle: &Self::Handle,
        problem: &mut Self::Problem,
        iterations: u32,
    ) -> Result<Duration, OpError> {
        let start = Instant::now();
        for _ in 0..iterations {
            self.run(handle, problem)?;
        }
        Ok(start.elapsed())
    }
}

/// Why an [`Operation`] could not prepare, set up, run, verify or time a candidate: the
/// candidate is recorded as failed with this text. Any error converts into it with `?`
/// (`String` and `&str` too), and [`OpError::source_error`] gives it back to downcast. Like
/// `anyhow::Error`, it is not itself a `std::error::Error`, so that conversion can exist.
pub struct OpError(Box<dyn std::error::Error + Send + Sync>);

impl OpError {
    /// The error an operation gave.
    pub fn source_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

impl<E: Into<Box<dyn std::error::Error + Send + Sync>>> From<E> for OpError {
    fn from(error: E) -> Self {
        OpError(error.into())
    }
}

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl std::fmt::Debug for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.0, f)
    }
}

impl From<OpError> for String {
    fn from(error: OpError) -> Self {
        error.to_string()
    }
}
