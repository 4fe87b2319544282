//! The command line ([`Cli`]: the global options and the command), and one module per command:
//! its arguments (`#[derive(Args)]`), its `run(self, ctx, out)`, and the typed report it
//! renders as text or JSON.

pub(crate) mod bundle;
pub(crate) mod completions;
pub(crate) mod diff;
pub(crate) mod evaluate;
pub(crate) mod explain;
pub(crate) mod export;
pub(crate) mod gc;
#[cfg(feature = "s3")]
pub(crate) mod generation;
pub(crate) mod get;
pub(crate) mod import;
#[cfg(feature = "s3")]
pub(crate) mod keys;
pub(crate) mod list;
pub(crate) mod merge;
pub(crate) mod migrate;
pub(crate) mod outputs;
pub(crate) mod put;
pub(crate) mod remote;
pub(crate) mod report;
pub(crate) mod show;
pub(crate) mod stability;
pub(crate) mod stats;
pub(crate) mod tune;
pub(crate) mod verify;

use clap::{Parser, Subcommand};

use crate::context::Context;
use crate::options::Global;
use crate::output::Out;

/// Inspect, edit, verify and ship tunecache autotune caches.
#[derive(Debug, Parser)]
#[command(
    name = "tunecache",
    version,
    about,
    max_term_width = 100,
    after_long_help = cache_core::settings::text()
)]
pub struct Cli {
    #[command(flatten)]
    pub(crate) global: Global,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Tune the built-in workload (matmuls and sums of varying shapes) and record the winners;
    /// a second run hits the cache
    #[command(after_long_help = tune::COLUMNS)]
    Tune(tune::TuneArgs),
    /// Show one key's candidates, best first, as a bar chart of their median times
    Show(show::ShowArgs),
    /// Summarise a cache: versions, sizes, entries per scope and namespace
    Stats(stats::StatsArgs),
    /// List entries with their best candidate
    List(list::ListArgs),
    /// Show the ranked candidates recorded for one key (exit 4 if there are none)
    Get(get::GetArgs),
    /// Record one measurement (from a script)
    Put(put::PutArgs),
    /// Check a cache's integrity; exit 3 if anything is wrong
    Verify(verify::VerifyArgs),
    /// Write every entry as JSON lines
    Export(export::ExportArgs),
    /// Migrate a cache to the current schema and format, exactly as the library does on load
    Migrate(migrate::MigrateArgs),
    /// Merge entries from JSON lines, or another tool's cache with --from (all or nothing)
    Import(import::ImportArgs),
    /// The shared tier named by TUNECACHE_REMOTE: ping, stats, push, pull
    Remote(remote::RemoteArgs),
    /// Whole-cache generations on the S3 bucket TUNECACHE_REMOTE names: snapshot, list,
    /// fetch, prune (a job pins one with TUNECACHE_GENERATION)
    #[cfg(feature = "s3")]
    Generation(generation::GenerationArgs),
    /// Keys that sign generations and bundles, and the trust policy naming them: generate,
    /// policy (a fleet pins only what a threshold of its keys signed, with TUNECACHE_TRUST)
    #[cfg(feature = "s3")]
    Keys(keys::KeysArgs),
    /// Join several caches (filters first) into a new file, the same bytes in any order
    Merge(merge::MergeArgs),
    /// Why one key would or would not be used here: which tiers and scopes have it, what differs
    Explain(explain::ExplainArgs),
    /// Prune a cache: by age, by size (oldest first), unheld claim files, leftovers on request
    Gc(gc::GcArgs),
    /// Ship entries as one checksummed file with a manifest: create, inspect, verify, import
    Bundle(bundle::BundleArgs),
    /// Compare two caches key by key: winners kept, changed, regressed; exit 3 on --fail-on
    Diff(diff::DiffArgs),
    /// An output cache's directory (cache-outputs): stats, verify, gc --max-size, clear
    Outputs(outputs::OutputsArgs),
    /// Measure stored winners of the built-in workload again (CPU): flip rate and regret per
    /// key; exit 3 past --max-regret or --max-flip-rate
    Stability(stability::StabilityArgs),
    /// How well prediction serves keys never tuned: k-fold cross-validation on fully tuned
    /// keys (default, nearest key, prediction, top-k), per scope and namespace
    Evaluate(evaluate::EvaluateArgs),
    /// Write one self-contained HTML page that shows the cache: winners over the problem
    /// space, time against size, provenance, margins, scopes side by side
    Report(report::ReportArgs),
    /// Print a shell completion script: `tunecache completions bash > ~/.local/share/bash-completion/completions/tunecache`
    Completions(completions::CompletionsArgs),
    /// Write the manual pages (tunecache.1, tunecache-COMMAND.1) into a folder
    #[command(hide = true)]
    Man(completions::ManArgs),
}

/// Runs one command; returns its exit code.
pub(crate) fn dispatch(command: Command, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
    match command {
        Command::Tune(args) => args.run(ctx, out),
        Command::Show(args) => args.run(ctx, out),
        Command::Stats(args) => args.run(ctx, out),
        Command::List(args) => args.run(ctx, out),
        Command::Get(args) => args.run(ctx, out),
        Command::Put(args) => args.run(ctx, out),
        Command::Verify(args) => long("verifying", ctx, || args.run(ctx, out)),
        Command::Export(args) => args.run(ctx, out),
        Command::Migrate(args) => long("migrating", ctx, || args.run(ctx, out)),
        Command::Import(args) => args.run(ctx, out),
        Command::Remote(args) => long("talking to the shared tier", ctx, || args.run(ctx, out)),
        #[cfg(feature = "s3")]
        Command::Generation(args) => args.run(ctx, out),
        #[cfg(feature = "s3")]
        Command::Keys(args) => args.run(ctx, out),
        Command::Diff(args) => long("comparing", ctx, || args.run(ctx, out)),
        Command::Bundle(args) => long("working on the bundle", ctx, || args.run(ctx, out)),
        Command::Gc(args) => args.run(ctx, out),
        Command::Explain(args) => args.run(ctx, out),
        Command::Merge(args) => long("merging", ctx, || args.run(ctx, out)),
        Command::Outputs(args) => args.run(ctx, out),
        Command::Stability(args) => {
            long("measuring stored winners again", ctx, || args.run(ctx, out))
        }
        Command::Evaluate(args) => args.run(ctx, out),
        Command::Report(args) => args.run(ctx, out),
        Command::Completions(args) => args.run(ctx, out),
        Command::Man(args) => args.run(ctx, out),
    }
}

/// A command whose work reports no progress of its own: a spinner once it has run a second
/// (see `progress.rs`). Its output is buffered (`Out`), so nothing it prints meets the spinner.
fn long(
    what: &str,
    ctx: &Context<'_>,
    run: impl FnOnce() -> anyhow::Result<u8>,
) -> anyhow::Result<u8> {
    crate::progress::during(what, ctx.json, run)
}

/// The entries a file's directory counts, summed without overflow: a count is taken as
/// stored, and a damaged or crafted one may be as large as 2^64 - 1.
pub(crate) fn total(
    counts: &std::collections::BTreeMap<
        cache_format::Scope,
        std::collections::BTreeMap<String, usize>,
    >,
) -> usize {
    counts
        .values()
        .flat_map(|n| n.values())
        .fold(0usize, |a, n| a.saturating_add(*n))
}
