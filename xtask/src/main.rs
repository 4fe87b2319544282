//! `cargo xtask`: project automation that plain cargo does not cover.
//!
//! Tasks:
//! - `layering`: checks the crate map of ARCHITECTURE.md (internal dependencies only point
//!   down the layers; cudarc is reachable from no crate below gpu-tuner).
//!
//! Each task is a module; the project root is found from `CARGO_MANIFEST_DIR`.
#![allow(clippy::print_stdout, reason = "a command-line tool reports on stdout")]

mod layering;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_owned()
}

const USAGE: &str = "usage: cargo xtask <task>

tasks:
  layering   check that crates depend only on the layers below them and that cudarc
             stays inside gpu-tuner";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("layering") => layering::run(&project_root()),
        Some("-h" | "--help") | None => {
            eprintln!("{USAGE}");
            return ExitCode::from(if args.is_empty() { 2 } else { 0 });
        }
        Some(other) => {
            eprintln!("cargo xtask: unknown task {other:?}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cargo xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}
