//! `cargo xtask`: project automation that plain cargo does not cover.
//!
//! Tasks:
//! - `layering`: checks the crate map of ARCHITECTURE.md (internal dependencies only point
//!   down the layers; cudarc is reachable from no crate below gpu-tuner).
//! - `golden`: golden-file migration checks (`--check`, `--bless`, `--new-input`).
//! - `release`: every version bump has its migration step and golden inputs.
//! - `docs`: every path ARCHITECTURE.md names exists.
//! - `size`: no source file over 600 lines, no function over 100 lines outside tests.
//! - `tidy`: no `Result<_, String>` at a public boundary; no I/O in the pure crates.
//! - `api`: each library crate's public names against its snapshot in `api/`.
//! - `bench-report`: the command-line costs for caches of 1k to 1M entries, side by side with
//!   Python msgpack on the same files.
//! - `header`, `capi`: the C header (cbindgen; `--verify` in the test command) and an install
//!   of the C library with its pkg-config file.
//! - `dist`: what a user installs: the CLI archive, the C library archive, the wheel.
//! - `test`: the README's test command: prepares a Python environment, runs every test,
//!   fails on a skip.
//!
//! Each task is a module; the project root is found from `CARGO_MANIFEST_DIR`.
#![allow(clippy::print_stdout, reason = "a command-line tool reports on stdout")]

mod api;
mod bench;
mod capi;
mod dist;
mod dist_check;
mod docs;
mod env_names;
mod golden;
mod layering;
mod module_cycles;
mod release;
mod size;
mod test;
mod tidy;

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
             stays inside gpu-tuner
  golden     [--check | --bless | --new-input APP VERSION] migrate every golden input and
             compare with its expected output, byte for byte
  release    check that every format or schema version has its step and golden inputs
  docs       check that every file or folder ARCHITECTURE.md names exists
  size       check that no source file has over 600 lines and no function outside tests
             over 100
  tidy       check that no public function returns Result<_, String> and that the pure
             crates do no I/O
  api        [--bless] check each library crate's public names against api/<crate>.txt
  bench-report [--sizes N,N,...]  time stats, list, verify, put, export, migrate and
             import of the release binary on caches of each size (default 1k,10k,100k,1M),
             beside Python's msgpack.unpackb of the same file
  header     [--verify] write tunecache-capi/include/tunecache.h with cbindgen (or check
             that the checked-in one is what it would write)
  capi       [--release] [--prefix DIR] build the C library and install its headers,
             libraries and pkg-config file under DIR (default target/capi)
  dist       [--dev] [--out DIR] build what a user installs into DIR (default target/dist):
             the CLI archive (stripped, with completions and man pages), the C library
             archive, the Python wheel (abi3, manylinux, checked with auditwheel);
             --check: a dev dist installed and used as a user would (the test command runs it)
  test       [--allow-skips] [-- ARGS] prepare what the tests need (Python packages, the
             NVRTC wheel) and run the whole test suite; a skipped test fails the run";

/// A task's lines of [`USAGE`] (`cargo xtask <task> --help`), if it is a task.
fn task_usage(task: &str) -> Option<String> {
    let names = |l: &str| {
        l.strip_prefix("  ")
            .is_some_and(|rest| rest.split_whitespace().next() == Some(task))
    };
    let mut lines = USAGE.lines().skip_while(|l| !names(l));
    let first = lines.next()?;
    let rest = lines.take_while(|l| l.starts_with("   "));
    let text: Vec<&str> = std::iter::once(first).chain(rest).collect();
    Some(format!(
        "usage: cargo xtask {task} ...\n\n{}",
        text.join("\n")
    ))
}

/// Whether `args` (after the task) ask for help; what follows `--` is the task's own.
fn asks_help(args: &[String]) -> bool {
    args.iter()
        .take_while(|a| *a != "--")
        .any(|a| a == "-h" || a == "--help")
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(task) = args.first().filter(|_| asks_help(&args[1..])) {
        return match task_usage(task) {
            Some(usage) => {
                println!("{usage}");
                ExitCode::SUCCESS
            }
            None => {
                eprintln!("cargo xtask: unknown task {task:?}\n\n{USAGE}");
                ExitCode::from(2)
            }
        };
    }
    let result = match args.first().map(String::as_str) {
        Some("layering") => layering::run(&project_root()),
        Some("golden") => golden::run(&project_root(), &args[1..]),
        Some("release") => release::run(&project_root()),
        Some("docs") => docs::run(&project_root()),
        Some("size") => size::run(&project_root()),
        Some("tidy") => tidy::run(&project_root()),
        Some("api") => api::run(&project_root(), &args[1..]),
        Some("header") => capi::header(&project_root(), &args[1..]),
        Some("capi") => capi::install(&project_root(), &args[1..]),
        Some("dist") => dist::run(&project_root(), &args[1..]),
        Some("test") => test::run(&project_root(), &args[1..]),
        Some("bench-report") => bench::run(&project_root(), &args[1..]),
        Some("bench-gen") => bench::generate(&args[1..]),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_has_its_help_and_a_task_s_own_arguments_are_left_alone() {
        for task in [
            "layering",
            "golden",
            "release",
            "docs",
            "size",
            "tidy",
            "api",
            "bench-report",
            "header",
            "capi",
            "dist",
            "test",
        ] {
            let usage = task_usage(task).unwrap_or_else(|| panic!("{task} has no help"));
            assert!(usage.contains(&format!("  {task} ")), "{usage}");
        }
        let test = task_usage("test").expect("help");
        assert!(
            test.contains("--allow-skips") && !test.contains("cudarc"),
            "{test}"
        );
        assert!(task_usage("nope").is_none());
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert!(asks_help(&args(&["--help"])));
        assert!(asks_help(&args(&["--allow-skips", "-h"])));
        assert!(
            !asks_help(&args(&["--", "--help"])),
            "cargo test's own --help"
        );
    }
}
