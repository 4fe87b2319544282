//! Options shared by commands: the global ones, and the argument groups several commands
//! flatten (a key of a namespace, a scope filter).

use std::path::PathBuf;

use clap::{ArgAction, Args};

/// Options every command takes.
#[derive(Debug, Args)]
pub(crate) struct Global {
    /// The cache file [default: $TUNECACHE_FILE, else $TUNECACHE_DIR/APP.tcache, else the
    /// user cache directory]
    #[arg(long, global = true, value_name = "PATH")]
    pub(crate) cache_file: Option<PathBuf>,

    /// The application whose default cache file is used, and the application of a new file
    #[arg(long, global = true, value_name = "NAME")]
    pub(crate) app: Option<String>,

    /// Print JSON instead of text
    #[arg(long, global = true)]
    pub(crate) json: bool,

    /// Log more (-v: info, -vv: debug); TUNECACHE_LOG takes a tracing filter
    #[arg(short, long, global = true, action = ArgAction::Count)]
    pub(crate) verbose: u8,
}

/// One key of one namespace.
#[derive(Debug, Args)]
pub(crate) struct KeyArgs {
    /// The namespace
    #[arg(long, short = 'n')]
    pub(crate) namespace: String,
    /// The key, as a JSON object (as `tunecache list` prints it)
    #[arg(long, short = 'k')]
    pub(crate) key: String,
}

/// How long a command that writes waits for its save.
#[derive(Debug, Args)]
pub(crate) struct WaitArgs {
    /// Longest wait, in seconds, for the save: for another process holding the cache's lock,
    /// and for writing a large file
    #[arg(long, default_value = "60", value_parser = seconds, value_name = "SECONDS")]
    pub(crate) wait: std::time::Duration,
}

/// An optional scope filter.
#[derive(Debug, Args)]
pub(crate) struct ScopeFilter {
    /// Only this scope (JSON object of its fields); by default every scope
    #[arg(long)]
    pub(crate) scope: Option<String>,
}

/// A finite, non-negative number (a time, a timeout).
pub(crate) fn nonneg_f64(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|e| format!("{s:?} is not a number: {e}"))?;
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(format!("{s} is not a finite non-negative number"))
    }
}

/// A number of seconds: finite, non-negative, and within what a `Duration` holds.
pub(crate) fn seconds(s: &str) -> Result<std::time::Duration, String> {
    let v = nonneg_f64(s)?;
    std::time::Duration::try_from_secs_f64(v).map_err(|_| format!("{s} seconds is too long"))
}

/// Wrong usage found after parsing (flags that contradict each other): exit 2, like the
/// argument parser's own errors.
#[derive(Debug)]
pub(crate) struct UsageError(pub(crate) String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Fails with a [`UsageError`].
pub(crate) fn usage(message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(UsageError(message.into()))
}
