//! Status codes, the thread-local last error, and the panic boundary every entry point runs in.

use std::cell::RefCell;
use std::ffi::{c_char, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Success.
pub const TC_OK: c_int = 0;
/// The key has no entry (a lookup), not an error.
pub const TC_MISS: c_int = 1;
/// Another thread or process held the key's claim for longer than the wait.
pub const TC_BUSY: c_int = 2;
/// A pointer argument that must not be null was null.
pub const TC_E_NULL: c_int = -1;
/// An argument is invalid (not UTF-8, an empty name, a negative or non-finite time, ...).
pub const TC_E_ARG: c_int = -2;
/// A caller buffer is too small; the length it needs was written where the call says.
pub const TC_E_BUFFER: c_int = -3;
/// A byte key's length is not the one its namespace was made with.
pub const TC_E_KEY_LEN: c_int = -4;
/// The cache handle was closed.
pub const TC_E_CLOSED: c_int = -5;
/// A pointer is not a live handle of the kind the function takes.
pub const TC_E_HANDLE: c_int = -6;
/// The store refused the record (no reader could read it back) or could not save.
pub const TC_E_STORE: c_int = -7;
/// The operation did not finish within its timeout (a flush).
pub const TC_E_TIMEOUT: c_int = -8;
/// tunecache panicked; the message says where. The handle stays usable.
pub const TC_E_PANIC: c_int = -9;

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Records `message` as this thread's last error and returns `code`.
pub(crate) fn fail(code: c_int, message: impl Into<String>) -> c_int {
    let message = message.into();
    LAST_ERROR.with(|last| *last.borrow_mut() = message);
    code
}

/// A failed call: its code and message.
#[derive(Debug)]
pub(crate) struct Failure(pub(crate) c_int, pub(crate) String);

impl Failure {
    pub(crate) fn new(code: c_int, message: impl Into<String>) -> Self {
        Failure(code, message.into())
    }
}

/// Runs one entry point's body: a `Failure` becomes its code with the message kept for
/// `tc_last_error`, and a panic becomes `TC_E_PANIC` instead of unwinding into C.
pub(crate) fn guard(body: impl FnOnce() -> Result<c_int, Failure>) -> c_int {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(code)) => code,
        Ok(Err(Failure(code, message))) => fail(code, message),
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_owned());
            fail(TC_E_PANIC, format!("tunecache panicked: {what}"))
        }
    }
}

/// Copies this thread's last error message into `buf` (at most `len` bytes, the last one a
/// NUL, cut at a character boundary) and returns the message's full length in bytes, without
/// the NUL. `buf` may be null (with any `len`) to ask for the length only. The message is the
/// one of the latest call on this thread that failed; a successful call leaves it alone.
///
/// # Safety
/// `buf` is null or points to `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tc_last_error(buf: *mut c_char, len: usize) -> usize {
    let copy = |message: &str| {
        if !buf.is_null() && len > 0 {
            // SAFETY: the caller gives `len` writable bytes at `buf`.
            unsafe { crate::text::copy_truncated(message, buf, len) };
        }
        message.len()
    };
    catch_unwind(|| LAST_ERROR.with(|last| copy(&last.borrow()))).unwrap_or(0)
}
