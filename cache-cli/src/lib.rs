//! The `tunecache` command line, as a library so a kernel library can build its own CLI on
//! it (passing its migration registry in [`Config`]).
//!
//! Commands (one module each under `cmd/`): `tune`, `show`, `stats`, `list`, `get`, `put`,
//! `verify`, `export`, `import`, `migrate`. Global options: `--cache-file`, `--app`, `--json`
//! (every command renders a typed report as text or JSON), `-v`. Exit codes are [`exit`]'s
//! constants. [`workload`] is the demo application `tunecache tune` runs.
//!
//! What it is not: the library API; everything here goes through cache-core.
#![deny(missing_docs)]

mod args;
mod cmd;
mod context;
mod output;
mod render;
pub mod workload;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;

pub use args::Cli;

/// Exit codes of `tunecache` (also in the README).
pub mod exit {
    /// Success.
    pub const OK: u8 = 0;
    /// An error: unreadable input, a failed save, a bad argument value.
    pub const ERROR: u8 = 1;
    /// Wrong usage: an unknown flag or command (from the argument parser).
    pub const USAGE: u8 = 2;
    /// `verify` found problems.
    pub const PROBLEMS: u8 = 3;
    /// `get` found no entry for the key.
    pub const NOT_FOUND: u8 = 4;
}

/// What an embedding application configures.
///
/// A kernel library can ship its own CLI in a few lines, with its registry built in code
/// (coded steps included), so `migrate` needs no `--migrations` file:
///
/// ```no_run
/// use cache_migrate::Migrations;
/// fn main() -> std::process::ExitCode {
///     let registry = Migrations::new("mylib", 3); // .with(Step::coded(2, 3, ..., |view| ...))
///     cache_cli::main_with(cache_cli::Config { default_app: "mylib".into(), registries: vec![registry] })
/// }
/// ```
#[derive(Debug, Clone)]
pub struct Config {
    /// The application whose cache is used when `--app` is not given.
    pub default_app: String,
    /// Migration registries known without a `--migrations` file, by application.
    pub registries: Vec<cache_migrate::Migrations>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            default_app: "tunecache".to_owned(),
            registries: Vec::new(),
        }
    }
}

impl Config {
    /// The `tunecache` binary's own configuration: the `tunecache` application (what
    /// `tunecache tune` records), with its registry built in.
    pub fn tunecache() -> Self {
        Config {
            default_app: "tunecache".to_owned(),
            registries: vec![workload::registry()],
        }
    }
}

/// Runs the CLI on the process arguments; returns the exit code. The `tunecache` binary is
/// `main_with(Config::tunecache())`.
pub fn main_with(config: Config) -> ExitCode {
    run(std::env::args_os(), &config)
}

/// Runs the CLI on `args` (the first is the program name).
pub fn run<I, T>(args: I, config: &Config) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    init_logging(cli.global.verbose);
    let ctx = context::Context::new(&cli.global, config);
    let mut out = output::Out::new();
    let result = cmd::dispatch(cli.command, &ctx, &mut out).and_then(|code| {
        out.finish()?;
        Ok(code)
    });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) if e.downcast_ref::<output::ClosedPipe>().is_some() => ExitCode::from(exit::OK),
        Err(e) => {
            eprintln!("tunecache: error: {e:#}");
            ExitCode::from(exit::ERROR)
        }
    }
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("TUNECACHE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .try_init();
}
