//! Lookups: the winner into caller memory (`tc_get`), or every ranked candidate through an
//! entry handle the caller frees (`tc_entry_get`).

use std::ffi::{CString, c_char, c_int, c_void};
use std::sync::Arc;

use cache_core::Store;
use cache_core::cache_format::{Candidate, Entry, Outcome};

use crate::fields::tc_fields;
use crate::handle::{ns_arg, tc_ns};
use crate::key::{KeyArg, bytes_arg, fields_key_arg};
use crate::status::{Failure, TC_E_HANDLE, TC_E_NULL, TC_MISS, TC_OK, guard};
use crate::text::copy_whole;

/// The winner of a key, written by `tc_get`. The caller sets the buffers (`algorithm` of
/// `algorithm_cap` bytes; `params` of `params_cap` bytes, or null to skip the params); the
/// call fills the rest. A buffer too small is `TC_E_BUFFER`, with the length needed in
/// `*_len` (plus one for the NUL) and every other field filled.
#[repr(C)]
#[derive(Debug)]
pub struct tc_result {
    /// Buffer for the winner's algorithm name (NUL-terminated on return), or null.
    pub algorithm: *mut c_char,
    /// Its size in bytes.
    pub algorithm_cap: usize,
    /// Set to the name's length, without the NUL.
    pub algorithm_len: usize,
    /// Buffer for the winner's params as a JSON object (NUL-terminated), or null to skip.
    pub params: *mut c_char,
    /// Its size in bytes.
    pub params_cap: usize,
    /// Set to the JSON's length (when `params` is not null).
    pub params_len: usize,
    /// The winner's median time, nanoseconds.
    pub median_ns: f64,
    /// The winner's fastest sample, nanoseconds.
    pub min_ns: f64,
    /// The winner's spread (interquartile range), nanoseconds.
    pub spread_ns: f64,
    /// Samples behind the winner's statistics; 0 when the winner was chosen by another tool
    /// without figures (an imported shipped config), with the times 0 and `failed` 0.
    pub samples: u32,
    /// How many candidates the entry ranks.
    pub candidates: u32,
    /// Non-zero when every candidate failed: `algorithm` then names the first failure and the
    /// times are 0; there is no winner to use.
    pub failed: u32,
}

fn fill(entry: &Entry, out: &mut tc_result) -> Result<c_int, Failure> {
    let first = entry.candidates().first();
    out.candidates = u32::try_from(entry.candidates().len()).unwrap_or(u32::MAX);
    let (median, min, spread, samples) = match first.map(|c| &c.outcome) {
        Some(Outcome::Measured(s)) => (s.median_ns, s.min_ns, s.spread_ns, s.samples),
        _ => (0.0, 0.0, 0.0, 0),
    };
    out.median_ns = median;
    out.min_ns = min;
    out.spread_ns = spread;
    out.samples = samples;
    out.failed = u32::from(entry.best().is_none());
    let Some(first) = first else {
        return Ok(TC_MISS);
    };
    let mut len = 0;
    // SAFETY: the caller's buffers, as tc_result documents.
    let name = unsafe {
        copy_whole(
            &first.id.algorithm,
            out.algorithm,
            out.algorithm_cap,
            &mut len,
            "algorithm",
        )
    };
    out.algorithm_len = len;
    if !out.params.is_null() {
        let json = params_json(first);
        let mut len = 0;
        // SAFETY: as above.
        let params = unsafe { copy_whole(&json, out.params, out.params_cap, &mut len, "params") };
        out.params_len = len;
        params?;
    }
    name?;
    Ok(TC_OK)
}

fn params_json(c: &Candidate) -> String {
    serde_json::to_string(&c.id.params).unwrap_or_else(|_| "{}".to_owned())
}

fn get(ns: &tc_ns, key: KeyArg<'_>) -> Result<Option<Arc<Entry>>, Failure> {
    let cache = ns.cache.open_cache()?;
    Ok(cache.get(ns.ns, &key.fingerprint(ns)))
}

fn result_arg<'a>(out: *mut tc_result) -> Result<&'a mut tc_result, Failure> {
    if out.is_null() {
        return Err(Failure::new(TC_E_NULL, "out is null"));
    }
    // SAFETY: a tc_result the caller owns, as documented.
    Ok(unsafe { &mut *out })
}

/// Looks up the byte key of `key_len` bytes at `key` in `ns`: `TC_OK` with the winner in
/// `*out`, `TC_MISS` when the key has no entry.
///
/// # Safety
/// `ns` was returned by `tc_namespace`; `key` points to `key_len` readable bytes; `out` is a
/// `tc_result` whose buffers are as it documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tc_get(
    ns: *const tc_ns,
    key: *const c_void,
    key_len: usize,
    out: *mut tc_result,
) -> c_int {
    guard(|| {
        // SAFETY: as documented.
        let ns = unsafe { ns_arg(ns) }?;
        // SAFETY: as documented.
        let key = unsafe { bytes_arg(ns, key, key_len) }?;
        let out = result_arg(out)?;
        match get(ns, key)? {
            Some(entry) => fill(&entry, out),
            None => Ok(TC_MISS),
        }
    })
}

/// `tc_get` for a key of typed fields.
///
/// # Safety
/// As `tc_get`; `key` a live `tc_fields`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tc_get_fields(
    ns: *const tc_ns,
    key: *const tc_fields,
    out: *mut tc_result,
) -> c_int {
    guard(|| {
        // SAFETY: as documented.
        let ns = unsafe { ns_arg(ns) }?;
        // SAFETY: as documented.
        let key = unsafe { fields_key_arg(key) }?;
        let out = result_arg(out)?;
        match get(ns, key)? {
            Some(entry) => fill(&entry, out),
            None => Ok(TC_MISS),
        }
    })
}

const ENTRY_MAGIC: u64 = u64::from_be_bytes(*b"tcentry1");

/// One key's entry, every candidate ranked best first (`tc_entry_get`); freed by
/// `tc_entry_free`. A snapshot: later records do not change it.
#[derive(Debug)]
pub struct tc_entry {
    magic: u64,
    fingerprint: CString,
    candidates: Vec<Prepared>,
}

#[derive(Debug)]
struct Prepared {
    algorithm: CString,
    params: CString,
    failed: Option<CString>,
    candidate: Candidate,
}

/// One ranked candidate of a `tc_entry`. Its strings belong to the entry: valid until
/// `tc_entry_free`.
#[repr(C)]
#[derive(Debug)]
pub struct tc_candidate {
    /// The algorithm name.
    pub algorithm: *const c_char,
    /// The params, a JSON object.
    pub params_json: *const c_char,
    /// Why it failed, or null when it was measured.
    pub failed: *const c_char,
    /// Median time, nanoseconds (0 for a failure).
    pub median_ns: f64,
    /// Fastest sample, nanoseconds.
    pub min_ns: f64,
    /// Spread (interquartile range), nanoseconds.
    pub spread_ns: f64,
    /// Samples behind the statistics; 0 for a failure, or for a winner another tool chose
    /// without figures (an imported shipped config: `failed` null, times 0).
    pub samples: u32,
    /// When it was measured, milliseconds since the Unix epoch.
    pub measured_at_ms: u64,
    /// Time spent preparing and measuring it, nanoseconds (0: unknown).
    pub tuning_ns: u64,
}

fn c_text(text: &str) -> CString {
    CString::new(text.replace('\0', "\u{fffd}")).unwrap_or_default()
}

fn prepare(entry: &Entry) -> tc_entry {
    tc_entry {
        magic: ENTRY_MAGIC,
        fingerprint: c_text(&entry.fingerprint().to_hex()),
        candidates: entry
            .candidates()
            .iter()
            .map(|c| Prepared {
                algorithm: c_text(&c.id.algorithm),
                params: c_text(&params_json(c)),
                failed: match &c.outcome {
                    Outcome::Failed(reason) => Some(c_text(reason)),
                    Outcome::Measured(_) | Outcome::Chosen(_) => None,
                },
                candidate: Candidate::clone(c),
            })
            .collect(),
    }
}

fn entry_out(found: Option<Arc<Entry>>, out: *mut *mut tc_entry) -> Result<c_int, Failure> {
    // SAFETY: checked non-null by the callers.
    unsafe { *out = std::ptr::null_mut() };
    let Some(entry) = found else {
        return Ok(TC_MISS);
    };
    // SAFETY: as above.
    unsafe { *out = Box::into_raw(Box::new(prepare(&entry))) };
    Ok(TC_OK)
}

/// Looks up the byte key at `key`: `TC_OK` with a new entry handle in `*out` (free it with
/// `tc_entry_free`), `TC_MISS` with null.
///
/// # Safety
/// As `tc_get`; `out` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tc_entry_get(
    ns: *const tc_ns,
    key: *const c_void,
    key_len: usize,
    out: *mut *mut tc_entry,
) -> c_int {
    guard(|| {
        // SAFETY: as documented.
        let ns = unsafe { ns_arg(ns) }?;
        // SAFETY: as documented.
        let key = unsafe { bytes_arg(ns, key, key_len) }?;
        if out.is_null() {
            return Err(Failure::new(TC_E_NULL, "out is null"));
        }
        entry_out(get(ns, key)?, out)
    })
}

/// `tc_entry_get` for a key of typed fields.
///
/// # Safety
/// As `tc_entry_get`; `key` a live `tc_fields`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tc_entry_get_fields(
    ns: *const tc_ns,
    key: *const tc_fields,
    out: *mut *mut tc_entry,
) -> c_int {
    guard(|| {
        // SAFETY: as documented.
        let ns = unsafe { ns_arg(ns) }?;
        // SAFETY: as documented.
        let key = unsafe { fields_key_arg(key) }?;
        if out.is_null() {
            return Err(Failure::new(TC_E_NULL, "out is null"));
        }
        entry_out(get(ns, key)?, out)
    })
}

/// # Safety
/// `entry` is null or a live `tc_entry`.
unsafe fn entry_arg<'a>(entry: *const tc_entry) -> Result<&'a tc_entry, Failure> {
    if entry.is_null() {
        return Err(Failure::new(TC_E_NULL, "the entry is null"));
    }
    // SAFETY: a live entry, as the caller promises.
    let e = unsafe { &*entry };
    if e.magic != ENTRY_MAGIC {
        return Err(Failure::new(TC_E_HANDLE, "not a live tc_entry"));
    }
    Ok(e)
}

/// How many candidates the entry ranks (0 for a null or bad handle).
///
/// # Safety
/// `entry` is null or a live `tc_entry`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tc_entry_count(entry: *const tc_entry) -> usize {
    let mut n = 0;
    guard(|| {
        // SAFETY: as documented.
        n = unsafe { entry_arg(entry) }?.candidates.len();
        Ok(TC_OK)
    });
    n
}

/// The key's fingerprint, 32 lower-case hex digits (what `tunecache list` shows), owned by
/// the entry; null for a null or bad handle.
///
/// # Safety
/// `entry` is null or a live `tc_entry`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tc_entry_fingerprint(entry: *const tc_entry) -> *const c_char {
    let mut p = std::ptr::null();
    guard(|| {
        // SAFETY: as documented.
        p = unsafe { entry_arg(entry) }?.fingerprint.as_ptr();
        Ok(TC_OK)
    });
    p
}

/// The candidate ranked `index` (0 is the winner) into `*out`.
///
/// # Safety
/// `entry` is null or a live `tc_entry`; `out` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tc_entry_candidate(
    entry: *const tc_entry,
    index: usize,
    out: *mut tc_candidate,
) -> c_int {
    guard(|| {
        // SAFETY: as documented.
        let e = unsafe { entry_arg(entry) }?;
        if out.is_null() {
            return Err(Failure::new(TC_E_NULL, "out is null"));
        }
        let Some(p) = e.candidates.get(index) else {
            return Err(Failure::new(
                crate::status::TC_E_ARG,
                format!(
                    "index {index} is past the entry's {} candidates",
                    e.candidates.len()
                ),
            ));
        };
        let (median, min, spread, samples) = match &p.candidate.outcome {
            Outcome::Measured(s) => (s.median_ns, s.min_ns, s.spread_ns, s.samples),
            Outcome::Failed(_) | Outcome::Chosen(_) => (0.0, 0.0, 0.0, 0),
        };
        // SAFETY: checked non-null.
        unsafe {
            *out = tc_candidate {
                algorithm: p.algorithm.as_ptr(),
                params_json: p.params.as_ptr(),
                failed: p.failed.as_ref().map_or(std::ptr::null(), |f| f.as_ptr()),
                median_ns: median,
                min_ns: min,
                spread_ns: spread,
                samples,
                measured_at_ms: p.candidate.measured_at,
                tuning_ns: p.candidate.tuning_ns.unwrap_or(0),
            }
        };
        Ok(TC_OK)
    })
}

/// Frees an entry handle. Null is ignored.
///
/// # Safety
/// `entry` is null or a live `tc_entry`, not used after this call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tc_entry_free(entry: *mut tc_entry) {
    guard(|| {
        if entry.is_null() {
            return Ok(TC_OK);
        }
        // SAFETY: as documented.
        unsafe { entry_arg(entry) }?;
        // SAFETY: made by Box::into_raw in entry_out, freed once.
        let mut boxed = unsafe { Box::from_raw(entry) };
        boxed.magic = 0;
        Ok(TC_OK)
    });
}

#[cfg(test)]
mod tests {
    use cache_core::cache_format::{Fields, Fingerprint, Key, Origin, Stats, Value};

    use super::*;

    fn result(buf: &mut [u8]) -> tc_result {
        tc_result {
            algorithm: buf.as_mut_ptr().cast(),
            algorithm_cap: buf.len(),
            algorithm_len: 0,
            params: std::ptr::null_mut(),
            params_cap: 0,
            params_len: 0,
            median_ns: -1.0,
            min_ns: -1.0,
            spread_ns: -1.0,
            samples: 7,
            candidates: 0,
            failed: 7,
        }
    }

    fn entry(candidates: Vec<Candidate>) -> Entry {
        let key = Key::new(Fields::from([("m".to_owned(), Value::Int(1))]));
        Entry::new(
            key,
            Fingerprint::default(),
            Origin::Imported("t".into()),
            1,
            candidates,
        )
    }

    #[test]
    fn a_shipped_winner_is_a_winner_without_figures_and_a_measurement_outranks_it() {
        let shipped = Candidate::chosen("shipped", Fields::new(), "vllm config");
        let mut buf = [0u8; 32];
        let mut out = result(&mut buf);
        assert_eq!(
            fill(&entry(vec![shipped.clone()]), &mut out).ok(),
            Some(TC_OK)
        );
        assert_eq!((out.failed, out.samples, out.median_ns), (0, 0, 0.0));
        assert_eq!(&buf[..8], b"shipped\0");
        let stats = Stats {
            median_ns: 5.0,
            min_ns: 4.0,
            spread_ns: 1.0,
            samples: 3,
        };
        let measured = Candidate::measured("mine", Fields::new(), stats);
        let mut buf = [0u8; 32];
        let mut out = result(&mut buf);
        assert_eq!(
            fill(&entry(vec![shipped, measured]), &mut out).ok(),
            Some(TC_OK)
        );
        assert_eq!(
            (out.failed, out.samples, out.median_ns, out.candidates),
            (0, 3, 5.0, 2)
        );
        assert_eq!(&buf[..5], b"mine\0");
    }
}
