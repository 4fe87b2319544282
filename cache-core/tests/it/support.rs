//! Shared test helpers: caches in temporary directories, entries, captured warnings, and
//! child processes (this test binary re-executed in a "child role").

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

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

/// A cache of `registry` at `path` that saves only when flushed (or closed), so what a flush
/// wrote is all there is; without `fold`, its results stay in the journal beside the file.
pub(crate) fn saving_on_flush(registry: Migrations, path: &Path, fold: bool) -> Cache {
    Cache::builder(registry)
        .file(path)
        .ignore_env()
        .save_delay(Duration::from_secs(3600))
        .flush_timeout(Duration::from_secs(30))
        .refresh_interval(None)
        .compaction(1e9, if fold { 1 } else { 1 << 30 })
        .open()
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

// ---- child processes (the shared harness of test-support) ----

pub(crate) use test_support::child::{
    ChildGuard, MARK, lines as child_lines, wait_for as wait_for_line,
};
pub(crate) use test_support::{temp_dir, wait_until};

/// Starts this test binary as a child in `role`; see `children::child_process_entry`.
pub(crate) fn spawn_child(
    role: &str,
    path: &Path,
    args: &[String],
    extra_env: &[(&str, &str)],
) -> ChildGuard {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    test_support::child::spawn(role, path, &args, extra_env)
}

pub(crate) fn path_in(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
}

/// The journal beside the cache file `path`.
pub(crate) fn path_in_journal(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".journal");
    PathBuf::from(name)
}
