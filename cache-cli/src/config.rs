//! What an embedding application configures: its default application and the migration
//! registries built into its tool.

use crate::workload;

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
