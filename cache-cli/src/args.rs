//! The command line: global options, the commands (each command's own arguments live in its
//! module under `cmd/`), and the argument groups several commands share.

use std::path::PathBuf;

use clap::{ArgAction, Args, Parser, Subcommand};

use crate::cmd;

/// Inspect, edit, verify and ship tunecache autotune caches.
#[derive(Debug, Parser)]
#[command(name = "tunecache", version, about, max_term_width = 100)]
pub struct Cli {
    #[command(flatten)]
    pub(crate) global: Global,

    #[command(subcommand)]
    pub(crate) command: Command,
}

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

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Tune the built-in workload (matmuls and sums of varying shapes) and record the winners;
    /// a second run hits the cache
    Tune(cmd::tune::TuneArgs),
    /// Show one key's candidates, best first, as a bar chart of their median times
    Show(cmd::show::ShowArgs),
    /// Summarise a cache: versions, sizes, entries per scope and namespace
    Stats(cmd::stats::StatsArgs),
    /// List entries with their best candidate
    List(cmd::list::ListArgs),
    /// Show the ranked candidates recorded for one key (exit 4 if there are none)
    Get(cmd::get::GetArgs),
    /// Record one measurement (from a script)
    Put(cmd::put::PutArgs),
    /// Check a cache's integrity; exit 3 if anything is wrong
    Verify(cmd::verify::VerifyArgs),
    /// Write every entry as JSON lines
    Export(cmd::export::ExportArgs),
    /// Migrate a cache to the current schema and format, exactly as the library does on load
    Migrate(cmd::migrate::MigrateArgs),
    /// Merge entries from JSON lines (all lines or none)
    Import(cmd::import::ImportArgs),
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
