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
#![forbid(unsafe_code)]

mod cmd;
mod config;
mod context;
mod damage;
pub mod exit;
mod guard;
mod interrupt;
mod options;
mod output;
mod progress;
mod render;
mod shared;
#[cfg(feature = "s3")]
mod signing;
pub mod workload;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;

pub use cmd::Cli;
pub use config::Config;

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
            // Help and usage errors: a closed or full stream loses them, nothing else.
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    if let Err(e) = init_logging(cli.global.verbose) {
        output::say(format_args!("error: {e}"));
        return ExitCode::from(exit::USAGE);
    }
    let switches = match cache_core::Switches::from_settings(settings()) {
        Ok(s) => s,
        Err(e) => {
            output::say(format_args!("error: {e}"));
            return ExitCode::from(exit::USAGE);
        }
    };
    // Every other setting a value of which would be ignored: named now, whatever the command
    // (a shared tier's mode once stopped only the commands that opened it).
    let problems = setting_problems();
    if !problems.is_empty() {
        for p in &problems {
            output::say(format_args!("error: {p}"));
        }
        return ExitCode::from(exit::USAGE);
    }
    let ctx = context::Context::new(&cli.global, config, switches);
    let mut out = output::Out::new();
    let result = cmd::dispatch(cli.command, &ctx, &mut out).and_then(|code| {
        out.finish()?;
        Ok(code)
    });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) if interrupt::stopped() => {
            output::say(format_args!(
                "interrupted (Ctrl-C): {}; the cache is as it was",
                message(&e)
            ));
            ExitCode::from(exit::INTERRUPTED)
        }
        Err(e) if e.downcast_ref::<options::UsageError>().is_some() => {
            output::say(format_args!("error: {}", message(&e)));
            ExitCode::from(exit::USAGE)
        }
        Err(e) => {
            output::say(format_args!("error: {}", message(&e)));
            ExitCode::from(exit::ERROR)
        }
    }
}

/// An error and its causes, joined by ": ", each said once: a cause whose text its parent
/// already quoted (an OS error inside "cannot read X: ...") is not repeated.
fn message(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// The settings in force: the environment, read once when the command starts (`main` asks
/// first); every command reads its variables here.
pub(crate) fn settings() -> &'static cache_core::settings::Settings {
    static SETTINGS: std::sync::OnceLock<cache_core::settings::Settings> =
        std::sync::OnceLock::new();
    SETTINGS.get_or_init(cache_core::settings::Settings::from_env)
}

/// The settings whose values do not parse, one line each naming the variable.
fn setting_problems() -> Vec<String> {
    let mut out = cache_remote::RemoteOptions::problems(settings());
    let progress = settings().get_os(progress::ENV_PROGRESS);
    if let Err(e) = progress::Mode::parse(progress.map(|v| v.to_string_lossy()).as_deref()) {
        out.push(format!("{}: {e}", progress::ENV_PROGRESS));
    }
    out
}

/// Logs at `TUNECACHE_LOG`'s filter, else at `verbose`'s level; a filter that does not parse
/// is an error naming the variable (it was once ignored without a word).
fn init_logging(verbose: u8) -> anyhow::Result<()> {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = match settings().get_os("TUNECACHE_LOG") {
        Some(v) if !v.is_empty() => {
            let text = v.to_string_lossy();
            tracing_subscriber::EnvFilter::try_new(text.as_ref()).map_err(|e| {
                anyhow::anyhow!("TUNECACHE_LOG={text:?}: not a log filter ({e}); try warn, info, debug or tunecache=debug")
            })?
        }
        _ => tracing_subscriber::EnvFilter::new(default),
    };
    // Logging must never take the process down: a stderr that cannot be written loses the
    // line (tracing-subscriber would otherwise report the failure with `eprintln!`, which
    // panics when stderr is full).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .log_internal_errors(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .try_init();
    Ok(())
}
