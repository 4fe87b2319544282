//! Claims: one tuner per key, cache-core's `Cache::claim` as it is. A cache with a file claims
//! the key across threads and processes (claim files: an `flock` per key, which also excludes
//! the threads of one process); one without (memory only, read-only, claims folder not
//! writable) across the threads of the process, in the core's in-process table.

use std::ffi::{c_int, c_void};
use std::time::Duration;

use cache_core::{Claim, ClaimGuard};

use crate::fields::tc_fields;
use crate::handle::{ns_arg, tc_cache, tc_ns};
use crate::key::{KeyArg, bytes_arg, fields_key_arg};
use crate::status::{Failure, TC_BUSY, TC_E_HANDLE, TC_E_NULL, TC_OK, guard};

const CLAIM_MAGIC: u64 = u64::from_be_bytes(*b"tcclaim1");

/// A held claim (`tc_claim_take`); released by `tc_claim_release`, or by the process's death.
#[derive(Debug)]
pub struct tc_claim {
    magic: u64,
    /// The fork generation it was taken in (`crate::fork`).
    generation: u64,
    held: Held,
}

/// The claim, and the handle whose cache saves what the holder recorded when it is released.
#[derive(Debug)]
struct Held(&'static tc_cache, ClaimGuard);

fn claim(
    ns: &tc_ns,
    key: KeyArg<'_>,
    wait_ms: u32,
    out: *mut *mut tc_claim,
) -> Result<c_int, Failure> {
    if out.is_null() {
        return Err(Failure::new(TC_E_NULL, "out is null"));
    }
    // SAFETY: checked non-null; the caller gives a writable pointer.
    unsafe { *out = std::ptr::null_mut() };
    let cache = ns.cache.open_cache()?;
    let fp = key.fingerprint(ns);
    let wait = Duration::from_millis(u64::from(wait_ms));
    let held = match cache.claim(ns.ns, &fp, wait) {
        Claim::Held(guard) => {
            if let Some(fd) = guard.lock_fd() {
                // Another process may have recorded the key while we waited: read what it
                // saved.
                if let Err(e) = cache.refresh() {
                    tracing::debug!("tunecache: no refresh after a claim: {e}");
                }
                crate::fork::claim_held(fd);
            }
            Held(ns.cache, guard)
        }
        Claim::Busy => return Ok(TC_BUSY),
    };
    let boxed = Box::new(tc_claim {
        magic: CLAIM_MAGIC,
        generation: crate::fork::generation(),
        held,
    });
    // SAFETY: as above.
    unsafe { *out = Box::into_raw(boxed) };
    Ok(TC_OK)
}

/// Claims the byte key at `key` in `ns` so that this caller alone measures it: `TC_OK` with
/// the claim in `*out`, or `TC_BUSY` (and null) when another thread or process held it for
/// longer than `wait_ms` milliseconds. Taking a claim reads what other processes saved, and
/// releasing it saves what this one recorded; so a caller that got the claim looks the key up
/// again before measuring: the previous holder has usually recorded it.
///
/// # Safety
/// As `tc_get`; `out` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tc_claim_take(
    ns: *const tc_ns,
    key: *const c_void,
    key_len: usize,
    wait_ms: u32,
    out: *mut *mut tc_claim,
) -> c_int {
    guard(|| {
        // SAFETY: as documented.
        let ns = unsafe { ns_arg(ns) }?;
        // SAFETY: as documented.
        let key = unsafe { bytes_arg(ns, key, key_len) }?;
        claim(ns, key, wait_ms, out)
    })
}

/// `tc_claim_take` for a key of typed fields.
///
/// # Safety
/// As `tc_claim_take`; `key` a live `tc_fields`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tc_claim_take_fields(
    ns: *const tc_ns,
    key: *const tc_fields,
    wait_ms: u32,
    out: *mut *mut tc_claim,
) -> c_int {
    guard(|| {
        // SAFETY: as documented.
        let ns = unsafe { ns_arg(ns) }?;
        // SAFETY: as documented.
        let key = unsafe { fields_key_arg(key) }?;
        claim(ns, key, wait_ms, out)
    })
}

/// Saves what was recorded (bounded by the cache's flush timeout), then releases the claim
/// (null is ignored); waiters may then take it.
///
/// # Safety
/// `claim` is null or a claim from `tc_claim_take` not released yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tc_claim_release(claim: *mut tc_claim) -> c_int {
    guard(|| {
        if claim.is_null() {
            return Ok(TC_OK);
        }
        // SAFETY: a live claim, as documented.
        if unsafe { (*claim).magic } != CLAIM_MAGIC {
            return Err(Failure::new(TC_E_HANDLE, "not a live tc_claim"));
        }
        // SAFETY: made by Box::into_raw in `claim`, released once.
        let mut boxed = unsafe { Box::from_raw(claim) };
        boxed.magic = 0;
        if boxed.generation != crate::fork::generation() {
            // Taken by an ancestor before a fork: its lock is the ancestor's (unlocking it here
            // would let another process measure the key the ancestor is measuring) and this
            // process closed its copy of the descriptor at the fork.
            std::mem::forget(boxed);
            return Ok(TC_OK);
        }
        let Held(shell, guard) = boxed.held;
        // What the holder recorded is saved before a shared claim is free, so the next holder
        // (in another process) reads it instead of measuring again.
        if let Some(fd) = guard.lock_fd() {
            if let Ok(cache) = shell.open_cache()
                && let Err(e) = cache_core::Store::flush(&*cache)
            {
                tracing::warn!("tunecache: a claimed key's results are not saved yet: {e}");
            }
            crate::fork::claim_released(fd);
        }
        drop(guard);
        Ok(TC_OK)
    })
}
