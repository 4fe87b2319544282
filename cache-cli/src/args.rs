//! The command line: the global options and the command (each command's own arguments live in
//! its module under `cmd/`).

use clap::Parser;

use crate::cmd::Command;
use crate::options::Global;

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
