//! The arguments `Cache`'s methods take, made into the core's types: a namespace, params, a
//! timeout, and the candidate `put` records.

use std::time::Duration;

use cache_core::Namespace;
use cache_core::cache_format::{Candidate, CandidateId, Fields, Outcome, Stats};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors;
use crate::keys::to_fields;

pub(crate) fn namespace(name: &str) -> PyResult<Namespace> {
    Namespace::new(name).map_err(|e| errors::store(&e))
}

pub(crate) fn params_of(params: Option<&Bound<'_, PyAny>>) -> PyResult<Fields> {
    match params {
        None => Ok(Fields::new()),
        Some(p) if p.is_none() => Ok(Fields::new()),
        Some(p) => to_fields(p, "params"),
    }
}

pub(crate) fn secs(timeout: f64, what: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(timeout).map_err(|_| {
        PyValueError::new_err(format!("{what} must be a finite number of seconds ≥ 0"))
    })
}

/// The candidate `put` records: a measurement (`median_ns`, ...) or a failure (`failed`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn new_candidate(
    algorithm: &str,
    params: Option<&Bound<'_, PyAny>>,
    median_ns: Option<f64>,
    min_ns: Option<f64>,
    spread_ns: f64,
    samples: u32,
    failed: Option<String>,
    tuning_ns: Option<u64>,
    policy: Option<&Bound<'_, PyAny>>,
) -> PyResult<Candidate> {
    let params = params_of(params)?;
    if algorithm.is_empty() {
        return Err(PyValueError::new_err("algorithm must not be empty"));
    }
    let outcome = match (failed, median_ns) {
        (Some(reason), None) => Outcome::Failed(reason),
        (None, Some(median)) => {
            let stats = Stats {
                median_ns: median,
                min_ns: min_ns.unwrap_or(median),
                spread_ns,
                samples,
            };
            // Non-finite and negative times are refused when the entry is checked (as
            // `RefusedEntryError`); a fastest sample slower than the median, which only a
            // shared tier's reader would refuse later, is refused here, the same way.
            if stats.min_ns > stats.median_ns
                && let Some(problem) = stats.problem()
            {
                return Err(errors::refused(problem));
            }
            Outcome::Measured(stats)
        }
        (Some(_), Some(_)) => {
            return Err(PyValueError::new_err(
                "give either median_ns (measured) or failed (a reason), not both",
            ));
        }
        (None, None) => {
            return Err(PyValueError::new_err(
                "give median_ns (measured) or failed (a reason)",
            ));
        }
    };
    let mut candidate = Candidate::new(CandidateId::with_params(algorithm, params), outcome);
    candidate.tuning_ns = tuning_ns;
    candidate.policy = match policy {
        Some(p) if !p.is_none() => Some(to_fields(p, "policy")?),
        _ => None,
    };
    Ok(candidate)
}
