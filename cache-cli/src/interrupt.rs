//! Ctrl-C (SIGINT) during a long command: the first one is noted, and the command stops at
//! its next check, before it writes anything, with its progress bar cleared and exit code
//! 130; a write already under way finishes (each is one atomic step: a temporary renamed into
//! place, or a commit whose slot is written last), so the cache is either as it was or as
//! the write left it, never between. A second Ctrl-C ends the process at once (the default),
//! which the same atomicity makes safe.

/// Notes Ctrl-C from now on instead of dying at once (see the module docs).
pub(crate) fn catch() {
    cache_core::catch_sigint();
}

/// Whether Ctrl-C was pressed.
pub(crate) fn requested() -> bool {
    cache_core::sigint_requested()
}

/// The error a reader returns once Ctrl-C was pressed (see [`Interrupted`]): an import
/// reading its input stops there, before anything is written.
pub(crate) fn check_io() -> std::io::Result<()> {
    if requested() {
        // Not ErrorKind::Interrupted: std's readers retry on that.
        Err(std::io::Error::other(Interrupted))
    } else {
        Ok(())
    }
}

/// The command was stopped by Ctrl-C before it wrote anything.
#[derive(Debug)]
pub(crate) struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted (Ctrl-C)")
    }
}

impl std::error::Error for Interrupted {}

/// Whether a command that failed was stopped by Ctrl-C: it was pressed (the command's
/// checks turn it into the failure).
pub(crate) fn stopped() -> bool {
    requested()
}
