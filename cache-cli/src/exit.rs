//! Exit codes of `tunecache` (also in docs/cli.md).

/// Success.
pub const OK: u8 = 0;
/// An error: unreadable input, a failed save, a bad argument value.
pub const ERROR: u8 = 1;
/// Wrong usage: an unknown flag or command (from the argument parser).
pub const USAGE: u8 = 2;
/// `verify` found problems, or `diff` found a category named by `--fail-on`.
pub const PROBLEMS: u8 = 3;
/// `get` found no entry for the key.
pub const NOT_FOUND: u8 = 4;
/// Stopped by Ctrl-C (SIGINT) before anything was written (128 + SIGINT, as shells say).
pub const INTERRUPTED: u8 = 130;
