//! Integration tests of the `tunecache` binary: real processes, real files.

mod bundle;
mod bundle_lies;
mod commands;
mod completions;
mod damaged;
mod diff;
mod docs_blocks;
mod evaluate;
mod explain;
mod foreign;
mod gc;
mod imports;
mod large;
mod lookalikes;
mod merge;
mod migrate;
mod outputs;
mod own_files;
mod progress;
mod report;
mod robustness;
mod s3;
mod s3_generations;
mod s3_hostile;
#[cfg(feature = "s3")]
mod s3_trust;
mod settings;
mod shared;
mod shared_faults;
mod tune;

/// The `tunecache` binary under test.
const EXE: &str = env!("CARGO_BIN_EXE_tunecache");

/// `tunecache --cache-file FILE ARGS...` in a clean environment (test-support's runner).
fn tunecache(file: &std::path::Path, args: &[&str]) -> std::process::Output {
    test_support::cli::run(EXE, file, args)
}
