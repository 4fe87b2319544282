//! The C ABI from C and C++: builds libtunecache (a nested `cargo build` of this crate, so the
//! static and shared libraries are current), compiles the programs in `tests/c` and `examples`
//! with the system compiler, and runs them as separate processes: bad input, the ATen-style
//! harness (8 threads x 10,000 operations, then a second process), claims across processes, a
//! recorder killed mid-record, AddressSanitizer and UndefinedBehaviorSanitizer builds, the
//! exported symbols, and the CLI reading what C++ recorded.
#![allow(clippy::unwrap_used, reason = "tests")]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

const CRATE: &str = env!("CARGO_MANIFEST_DIR");
/// What a static link of the Rust library needs from glibc.
const STATIC_DEPS: [&str; 7] = [
    "-lgcc_s",
    "-lutil",
    "-lrt",
    "-lpthread",
    "-lm",
    "-ldl",
    "-lc",
];
const SCOPE: &str =
    r#"{"cudnn":90100,"device":"NVIDIA H100 80GB HBM3","driver":"560.35.03","sm_count":132}"#;

struct Built {
    staticlib: PathBuf,
    cdylib: PathBuf,
}

/// Builds this crate's libraries once per test binary.
fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let out = Command::new(env!("CARGO"))
            .current_dir(CRATE)
            .args([
                "build",
                "--locked",
                "-p",
                "tunecache-capi",
                "--message-format=json-render-diagnostics",
            ])
            .stderr(Stdio::inherit())
            .output()
            .expect("cargo runs");
        assert!(out.status.success(), "cargo build -p tunecache-capi failed");
        let mut files = Vec::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if msg["reason"] == "compiler-artifact" && msg["target"]["name"] == "tunecache" {
                files.extend(
                    msg["filenames"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|f| PathBuf::from(f.as_str().unwrap())),
                );
            }
        }
        let find = |ext: &str| {
            files
                .iter()
                .find(|f| f.extension().is_some_and(|e| e == ext))
                .unwrap_or_else(|| panic!("no libtunecache.{ext} among {files:?}"))
                .clone()
        };
        Built {
            staticlib: find("a"),
            cdylib: find("so"),
        }
    })
}

/// Compiles `source` (C or C++ by its extension) against the static library into `dir`.
fn compile(dir: &Path, source: &str, sanitize: bool) -> PathBuf {
    let src = Path::new(CRATE).join(source);
    let cxx = src.extension().is_some_and(|e| e == "cpp");
    let exe = dir.join(format!(
        "{}{}",
        src.file_stem().unwrap().to_str().unwrap(),
        if sanitize { "-san" } else { "" }
    ));
    let mut cmd = Command::new(if cxx { "c++" } else { "cc" });
    cmd.arg(if cxx { "-std=c++17" } else { "-std=c11" })
        .args(["-Wall", "-Wextra", "-Werror", "-g", "-O1", "-pthread"])
        .arg(format!("-I{CRATE}/include"));
    if sanitize {
        cmd.args([
            "-fsanitize=address,undefined",
            "-fno-omit-frame-pointer",
            "-fno-sanitize-recover=all",
        ]);
    }
    cmd.arg(&src)
        .arg(&built().staticlib)
        .args(STATIC_DEPS)
        .arg("-o")
        .arg(&exe);
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("the system compiler ({cmd:?}) is required: {e}"));
    assert!(
        out.status.success(),
        "compiling {source} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Runs `exe` with `args` in `dir` under the sanitizers' strict settings; returns its stdout.
fn run(dir: &Path, exe: &Path, args: &[&str]) -> String {
    let out = Command::new(exe)
        .current_dir(dir)
        .args(args)
        .env(
            "ASAN_OPTIONS",
            "detect_leaks=1:halt_on_error=1:abort_on_error=0",
        )
        .env("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1")
        .env_remove("TUNECACHE_FILE")
        .env_remove("TUNECACHE_DIR")
        .env_remove("TUNECACHE_REMOTE")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{} {args:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        exe.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn bad_input_is_answered_with_error_codes_never_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "tests/c/bad_input.c", false);
    let out = run(dir.path(), &exe, &["bad.tcache"]);
    assert!(out.contains("bad_input: ok"), "{out}");
}

#[test]
fn bad_input_runs_clean_under_address_and_undefined_behaviour_sanitizers() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "tests/c/bad_input.c", true);
    let out = run(dir.path(), &exe, &["bad.tcache"]);
    assert!(out.contains("bad_input: ok"), "{out}");
}

#[test]
fn eight_threads_lose_nothing_and_a_second_process_reads_everything() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "tests/c/aten_harness.cpp", false);
    let out = run(dir.path(), &exe, &["write", "h.tcache"]);
    assert!(
        out.contains("40000 inserts") && out.contains("256 keys"),
        "{out}"
    );
    let out = run(dir.path(), &exe, &["read", "h.tcache"]);
    assert!(out.contains("256 keys, every record there"), "{out}");
    cli_reads_what_cpp_recorded(dir.path(), &exe);
}

/// `tunecache::BenchmarkCache`: an algorithm measured again (a new time each time, as ATen's
/// benchmark gives) keeps one candidate whose time is the last one; the time was once part of
/// the candidate's params, and each re-measurement added a candidate.
#[test]
fn a_remeasured_algorithm_replaces_its_time_and_adds_no_candidate() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "tests/c/aten_harness.cpp", false);
    let out = run(dir.path(), &exe, &["remeasure", "h.tcache"]);
    assert!(out.contains("remeasure: 2 candidates"), "{out}");
}

/// A cache written by the earlier `tunecache.hpp` (a candidate per measurement, the time in
/// its params): `find` serves each algorithm's latest result, not the fastest old one.
#[test]
fn a_cache_of_the_old_value_layout_serves_the_latest_results() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "tests/c/aten_harness.cpp", false);
    let out = run(dir.path(), &exe, &["old-layout", "h.tcache"]);
    assert!(
        out.contains("old layout: served the latest results"),
        "{out}"
    );
}

#[test]
fn the_harness_runs_clean_under_address_and_undefined_behaviour_sanitizers() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "tests/c/aten_harness.cpp", true);
    run(dir.path(), &exe, &["write", "h.tcache"]);
    run(dir.path(), &exe, &["read", "h.tcache"]);
    run(dir.path(), &exe, &["remeasure", "h.tcache"]);
    run(dir.path(), &exe, &["old-layout", "h.tcache"]);
    run(dir.path(), &exe, &["claims", "h.tcache", "claims.log"]);
}

/// The fingerprint of a byte key by FORMAT.md alone: SHA-256 over the key tag and the msgpack
/// map `{"bin": <hex>}`, written out byte by byte here.
fn independent_fingerprint(hex: &str) -> String {
    let mut bytes = b"tunecache/key/1\0".to_vec();
    bytes.extend([0x81, 0xa3, b'b', b'i', b'n']);
    match hex.len() {
        n if n < 32 => bytes.push(0xa0 | n as u8),
        n if n < 256 => bytes.extend([0xd9, n as u8]),
        n if n < 65536 => {
            bytes.push(0xda);
            bytes.extend((n as u16).to_be_bytes());
        }
        n => {
            bytes.push(0xdb);
            bytes.extend((n as u32).to_be_bytes());
        }
    }
    bytes.extend(hex.as_bytes());
    Sha256::digest(&bytes)[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn tunecache(dir: &Path, args: &[&str]) -> (bool, String) {
    let bin = built().staticlib.parent().unwrap().join("tunecache");
    if !bin.exists() {
        let status = Command::new(env!("CARGO"))
            .args([
                "build",
                "--locked",
                "-q",
                "-p",
                "cache-cli",
                "--bin",
                "tunecache",
            ])
            .status()
            .unwrap();
        assert!(status.success(), "cargo build -p cache-cli failed");
    }
    let out = Command::new(&bin)
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// `tunecache list` shows every key the harness recorded, with the fingerprint the C++ side
/// reports and an independent computation gives; `explain` finds a key by its `bin` field.
fn cli_reads_what_cpp_recorded(dir: &Path, exe: &Path) {
    let (ok, listed) = tunecache(dir, &["list", "--cache-file", "h.tcache", "--json"]);
    assert!(ok, "tunecache list failed: {listed}");
    let rows: Vec<serde_json::Value> = listed
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let fwd: Vec<_> = rows
        .iter()
        .filter(|r| r["namespace"] == "conv_fwd")
        .collect();
    assert_eq!(fwd.len(), 256, "every key is listed");
    for row in &fwd {
        let hex = row["key"]["bin"].as_str().unwrap();
        assert_eq!(
            row["fingerprint"].as_str().unwrap(),
            independent_fingerprint(hex)
        );
        assert_eq!(row["candidates"], 8);
        assert_eq!(row["best"]["algo"], "algo=0");
    }
    // The C++ side's own view of key 5: its bytes and tc_entry_fingerprint.
    let printed = run(dir, exe, &["fingerprint", "h.tcache", "5"]);
    let (hex, fp) = printed.trim().split_once(' ').unwrap();
    assert_eq!(fp, independent_fingerprint(hex));
    assert!(
        fwd.iter().any(|r| r["fingerprint"] == fp),
        "key 5 is listed"
    );
    let key = format!(r#"{{"bin":"{hex}"}}"#);
    let (ok, explained) = tunecache(
        dir,
        &[
            "explain",
            "--cache-file",
            "h.tcache",
            "-n",
            "conv_fwd",
            "-k",
            &key,
            "--scope",
            SCOPE,
        ],
    );
    assert!(ok, "explain found nothing to use: {explained}");
    assert!(explained.contains("algo=0"), "{explained}");
}

#[test]
fn one_tuner_per_key_across_threads_and_processes() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "tests/c/aten_harness.cpp", false);
    let spawn = || {
        Command::new(&exe)
            .current_dir(dir.path())
            .args(["claims", "h.tcache", "claims.log"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap()
    };
    let (mut a, mut b) = (spawn(), spawn());
    assert!(a.wait().unwrap().success() && b.wait().unwrap().success());
    let log = std::fs::read_to_string(dir.path().join("claims.log")).unwrap();
    let mut keys: Vec<u32> = log.lines().map(|l| l.parse().unwrap()).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        (0..64).collect::<Vec<_>>(),
        "each key measured exactly once by 2 processes x 8 threads"
    );
}

#[test]
fn a_recorder_killed_mid_record_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "tests/c/aten_harness.cpp", false);
    let mut child = Command::new(&exe)
        .current_dir(dir.path())
        .args(["killable", "h.tcache"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut acked = -1;
    while acked < 300 && Instant::now() < deadline {
        let line = lines.next().expect("the recorder prints acks").unwrap();
        acked = line.strip_prefix("acked ").unwrap().parse().unwrap();
    }
    // SAFETY: kill(2) on our own child, not yet waited for.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGKILL) }, 0);
    // Acks printed before the kill landed are acknowledged too.
    for line in lines.map_while(Result::ok) {
        if let Some(n) = line.strip_prefix("acked ") {
            acked = n.parse().unwrap();
        }
    }
    let _ = child.wait();
    let out = run(dir.path(), &exe, &["acked", "h.tcache", &acked.to_string()]);
    assert!(out.contains("all there"), "{out}");
}

#[test]
fn the_shared_library_exports_only_tc_symbols() {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&built().cdylib)
        .output()
        .expect("nm (binutils) is required");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    assert!(names.len() >= 25, "the ABI is exported: {names:?}");
    let foreign: Vec<_> = names.iter().filter(|n| !n.starts_with("tc_")).collect();
    assert!(foreign.is_empty(), "exported besides tc_*: {foreign:?}");
}

#[test]
fn the_example_replaces_a_benchmark_cache_and_persists_it() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "examples/benchmark_cache.cpp", false);
    let first = run(dir.path(), &exe, &["conv.tcache"]);
    assert!(first.contains("benchmarked 3 shapes"), "{first}");
    let second = run(dir.path(), &exe, &["conv.tcache"]);
    assert!(
        second.contains("benchmarked 0 shapes"),
        "a second process reuses them: {second}"
    );
}

/// The C example of docs/c-and-cpp.md, built as that page says: `cargo xtask capi --prefix`, then the
/// compiler with `pkg-config --cflags --libs tunecache` (the shared library).
#[test]
fn the_readme_example_builds_with_pkg_config_and_finds_its_result_the_second_time() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("prefix");
    let status = Command::new(env!("CARGO"))
        .current_dir(CRATE)
        .args([
            "run", "--locked", "-q", "-p", "xtask", "--", "capi", "--prefix",
        ])
        .arg(&prefix)
        .status()
        .unwrap();
    assert!(status.success(), "cargo xtask capi failed");
    let readme = std::fs::read_to_string(Path::new(CRATE).join("../docs/c-and-cpp.md")).unwrap();
    let after = readme
        .split("<!-- c-example:")
        .nth(1)
        .expect("docs/c-and-cpp.md marks its C example");
    let code = after
        .split("```c\n")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    std::fs::write(dir.path().join("example.c"), code).unwrap();
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", "tunecache"])
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
        .output()
        .expect("pkg-config is required");
    assert!(
        flags.status.success(),
        "{}",
        String::from_utf8_lossy(&flags.stderr)
    );
    let flags = String::from_utf8(flags.stdout).unwrap();
    let out = Command::new("cc")
        .current_dir(dir.path())
        .args(["-std=c11", "-Wall", "-Werror", "example.c", "-o", "example"])
        .args(flags.split_whitespace())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let exe = dir.path().join("example");
    assert_eq!(run(dir.path(), &exe, &[]), "", "the first run records");
    assert_eq!(
        run(dir.path(), &exe, &[]),
        "cached: implicit_gemm, 1250 ns\n"
    );
}

#[test]
fn a_child_forked_from_a_threaded_process_opens_its_own_handle_and_nothing_hangs() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "tests/c/fork.c", false);
    let out = run(dir.path(), &exe, &["fork.tcache"]);
    assert!(out.contains("nothing missing"), "{out}");
}

#[test]
fn a_stderr_that_cannot_be_written_loses_warnings_not_the_saver() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "tests/c/stderr_full.c", false);
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let out = Command::new(&exe)
        .current_dir(dir.path())
        .arg("c.tcache")
        .env_remove("TUNECACHE_FILE")
        .env_remove("TUNECACHE_DIR")
        .env_remove("TUNECACHE_REMOTE")
        .stderr(Stdio::from(full))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{} ({}): {stdout}",
        exe.display(),
        out.status
    );
    assert!(stdout.contains("every flush succeeded"), "{stdout}");
}
