//! C strings in and out: borrowed arguments checked for null and UTF-8, text copied into
//! caller buffers.

use std::ffi::{CStr, c_char};

use crate::status::{Failure, TC_E_ARG, TC_E_BUFFER, TC_E_NULL};

/// The NUL-terminated UTF-8 string at `ptr`, named `what` in the error.
///
/// # Safety
/// `ptr` is null or points to a NUL-terminated string that outlives `'a`.
pub(crate) unsafe fn str_arg<'a>(ptr: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if ptr.is_null() {
        return Err(Failure::new(TC_E_NULL, format!("{what} is null")));
    }
    // SAFETY: non-null and NUL-terminated, as the caller promises.
    let text = unsafe { CStr::from_ptr(ptr) };
    text.to_str()
        .map_err(|e| Failure::new(TC_E_ARG, format!("{what} is not UTF-8: {e}")))
}

/// [`str_arg`] for an optional string: null is `None`.
///
/// # Safety
/// As [`str_arg`].
pub(crate) unsafe fn opt_str_arg<'a>(
    ptr: *const c_char,
    what: &str,
) -> Result<Option<&'a str>, Failure> {
    if ptr.is_null() {
        Ok(None)
    } else {
        // SAFETY: forwarded.
        unsafe { str_arg(ptr, what) }.map(Some)
    }
}

/// Copies as much of `text` as fits in `len - 1` bytes (cut at a character boundary) and a NUL.
///
/// # Safety
/// `buf` points to `len > 0` writable bytes.
pub(crate) unsafe fn copy_truncated(text: &str, buf: *mut c_char, len: usize) {
    let mut n = text.len().min(len - 1);
    while !text.is_char_boundary(n) {
        n -= 1;
    }
    // SAFETY: `n + 1 <= len` bytes are writable at `buf`; `text` does not overlap them.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
}

/// Writes `text` and a NUL into the caller's buffer `buf` of `cap` bytes, and its length
/// (without the NUL) into `*len_out`. A null `buf` with `cap` 0 asks for the length only; a
/// buffer too small for the whole text is `TC_E_BUFFER` and holds nothing.
///
/// # Safety
/// `buf` is null or points to `cap` writable bytes; `len_out` is valid for a write.
pub(crate) unsafe fn copy_whole(
    text: &str,
    buf: *mut c_char,
    cap: usize,
    len_out: &mut usize,
    what: &str,
) -> Result<(), Failure> {
    *len_out = text.len();
    if buf.is_null() {
        return if cap == 0 {
            Ok(())
        } else {
            Err(Failure::new(
                TC_E_NULL,
                format!("{what} is null with a capacity of {cap}"),
            ))
        };
    }
    if cap <= text.len() {
        if cap > 0 {
            // SAFETY: `cap > 0` writable bytes; an empty string stays visible as "".
            unsafe { *buf = 0 };
        }
        return Err(Failure::new(
            TC_E_BUFFER,
            format!(
                "{what} holds {cap} bytes; {} are needed (the text and a NUL)",
                text.len() + 1
            ),
        ));
    }
    // SAFETY: `text.len() + 1 <= cap` writable bytes at `buf`.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
        *buf.add(text.len()) = 0;
    }
    Ok(())
}
