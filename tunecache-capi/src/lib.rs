//! The tunecache C ABI: the persistent autotune cache for C and C++ callers.
//!
//! `include/tunecache.h` is generated from this crate by cbindgen (`cargo xtask header`,
//! checked in CI with `--verify`); `include/tunecache.hpp` is a header-only C++ wrapper on it.
//! The library is built as `libtunecache.a` and `libtunecache.so` and exports only `tc_*`
//! symbols.
//!
//! Conventions, for every function:
//! - A status code is returned (`TC_OK`, `TC_MISS`, `TC_BUSY`, or a negative `TC_E_*`); the
//!   message of the latest failure on the calling thread is read with `tc_last_error`.
//! - Nothing unwinds into C: a panic becomes `TC_E_PANIC`.
//! - Every function may be called from any thread, on one handle from many threads at once.
//! - Null pointers and closed handles are answered with error codes. Handles are never freed,
//!   so a closed one is recognised; a pointer that no tunecache function returned is
//!   undefined behaviour, as it is for any C library.
//! - A byte key (a POD the caller zeroes, then fills) is stored as the key `{"bin": <hex>}`
//!   (FORMAT.md, "Byte keys"), so the CLI lists and explains it and any language can compute
//!   its fingerprint.
#![deny(missing_docs)]
#![allow(
    non_camel_case_types,
    reason = "the C types keep their C names, so the header and the Rust agree"
)]

mod claim;
mod fields;
mod fork;
mod handle;
mod key;
mod lookup;
mod memo;
mod record;
mod status;
mod text;

pub use claim::{tc_claim, tc_claim_release, tc_claim_take, tc_claim_take_fields};
pub use fields::{
    TC_BYTE_KEY_FIELD, tc_fields, tc_fields_bool, tc_fields_free, tc_fields_int, tc_fields_json,
    tc_fields_new, tc_fields_str,
};
pub use handle::{
    TC_MODE_MEMORY, TC_MODE_PERSISTENT, TC_MODE_READ_ONLY, tc_abi_version, tc_cache, tc_close,
    tc_flush, tc_len, tc_mode, tc_namespace, tc_ns, tc_open, tc_options, tc_refresh,
};
pub use key::TC_MAX_BYTE_KEY;
pub use lookup::{
    tc_candidate, tc_entry, tc_entry_candidate, tc_entry_count, tc_entry_fingerprint,
    tc_entry_free, tc_entry_get, tc_entry_get_fields, tc_get, tc_get_fields, tc_result,
};
pub use record::{tc_measurement, tc_record, tc_record_fields};
pub use status::{
    TC_BUSY, TC_E_ARG, TC_E_BUFFER, TC_E_CLOSED, TC_E_HANDLE, TC_E_KEY_LEN, TC_E_NULL, TC_E_PANIC,
    TC_E_STORE, TC_E_TIMEOUT, TC_MISS, TC_OK, tc_last_error,
};

/// The version of this C ABI: bumped when a function's signature or a struct's layout changes
/// incompatibly. `tc_abi_version()` returns the library's.
pub const TC_ABI_VERSION: u32 = 1;
