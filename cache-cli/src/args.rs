//! Command-line arguments.

use std::path::PathBuf;

use clap::{ArgAction, Parser, Subcommand, ValueEnum};

/// Inspect, edit, verify and ship tunecache autotune caches.
#[derive(Debug, Parser)]
#[command(name = "tunecache", version, about, max_term_width = 100)]
pub struct Cli {
    /// The cache file [default: $TUNECACHE_FILE, else $TUNECACHE_DIR/APP.tcache, else the
    /// user cache directory]
    #[arg(long, global = true, value_name = "PATH")]
    pub cache_file: Option<PathBuf>,

    /// The application whose default cache file is used, and the application of a new file
    #[arg(long, global = true, value_name = "NAME")]
    pub app: Option<String>,

    /// Print JSON instead of text
    #[arg(long, global = true)]
    pub json: bool,

    /// Log more (-v: info, -vv: debug); TUNECACHE_LOG takes a tracing filter
    #[arg(short, long, global = true, action = ArgAction::Count)]
    pub verbose: u8,

    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Which backend measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Backend {
    /// CUDA if a driver, NVRTC and a device are usable, else the CPU.
    Auto,
    /// The CPU.
    Cpu,
    /// CUDA (an error if it is not usable).
    Cuda,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Tune the built-in workload (matmuls and sums of varying shapes) and record the winners;
    /// a second run hits the cache
    Tune {
        /// Which backend measures
        #[arg(long, value_enum, default_value = "auto")]
        backend: Backend,
        /// The CUDA device
        #[arg(long, default_value_t = 0)]
        device: usize,
        /// Run the workload this many times in this process
        #[arg(long, default_value_t = 1)]
        repeat: u32,
        /// Run only the first N of the workload's 12 steps
        #[arg(long, value_name = "N")]
        steps: Option<usize>,
        /// Draw no progress bar
        #[arg(long)]
        no_progress: bool,
        /// Write a buffer larger than L2 before every CUDA sample
        #[arg(long)]
        flush_l2: bool,
    },
    /// Show one key's candidates, best first, as a bar chart of their median times
    Show {
        /// The namespace
        #[arg(long, short = 'n')]
        namespace: String,
        /// The key, as a JSON object (as `tunecache list` prints it)
        #[arg(long, short = 'k')]
        key: String,
        /// Only this scope (JSON object)
        #[arg(long)]
        scope: Option<String>,
    },
    /// Summarise a cache: versions, sizes, entries per scope and namespace
    Stats,
    /// List entries with their best candidate
    List {
        /// Only this namespace
        #[arg(long, short = 'n')]
        namespace: Option<String>,
        /// Only this scope (JSON object of its fields)
        #[arg(long)]
        scope: Option<String>,
        /// Print at most this many entries
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Show the ranked candidates recorded for one key (exit 4 if there are none)
    Get {
        /// The namespace
        #[arg(long, short = 'n')]
        namespace: String,
        /// The key, as a JSON object
        #[arg(long, short = 'k')]
        key: String,
        /// Only this scope (JSON object); by default every scope is searched
        #[arg(long)]
        scope: Option<String>,
    },
    /// Record one measurement (from a script)
    Put {
        /// The namespace
        #[arg(long, short = 'n')]
        namespace: String,
        /// The key, as a JSON object
        #[arg(long, short = 'k')]
        key: String,
        /// The candidate's algorithm name
        #[arg(long)]
        algo: String,
        /// The candidate's params, as a JSON object
        #[arg(long, default_value = "{}")]
        params: String,
        /// Median time in nanoseconds (required unless --failed)
        #[arg(long, value_parser = nonneg_f64, required_unless_present = "failed")]
        median_ns: Option<f64>,
        /// Fastest sample in nanoseconds [default: the median]
        #[arg(long, value_parser = nonneg_f64)]
        min_ns: Option<f64>,
        /// Spread of the samples in nanoseconds [default: 0]
        #[arg(long, value_parser = nonneg_f64)]
        spread_ns: Option<f64>,
        /// Number of samples
        #[arg(long, default_value_t = 1)]
        samples: u32,
        /// Record the candidate as failed, with this reason, instead of a timing
        #[arg(long, conflicts_with_all = ["median_ns", "min_ns", "spread_ns"])]
        failed: Option<String>,
        /// The scope (JSON object)
        #[arg(long, default_value = "{}")]
        scope: String,
        /// Checksum of the candidate set measured (32 hex digits) [default: unknown]
        #[arg(long)]
        candidate_set: Option<String>,
        /// Schema version of a new file (an existing file keeps its own)
        #[arg(long, default_value_t = 1)]
        schema: u32,
    },
    /// Check a cache's integrity; exit 3 if anything is wrong
    Verify,
    /// Write every entry as JSON lines
    Export {
        /// Output file ("-" for stdout)
        #[arg(long, short = 'o', default_value = "-")]
        output: PathBuf,
    },
    /// Migrate a cache to the current schema and format, exactly as the library does on load
    Migrate {
        /// The application's migration file (JSON); needed unless the embedding tool
        /// provides the registry
        #[arg(long, value_name = "FILE")]
        migrations: Option<PathBuf>,
        /// Also keep the file as it was, as <file>.bak.<ms>
        #[arg(long)]
        backup: bool,
        /// Report the plan and what would change; write nothing
        #[arg(long)]
        dry_run: bool,
        /// Longest wait, in seconds, for another process holding the cache lock
        #[arg(long, default_value_t = 10.0, value_parser = nonneg_f64)]
        lock_timeout: f64,
    },
    /// Merge entries from JSON lines (all lines or none)
    Import {
        /// Input file ("-" for stdin)
        #[arg(default_value = "-")]
        input: PathBuf,
        /// Schema version of a new file (an existing file keeps its own)
        #[arg(long, default_value_t = 1)]
        schema: u32,
    },
}

fn nonneg_f64(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|e| format!("{s:?} is not a number: {e}"))?;
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(format!("{s} is not a finite non-negative number"))
    }
}
