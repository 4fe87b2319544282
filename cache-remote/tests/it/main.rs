#![allow(
    clippy::print_stdout,
    reason = "tests report the figures they measured"
)]
//! The shared tier: one conformance suite for the `Remote` trait run against all four stores
//! (`conformance`), its policy against the in-process `MemoryRemote` (`policy`), and the Redis
//! backends against a real `redis-server` (sharing between two caches, the commands a hit and
//! a read-only cache send, crafted values, and real faults), and leases on a real S3 API server.

mod conformance;
mod faults;
mod leases;
mod policy;
#[cfg(feature = "s3")]
mod s3_leases;
#[cfg(feature = "s3")]
mod s3_parallel;
#[cfg(feature = "s3")]
mod s3_warm;
mod sharing;
#[cfg(feature = "s3")]
mod trust_vectors;

use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use cache_core::cache_format::{
    Candidate, Entry, Fields, Fingerprint, Key, Origin, Scope, Stats, Value, now_millis,
};
use cache_core::cache_migrate::Migrations;
use cache_core::{Cache, Namespace};
use cache_remote::{RedisRemote, Remote, RemoteBuilder as _, RemoteOptions};

pub(crate) fn registry() -> Migrations {
    Migrations::new("remoteapp", 1)
}

pub(crate) fn scope() -> Scope {
    Scope::new(Fields::from([("device".to_owned(), Value::from("H100"))]))
}

pub(crate) fn ns() -> Namespace {
    Namespace::new("matmul").expect("valid")
}

pub(crate) fn key(id: u64) -> Key {
    Key::new(Fields::from([("id".to_owned(), Value::Int(id as i64))]))
}

pub(crate) fn entry(id: u64, algo: &str, median: f64) -> Entry {
    let stats = Stats {
        median_ns: median,
        min_ns: median * 0.9,
        spread_ns: 1.0,
        samples: 9,
    };
    let mut c = Candidate::measured(algo, Fields::new(), stats);
    c.measured_at = now_millis();
    Entry::new(
        key(id),
        Fingerprint::default(),
        Origin::Measured("test".into()),
        now_millis(),
        [c],
    )
}

pub(crate) fn remote_key(id: u64) -> String {
    cache_remote::remote_key(
        "remoteapp",
        1,
        &scope().fingerprint(),
        "matmul",
        &key(id).fingerprint(),
    )
}

/// A cache on `path` sharing the server at `url`.
pub(crate) fn cache(path: &Path, url: &str, options: RemoteOptions) -> Cache {
    let remote = RedisRemote::open(url).expect("a valid address");
    Cache::builder(registry())
        .file(path)
        .ignore_env()
        .scope(scope())
        .save_delay(Duration::from_millis(20))
        .refresh_interval(None)
        .remote_with(Arc::new(remote) as Arc<dyn Remote>, options)
        .open()
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

/// Captured WARN lines that mention `needle`.
pub(crate) fn warnings_about(needle: &str) -> Vec<String> {
    LOGS.lock()
        .unwrap_or_else(|p| p.into_inner())
        .lines()
        .filter(|l| l.contains("WARN") && l.contains(needle))
        .map(str::to_owned)
        .collect()
}
