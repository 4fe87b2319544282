//! Shared test helpers: caches in temporary directories, entries, captured warnings, and
//! child processes (this test binary re-executed in a "child role").

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use cache_core::cache_format::{
    Candidate, Entry, Fields, Fingerprint, Key, Origin, Scope, Stats, Value,
};
use cache_core::cache_migrate::Migrations;
use cache_core::{Cache, CacheBuilder, Namespace};

pub(crate) const APP: &str = "testapp";

pub(crate) fn registry(schema: u32) -> Migrations {
    Migrations::new(APP, schema)
}

/// A builder for `path` with test-friendly timings and no environment.
pub(crate) fn builder(path: &Path) -> CacheBuilder {
    Cache::builder(registry(1))
        .file(path)
        .ignore_env()
        .save_delay(Duration::from_millis(20))
        .lock_timeout(Duration::from_secs(10))
        .flush_timeout(Duration::from_secs(30))
        .refresh_interval(None)
}

pub(crate) fn ns() -> Namespace {
    Namespace::new("matmul").expect("valid name")
}

pub(crate) fn key(writer: u64, id: u64) -> Key {
    Key::new(Fields::from([
        ("writer".to_owned(), Value::Int(writer as i64)),
        ("id".to_owned(), Value::Int(id as i64)),
    ]))
}

/// An entry whose winner encodes `id`, so a test can check it came back intact.
pub(crate) fn entry(writer: u64, id: u64) -> Entry {
    let params = Fields::from([("tile".to_owned(), Value::Int((id % 7) as i64))]);
    let stats = Stats {
        median_ns: 1000.0 + id as f64,
        min_ns: 900.0,
        spread_ns: 3.0,
        samples: 9,
    };
    Entry::new(
        key(writer, id),
        Fingerprint::default(),
        Origin::Measured(format!("writer {writer}")),
        cache_core::cache_format::now_millis(),
        [Candidate::measured("tiled", params, stats)],
    )
}

pub(crate) fn scope(device: &str) -> Scope {
    Scope::new(Fields::from([("device".to_owned(), Value::from(device))]))
}

/// Whether `cache` holds the entry `entry(writer, id)`.
pub(crate) fn has(cache: &Cache, writer: u64, id: u64) -> bool {
    use cache_core::Store;
    cache.lookup(ns(), &key(writer, id)).is_some_and(|e| {
        e.best()
            .is_some_and(|c| c.stats().is_some_and(|s| s.median_ns == 1000.0 + id as f64))
    })
}

/// Opens `path` afresh (the way a new process would) and lists which ids of `writer` exist.
pub(crate) fn ids_on_disk(path: &Path, writer: u64, upto: u64) -> Vec<u64> {
    let cache = builder(path).open();
    (0..upto).filter(|&i| has(&cache, writer, i)).collect()
}

pub(crate) fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("tunecache-test-")
        .tempdir()
        .expect("temp dir")
}

pub(crate) fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

// ---- captured warnings ----

static LOGS: Mutex<String> = Mutex::new(String::new());

struct Capture;

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_str(&String::from_utf8_lossy(buf));
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the capturing subscriber (once per test binary).
pub(crate) fn capture_logs() {
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| {
        let _ = tracing_subscriber::fmt()
            .with_writer(|| Capture)
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .try_init();
    });
}

/// Captured WARN lines that mention `needle` (tests use their unique temp path).
pub(crate) fn warnings_about(needle: &str) -> Vec<String> {
    LOGS.lock()
        .unwrap_or_else(|p| p.into_inner())
        .lines()
        .filter(|l| l.contains("WARN") && l.contains(needle))
        .map(str::to_owned)
        .collect()
}

/// Captured lines of any level that mention `needle`.
pub(crate) fn logs_about(needle: &str) -> Vec<String> {
    LOGS.lock()
        .unwrap_or_else(|p| p.into_inner())
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_owned)
        .collect()
}

// ---- child processes ----

/// Marks the lines of the parent-child protocol (libtest's own output shares the pipe).
pub(crate) const MARK: &str = "TC> ";

/// A child process that is killed when dropped, so a failing test never leaves one behind.
pub(crate) struct ChildGuard(pub(crate) Child);

impl std::ops::Deref for ChildGuard {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for ChildGuard {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Starts this test binary as a child in `role`; see `children::child_process_entry`.
pub(crate) fn spawn_child(
    role: &str,
    path: &Path,
    args: &[String],
    extra_env: &[(&str, &str)],
) -> ChildGuard {
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = Command::new(exe);
    cmd.args([
        "children::child_process_entry",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("TUNECACHE_TEST_CHILD", role)
    .env("TUNECACHE_TEST_PATH", path)
    .env("TUNECACHE_TEST_ARGS", args.join(" "))
    .env_remove("TUNECACHE_DIR")
    .env_remove("TUNECACHE_FILE")
    .env_remove("TUNECACHE_DISABLE")
    .env_remove("TUNECACHE_READ_ONLY")
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    ChildGuard(cmd.spawn().expect("spawn child process"))
}

/// The protocol message in a line of child output, if it has one.
pub(crate) fn message(line: &str) -> Option<&str> {
    line.find(MARK).map(|at| &line[at + MARK.len()..])
}

/// Reads the child's protocol messages until it exits.
pub(crate) fn child_lines(child: &mut Child) -> Vec<String> {
    let out = child.stdout.take().expect("piped stdout");
    BufReader::new(out)
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| message(&l).map(str::to_owned))
        .collect()
}

/// Waits for one stdout line equal to `line`.
pub(crate) fn wait_for_line(child: &mut Child, line: &str) -> BufReader<std::process::ChildStdout> {
    let out = child.stdout.take().expect("piped stdout");
    let mut reader = BufReader::new(out);
    let mut buf = String::new();
    loop {
        buf.clear();
        let n = reader.read_line(&mut buf).expect("read child stdout");
        assert!(n > 0, "child exited before printing {line:?}");
        if message(buf.trim_end()) == Some(line) {
            return reader;
        }
    }
}

pub(crate) fn path_in(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
}
