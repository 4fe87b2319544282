//! `cargo bench -p tunecache-capi`: builds the release library (a nested `cargo build
//! --release`), compiles `benches/abi_bench.cpp` with `-O2` against it, and runs it: a lookup
//! hit through the C ABI against ATen's `unordered_map` + mutex in the same process, and a
//! record with and without a flush. The figures are printed, never asserted.
#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    reason = "a benchmark report"
)]

use std::path::{Path, PathBuf};
use std::process::Command;

const CRATE: &str = env!("CARGO_MANIFEST_DIR");

fn release_staticlib() -> PathBuf {
    let out = Command::new(env!("CARGO"))
        .current_dir(CRATE)
        .args([
            "build",
            "--release",
            "--locked",
            "-p",
            "tunecache-capi",
            "--message-format=json-render-diagnostics",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo build --release -p tunecache-capi failed"
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "tunecache")
        .flat_map(|m| m["filenames"].as_array().cloned().unwrap_or_default())
        .map(|f| PathBuf::from(f.as_str().unwrap()))
        .find(|f| f.extension().is_some_and(|e| e == "a"))
        .expect("libtunecache.a")
}

fn main() {
    // `cargo test --benches` runs this with `--bench` absent: nothing to check here.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let lib = release_staticlib();
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("abi_bench");
    let status = Command::new("c++")
        .args(["-std=c++17", "-O2", "-pthread"])
        .arg(format!("-I{CRATE}/include"))
        .arg(Path::new(CRATE).join("benches/abi_bench.cpp"))
        .arg(&lib)
        .args([
            "-lgcc_s",
            "-lutil",
            "-lrt",
            "-lpthread",
            "-lm",
            "-ldl",
            "-lc",
            "-o",
        ])
        .arg(&exe)
        .status()
        .unwrap();
    assert!(status.success(), "compiling abi_bench.cpp failed");
    let out = Command::new(&exe)
        .arg(dir.path().join("bench.tcache"))
        .output()
        .unwrap();
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "abi_bench failed");
}
