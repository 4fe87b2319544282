//! Recording a measurement or a failure for a key (`tc_record`).

use std::ffi::{c_char, c_int, c_void};

use cache_core::Store;
use cache_core::cache_format::{
    Candidate, CandidateId, Entry, Fields, Fingerprint, Outcome, Stats, now_millis,
};

use crate::fields::{fields_arg, tc_fields};
use crate::handle::{ns_arg, tc_ns};
use crate::key::{KeyArg, bytes_arg, fields_key_arg};
use crate::status::{Failure, TC_E_ARG, TC_E_NULL, TC_E_STORE, TC_OK, guard};
use crate::text::{opt_str_arg, str_arg};

/// One candidate's measurement, or its failure, for `tc_record`. Zero it, then fill it.
#[repr(C)]
#[derive(Debug)]
pub struct tc_measurement {
    /// Median time, nanoseconds (finite, >= 0).
    pub median_ns: f64,
    /// Fastest sample, nanoseconds (0: the median; at most the median).
    pub min_ns: f64,
    /// Spread (interquartile range), nanoseconds.
    pub spread_ns: f64,
    /// Samples behind the statistics (at least 1).
    pub samples: u32,
    /// Time spent preparing and measuring the candidate, nanoseconds (0: unknown): what a
    /// later hit saves.
    pub tuning_ns: u64,
    /// Non-null: the candidate failed, for this reason (a NUL-terminated string), and the
    /// times are ignored.
    pub failed: *const c_char,
}

/// # Safety
/// `m` is a filled `tc_measurement`.
unsafe fn candidate(
    algorithm: &str,
    params: Fields,
    m: &tc_measurement,
) -> Result<Candidate, Failure> {
    if algorithm.is_empty() {
        return Err(Failure::new(TC_E_ARG, "algorithm must not be empty"));
    }
    // SAFETY: as documented.
    let outcome = match unsafe { opt_str_arg(m.failed, "measurement.failed") }? {
        Some(reason) => Outcome::Failed(reason.to_owned()),
        None => {
            let min = if m.min_ns == 0.0 {
                m.median_ns
            } else {
                m.min_ns
            };
            let stats = Stats {
                median_ns: m.median_ns,
                min_ns: min,
                spread_ns: m.spread_ns,
                samples: m.samples,
            };
            // What every reader of a shared tier refuses is refused here, where the caller
            // can be told: implausible figures, and a measurement of no samples (0 is what a
            // winner shipped without figures reports).
            if let Some(problem) = stats.problem() {
                return Err(Failure::new(TC_E_ARG, format!("measurement.{problem}")));
            }
            if m.samples == 0 {
                return Err(Failure::new(
                    TC_E_ARG,
                    "measurement.samples is 0; a measurement has at least one sample",
                ));
            }
            Outcome::Measured(stats)
        }
    };
    let mut c = Candidate::new(CandidateId::with_params(algorithm, params), outcome);
    c.tuning_ns = (m.tuning_ns > 0).then_some(m.tuning_ns);
    Ok(c)
}

/// # Safety
/// As `tc_record`.
unsafe fn record(
    ns: &tc_ns,
    key: KeyArg<'_>,
    algorithm: *const c_char,
    params: *const tc_fields,
    m: *const tc_measurement,
) -> Result<c_int, Failure> {
    // SAFETY: as documented.
    let algorithm = unsafe { str_arg(algorithm, "algorithm") }?;
    let params = if params.is_null() {
        Fields::new()
    } else {
        // SAFETY: as documented.
        unsafe { fields_arg(params, "params") }?.clone()
    };
    if m.is_null() {
        return Err(Failure::new(TC_E_NULL, "the measurement is null"));
    }
    // SAFETY: non-null, filled by the caller.
    let candidate = unsafe { candidate(algorithm, params, &*m) }?;
    let cache = ns.cache.open_cache()?;
    let key = key.key(ns);
    let fp = key.fingerprint();
    // The candidate set stays the one the entry was measured against; a first record starts it.
    let set = cache.get(ns.ns, &fp).map_or_else(
        || {
            Fingerprint::of_candidate_set(
                [(candidate.id.algorithm.as_str(), &candidate.id.params)],
                &Fields::new(),
            )
        },
        |e| e.candidate_set(),
    );
    let entry = Entry::new(
        key,
        set,
        cache_core::measured_here(),
        now_millis(),
        [candidate],
    );
    cache
        .try_put(ns.ns, entry)
        .map(|()| TC_OK)
        .map_err(|e| Failure::new(TC_E_STORE, e.to_string()))
}

/// Records one candidate's measurement (or failure) for the byte key at `key`, merged with
/// what the entry holds: the candidate's earlier result is replaced (by the merge rule: of two
/// measured in the same millisecond the lower median stays), the others kept, and the entry
/// re-ranked. Durable within the save delay, at once after `tc_flush`.
///
/// # Safety
/// `ns` was returned by `tc_namespace`; `key` points to `key_len` readable bytes; `algorithm`
/// is a NUL-terminated string; `params` null or a live `tc_fields`; `m` a filled
/// `tc_measurement`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tc_record(
    ns: *const tc_ns,
    key: *const c_void,
    key_len: usize,
    algorithm: *const c_char,
    params: *const tc_fields,
    m: *const tc_measurement,
) -> c_int {
    guard(|| {
        // SAFETY: as documented.
        let ns = unsafe { ns_arg(ns) }?;
        // SAFETY: as documented.
        let key = unsafe { bytes_arg(ns, key, key_len) }?;
        // SAFETY: as documented.
        unsafe { record(ns, key, algorithm, params, m) }
    })
}

/// `tc_record` for a key of typed fields.
///
/// # Safety
/// As `tc_record`; `key` a live `tc_fields`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tc_record_fields(
    ns: *const tc_ns,
    key: *const tc_fields,
    algorithm: *const c_char,
    params: *const tc_fields,
    m: *const tc_measurement,
) -> c_int {
    guard(|| {
        // SAFETY: as documented.
        let ns = unsafe { ns_arg(ns) }?;
        // SAFETY: as documented.
        let key = unsafe { fields_key_arg(key) }?;
        // SAFETY: as documented.
        unsafe { record(ns, key, algorithm, params, m) }
    })
}
