//! A key argument: a byte key (a POD the caller memsets) or typed fields, resolved to its
//! fingerprint (and, for a record, its fields).

use std::ffi::c_void;

use cache_core::cache_format::{Fields, Fingerprint, Key};

use crate::fields::{fields_arg, tc_fields};
use crate::handle::tc_ns;
use crate::status::{Failure, TC_E_KEY_LEN, TC_E_NULL};

/// Longest byte key accepted.
pub const TC_MAX_BYTE_KEY: usize = 64 * 1024;

/// A key as the caller gave it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum KeyArg<'a> {
    Bytes(&'a [u8]),
    Fields(&'a Fields),
}

impl KeyArg<'_> {
    /// Its fingerprint; a byte key's comes from the namespace's memo.
    pub(crate) fn fingerprint(&self, ns: &tc_ns) -> Fingerprint {
        match self {
            KeyArg::Bytes(bytes) => ns.memo.fingerprint(bytes),
            KeyArg::Fields(fields) => Fingerprint::of_key(fields),
        }
    }

    /// Its key: canonical fields and fingerprint; a byte key's from the namespace's memo.
    pub(crate) fn key(&self, ns: &tc_ns) -> Key {
        match self {
            KeyArg::Bytes(bytes) => ns.memo.key(bytes),
            KeyArg::Fields(fields) => Key::new((*fields).clone()),
        }
    }
}

/// The byte key of `len` bytes at `key`, checked against the namespace's key size.
///
/// # Safety
/// `key` is null or points to `len` readable bytes.
pub(crate) unsafe fn bytes_arg<'a>(
    ns: &tc_ns,
    key: *const c_void,
    len: usize,
) -> Result<KeyArg<'a>, Failure> {
    if ns.key_size != 0 && len != ns.key_size {
        return Err(Failure::new(
            TC_E_KEY_LEN,
            format!(
                "the key has {len} bytes; namespace {} takes keys of {} bytes",
                ns.ns, ns.key_size
            ),
        ));
    }
    if len > TC_MAX_BYTE_KEY {
        return Err(Failure::new(
            TC_E_KEY_LEN,
            format!("the key has {len} bytes; at most {TC_MAX_BYTE_KEY} are accepted"),
        ));
    }
    if len == 0 {
        return Ok(KeyArg::Bytes(&[]));
    }
    if key.is_null() {
        return Err(Failure::new(
            TC_E_NULL,
            format!("the key is null with a length of {len}"),
        ));
    }
    // SAFETY: `len` readable bytes, as the caller promises.
    Ok(KeyArg::Bytes(unsafe {
        std::slice::from_raw_parts(key.cast::<u8>(), len)
    }))
}

/// The typed key at `key`.
///
/// # Safety
/// `key` is null or a live `tc_fields`.
pub(crate) unsafe fn fields_key_arg<'a>(key: *const tc_fields) -> Result<KeyArg<'a>, Failure> {
    // SAFETY: forwarded.
    unsafe { fields_arg(key, "the key") }.map(KeyArg::Fields)
}
