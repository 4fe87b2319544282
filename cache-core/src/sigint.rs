//! Ctrl-C (SIGINT) noted rather than obeyed, for a command that stops at its own checks: the
//! first one sets a flag ([`sigint_requested`]) and puts the default action back, so a second
//! one ends the process at once. (cache-cli forbids `unsafe`; the handler lives here.)

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    // Only async-signal-safe work: a store, and signal(2).
    REQUESTED.store(true, Ordering::SeqCst);
    // SAFETY: signal(2) is async-signal-safe and SIG_DFL a valid disposition.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
    }
}

/// From now on, the first SIGINT sets [`sigint_requested`] instead of ending the process.
pub fn catch_sigint() {
    let handler: extern "C" fn(libc::c_int) = on_sigint;
    // SAFETY: the handler only stores to an atomic and calls signal(2).
    unsafe {
        libc::signal(libc::SIGINT, handler as libc::sighandler_t);
    }
}

/// Whether a SIGINT arrived since [`catch_sigint`].
pub fn sigint_requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}
