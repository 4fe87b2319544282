//! `tc_fields`: typed fields built by the caller, for a key, a scope or a candidate's params;
//! and the canonical form of a byte key.

use std::ffi::{c_char, c_int};

use cache_core::cache_format::{Fields, Value};

use crate::status::{Failure, TC_E_ARG, TC_E_HANDLE, TC_E_NULL, TC_OK, guard};
use crate::text::str_arg;

const FIELDS_MAGIC: u64 = u64::from_be_bytes(*b"tcfield1");

/// The name of the one field a byte key becomes (FORMAT.md, "Byte keys").
pub const TC_BYTE_KEY_FIELD: &str = "bin";

/// A set of named values (integers, strings, booleans, and lists and maps through JSON),
/// made by `tc_fields_new` and freed by `tc_fields_free`. Not shared between threads while
/// it is being filled.
#[derive(Debug)]
pub struct tc_fields {
    magic: u64,
    pub(crate) fields: Fields,
}

/// The fields of the byte key `bytes`: `{"bin": <its bytes as lower-case hex>}`.
pub(crate) fn byte_key(bytes: &[u8]) -> Fields {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let hex: Vec<u8> = bytes
        .iter()
        .flat_map(|b| [HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]])
        .collect();
    let hex = String::from_utf8(hex).expect("hex digits are ASCII");
    Fields::from([(TC_BYTE_KEY_FIELD.to_owned(), Value::Str(hex))])
}

/// The fields at `ptr`, checked to be a live `tc_fields`.
///
/// # Safety
/// `ptr` is null or was returned by `tc_fields_new` and not freed.
pub(crate) unsafe fn fields_arg<'a>(
    ptr: *const tc_fields,
    what: &str,
) -> Result<&'a Fields, Failure> {
    if ptr.is_null() {
        return Err(Failure::new(TC_E_NULL, format!("{what} is null")));
    }
    // SAFETY: a live tc_fields, as the caller promises.
    let f = unsafe { &*ptr };
    if f.magic != FIELDS_MAGIC {
        return Err(Failure::new(
            TC_E_HANDLE,
            format!("{what} is not a tc_fields"),
        ));
    }
    Ok(&f.fields)
}

/// # Safety
/// As [`fields_arg`], for a mutable borrow.
unsafe fn fields_mut<'a>(ptr: *mut tc_fields) -> Result<&'a mut Fields, Failure> {
    // SAFETY: forwarded; checked below before the mutable borrow.
    unsafe { fields_arg(ptr, "fields") }?;
    // SAFETY: live and checked; the caller does not share it while filling it.
    Ok(unsafe { &mut (*ptr).fields })
}

/// A new, empty set of fields. Never null.
#[unsafe(no_mangle)]
pub extern "C" fn tc_fields_new() -> *mut tc_fields {
    Box::into_raw(Box::new(tc_fields {
        magic: FIELDS_MAGIC,
        fields: Fields::new(),
    }))
}

/// Frees fields made by `tc_fields_new`. Null is ignored.
///
/// # Safety
/// `fields` is null or was returned by `tc_fields_new` and not freed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tc_fields_free(fields: *mut tc_fields) {
    if fields.is_null() {
        return;
    }
    guard(|| {
        // SAFETY: made by tc_fields_new (Box::into_raw), freed once, as the caller promises.
        let mut boxed = unsafe { Box::from_raw(fields) };
        boxed.magic = 0;
        Ok(TC_OK)
    });
}

fn set(
    fields: *mut tc_fields,
    name: *const c_char,
    value: impl FnOnce() -> Result<Value, Failure>,
) -> c_int {
    guard(|| {
        // SAFETY: pointers as the public function documents.
        let target = unsafe { fields_mut(fields) }?;
        // SAFETY: as above.
        let name = unsafe { str_arg(name, "the field name") }?;
        target.insert(name, value()?);
        Ok(TC_OK)
    })
}

/// Sets the integer field `name` (replacing a field of that name).
///
/// # Safety
/// `fields` is a live `tc_fields`; `name` a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tc_fields_int(
    fields: *mut tc_fields,
    name: *const c_char,
    value: i64,
) -> c_int {
    set(fields, name, || Ok(Value::Int(value)))
}

/// Sets the boolean field `name` (any non-zero `value` is true).
///
/// # Safety
/// As `tc_fields_int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tc_fields_bool(
    fields: *mut tc_fields,
    name: *const c_char,
    value: c_int,
) -> c_int {
    set(fields, name, || Ok(Value::Bool(value != 0)))
}

/// Sets the string field `name` to the NUL-terminated UTF-8 `value`.
///
/// # Safety
/// As `tc_fields_int`; `value` a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tc_fields_str(
    fields: *mut tc_fields,
    name: *const c_char,
    value: *const c_char,
) -> c_int {
    set(fields, name, || {
        // SAFETY: as the caller promises.
        unsafe { str_arg(value, "the field value") }.map(|s| Value::Str(s.to_owned()))
    })
}

/// Sets every field of the JSON object `json` (values may be integers, strings, booleans,
/// lists and objects; no floats, no null), replacing fields of the same names. All or
/// nothing: on an error no field is set.
///
/// # Safety
/// As `tc_fields_int`; `json` a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tc_fields_json(fields: *mut tc_fields, json: *const c_char) -> c_int {
    guard(|| {
        // SAFETY: as the caller promises.
        let target = unsafe { fields_mut(fields) }?;
        // SAFETY: as the caller promises.
        let text = unsafe { str_arg(json, "json") }?;
        let parsed = match serde_json::from_str::<Value>(text) {
            Ok(Value::Map(parsed)) => parsed,
            Ok(other) => {
                return Err(Failure::new(
                    TC_E_ARG,
                    format!("json must be an object such as {{\"m\":128}}, got {other}"),
                ));
            }
            Err(e) => return Err(Failure::new(TC_E_ARG, format!("json is not usable: {e}"))),
        };
        for (name, value) in parsed.iter() {
            target.insert(name.clone(), value.clone());
        }
        Ok(TC_OK)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cache_core::cache_format::Fingerprint;

    #[test]
    fn a_byte_key_is_its_hex_under_bin_as_format_md_says() {
        // struct { int m, n, k; char dtype[4]; } {128, 256, 64, "f16"} on a little-endian machine.
        let mut bytes = Vec::new();
        for v in [128i32, 256, 64] {
            bytes.extend(v.to_le_bytes());
        }
        bytes.extend(b"f16\0");
        let fields = byte_key(&bytes);
        assert_eq!(
            fields.get("bin"),
            Some(&Value::Str("80000000000100004000000066313600".to_owned()))
        );
        assert_eq!(
            Fingerprint::of_key(&fields).to_hex(),
            "e7b9b28b1c8c825528d8d94d45b71188",
            "the vector in fingerprint_vectors.json"
        );
    }
}
