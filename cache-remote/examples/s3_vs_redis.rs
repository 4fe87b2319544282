//! The S3 tier beside the Redis tier, in one run on this machine (issue 40's benchmark):
//! publishing 10k keys, a fresh machine reading 1k keys through (prefetched in one call, then
//! looked up), and a 100k-entry generation fetched and opened as a system tier, its first
//! lookup included. Each against a real server started here: `redis-server`, and moto's S3
//! server (`python -m moto.server`, from the test environment: put its `bin` on `PATH`).
//!
//! `cargo run --release -p cache-remote --features s3,testing --example s3_vs_redis`
#![allow(clippy::print_stdout, reason = "a benchmark reports what it measured")]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cache_core::cache_format::{
    Candidate, Entry, Fields, Fingerprint, Key, Limits, Origin, Scope, Stats, Value, now_millis,
};
use cache_core::cache_migrate::Migrations;
use cache_core::settings::Settings;
use cache_core::{BundleWriter, Cache, Namespace, Store};
use cache_remote::{Generations, RemoteBuilder as _, RemoteCache as _};

fn registry() -> Migrations {
    Migrations::new("bench", 1)
}

fn scope() -> Scope {
    Scope::new(Fields::from([("device".to_owned(), Value::from("H100"))]))
}

fn key(id: u64) -> Key {
    Key::new(Fields::from([("id".to_owned(), Value::Int(id as i64))]))
}

fn entry(id: u64) -> Entry {
    let stats = Stats {
        median_ns: 100.0 + id as f64,
        min_ns: 90.0,
        spread_ns: 1.0,
        samples: 9,
    };
    Entry::new(
        key(id),
        Fingerprint::default(),
        Origin::Measured("bench".into()),
        now_millis(),
        [Candidate::measured("tiled", Fields::new(), stats)],
    )
}

fn cache(path: &Path, remote: Arc<dyn cache_remote::Remote>) -> Cache {
    // One publication may take as long as 10k keys need (the default bounds a round at 30 s),
    // and both tiers read with one generous budget: this measures the work, not the default bound.
    let options = cache_remote::RemoteOptions {
        publish_budget: Duration::from_secs(900),
        budget: Duration::from_secs(60),
        ..remote.default_options()
    };
    Cache::builder(registry())
        .file(path)
        .ignore_env()
        .scope(scope())
        .refresh_interval(None)
        .remote_with(remote, options)
        .open()
}

/// Seconds to publish `n` keys from one cache, and to read 1k of them through on a fresh one.
fn tier(dir: &Path, remote: &Arc<dyn cache_remote::Remote>, n: u64) -> (f64, f64) {
    let ns = Namespace::new("matmul").expect("valid");
    let writer = cache(&dir.join("w.tcache"), Arc::clone(remote));
    for id in 0..n {
        writer.put(ns, entry(id));
    }
    let t = Instant::now();
    writer
        .publish_within(Duration::from_secs(900))
        .expect("published");
    let publish = t.elapsed().as_secs_f64();
    let fresh = cache(&dir.join("fresh.tcache"), Arc::clone(remote));
    let fps: Vec<Fingerprint> = (0..1000).map(|id| key(id).fingerprint()).collect();
    let t = Instant::now();
    fresh.prefetch(ns, &fps);
    let found = (0..1000)
        .filter(|id| fresh.lookup(ns, &key(*id)).is_some())
        .count();
    let read = t.elapsed().as_secs_f64();
    assert_eq!(found, 1000, "every key read through {}", remote.describe());
    (publish, read)
}

fn main() {
    let n = 10_000;
    let redis = test_support::redis_server::Server::start().expect("redis-server");
    let s3 = test_support::s3_server::S3Server::start("bench").expect("moto's S3 server");
    for (name, value) in s3.env() {
        // SAFETY: set before any thread of this program reads the environment.
        unsafe { std::env::set_var(name, value) };
    }
    let dir = tempfile::tempdir().expect("dir");
    let redis_remote = cache_remote::connect(&redis.url(), &Settings::from_env()).expect("redis");
    let s3_remote = cache_remote::connect("s3://bench/tier", &Settings::from_env()).expect("s3");
    std::fs::create_dir_all(dir.path().join("r")).expect("dir");
    std::fs::create_dir_all(dir.path().join("s")).expect("dir");
    let (r_pub, r_read) = tier(&dir.path().join("r"), &redis_remote, n);
    let (s_pub, s_read) = tier(&dir.path().join("s"), &s3_remote, n);
    println!("| | Redis | S3 (moto) | S3 / Redis |");
    println!("|---|---|---|---|");
    println!(
        "| publish {n} keys | {r_pub:.2} s | {s_pub:.2} s | {:.1}x |",
        s_pub / r_pub
    );
    println!(
        "| fresh machine, 1k keys read through | {:.0} ms | {:.0} ms | {:.1}x |",
        r_read * 1e3,
        s_read * 1e3,
        s_read / r_read
    );
    // A 100k-entry generation: written as a bundle, published, then fetched and opened.
    let bundle = dir.path().join("gen.tcb");
    // A bundle is written in key order (one scope and namespace here: key fingerprint order).
    let mut sorted: Vec<Entry> = (0..100_000u64).map(entry).collect();
    sorted.sort_by_key(Entry::fingerprint);
    let mut writer =
        BundleWriter::create(&bundle, &registry(), &Limits::default()).expect("bundle");
    for e in sorted {
        writer.add(&scope(), "matmul", &e).expect("added");
    }
    writer.finish(Some(0), "bench").expect("bundle");
    let store =
        cache_remote::S3Remote::open("s3://bench/tier", |k| std::env::var(k).ok()).expect("s3");
    let generations = Generations::new(store);
    let id = generations
        .publish(&bundle, None, Duration::from_secs(600))
        .expect("published");
    let local = dir.path().join("fetched");
    let t = Instant::now();
    let path = generations
        .fetch(&id, &local, Duration::from_secs(600), None)
        .expect("fetched");
    let opened = Cache::builder(registry())
        .disabled(true)
        .ignore_env()
        .scope(scope())
        .system_file(path.clone())
        .open();
    let hit = opened
        .lookup(Namespace::new("matmul").expect("valid"), &key(77_777))
        .is_some();
    let took = t.elapsed().as_secs_f64();
    assert!(hit, "the generation serves its keys");
    let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    println!(
        "| 100k-entry generation ({:.0} MB) fetched, opened, first lookup | | {took:.2} s | |",
        bytes as f64 / 1e6
    );
}
