//! A fresh machine whose bucket has a current generation (and pins none) warms from it: one
//! pointer read, one download and one listing, then every key the generation holds is served
//! from it, while keys published one at a time after it, and keys it lacks, are read per key.
//! On a real S3 API server (moto), behind a proxy that counts the requests.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cache_core::cache_format::Limits;
use cache_core::settings::Settings;
use cache_core::{BundleWriter, Cache, Store as _};
use cache_remote::{Generations, RemoteBuilder as _, RemoteCache as _, S3Remote};
use test_support::fake_http::Proxy;
use test_support::s3_server::S3Server;

use crate::{entry, key, ns, registry, scope};

const BUCKET: &str = "warm-up";
const KEYS: u64 = 1_000;

/// The settings of a machine reading the bucket at `endpoint`, with `extra`.
fn settings(endpoint: &str, extra: &[(&str, &str)]) -> Settings {
    let mut s = Settings::default()
        .with("TUNECACHE_REMOTE", format!("s3://{BUCKET}/fleet"))
        .and_then(|s| s.with("TUNECACHE_REMOTE_TIMEOUT_MS", "5000"))
        .and_then(|s| s.with("AWS_ENDPOINT_URL", endpoint))
        .and_then(|s| s.with("AWS_ACCESS_KEY_ID", "testing"))
        .and_then(|s| s.with("AWS_SECRET_ACCESS_KEY", "testing"))
        .and_then(|s| s.with("AWS_REGION", "us-east-1"))
        .expect("known settings");
    for (name, value) in extra {
        s = s.with(name, *value).expect("a known setting");
    }
    s
}

fn machine(file: &Path, settings: Settings) -> Cache {
    Cache::builder(registry())
        .file(file)
        .with_settings(settings)
        .scope(scope())
        .save_delay(Duration::from_millis(20))
        .refresh_interval(None)
        .remote_from_env()
        .expect("a usable address")
        .open()
}

/// The state of the cache's generation tier, if it has one.
fn generation_state(cache: &Cache) -> Option<String> {
    cache
        .health()
        .tiers
        .into_iter()
        .find(|t| t.name == "generation")
        .map(|t| t.state.unwrap_or_default())
}

/// Publishes a generation holding keys `0..KEYS` measured as `old`, straight to moto.
fn publish_generation(server: &S3Server, dir: &Path) -> String {
    let bundle = dir.join("g.tcb");
    let mut writer =
        BundleWriter::create(&bundle, &registry(), &Limits::default()).expect("a bundle");
    // A bundle is written in key order (one scope and namespace: by fingerprint).
    let mut entries: Vec<_> = (0..KEYS).map(|id| entry(id, "old", 500.0)).collect();
    entries.sort_by_key(cache_core::cache_format::Entry::fingerprint);
    for e in &entries {
        writer.add(&scope(), "matmul", e).expect("added");
    }
    writer.finish(Some(0), "test").expect("finished");
    let env = server.env();
    let store = S3Remote::open(&format!("s3://{BUCKET}/fleet"), |name| {
        env.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone())
    })
    .expect("an address");
    Generations::new(store)
        .publish(&bundle, None, Duration::from_secs(30))
        .expect("published")
}

#[test]
fn a_fresh_machine_warms_from_the_current_generation_and_reads_newer_keys_per_key() {
    let Some(server) = S3Server::start(BUCKET) else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    publish_generation(&server, dir.path());
    // After it (the store's clock counts whole seconds), another machine publishes faster
    // results for ten of its keys, and one key it lacks.
    std::thread::sleep(Duration::from_millis(1100));
    let publisher = machine(
        &dir.path().join("publisher/p.tcache"),
        settings(&server.endpoint(), &[("TUNECACHE_GENERATION", "off")]),
    );
    let newer: Vec<u64> = (0..10).map(|i| i * 97).chain([KEYS]).collect();
    for &id in &newer {
        publisher.put(ns(), entry(id, "new", 100.0));
    }
    publisher
        .publish_within(Duration::from_secs(30))
        .expect("published");
    drop(publisher);

    // A fresh machine, every request counted.
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let proxy = Proxy::start(server.port, {
        let seen = Arc::clone(&seen);
        move |r| {
            seen.lock()
                .expect("not poisoned")
                .push(format!("{} {}", r.method, r.target));
            false
        }
    });
    let fresh = machine(
        &dir.path().join("fresh/f.tcache"),
        settings(&proxy.url(), &[]),
    );
    let started = Instant::now();
    while generation_state(&fresh).as_deref() != Some("ready") {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the warm-up did not finish: {:?} {:?}",
            generation_state(&fresh),
            seen.lock().expect("not poisoned")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let warm_up: Vec<String> = seen.lock().expect("not poisoned").drain(..).collect();
    assert_eq!(
        warm_up.len(),
        3,
        "a pointer read, a download and a listing: {warm_up:#?}"
    );
    for id in 0..=KEYS {
        let got = fresh.get(ns(), &key(id).fingerprint()).expect("found");
        let algo = &got.candidates()[0].id.algorithm;
        let want = if newer.contains(&id) { "new" } else { "old" };
        assert_eq!(algo, want, "key {id}");
    }
    let lookups: Vec<String> = seen.lock().expect("not poisoned").drain(..).collect();
    assert!(
        lookups.len() <= newer.len(),
        "only the keys published after the generation, or not in it, are read per key: {} \
         requests {lookups:#?}",
        lookups.len()
    );
    let health = fresh
        .health()
        .tiers
        .into_iter()
        .find(|t| t.name == "generation")
        .expect("a generation tier");
    assert_eq!(health.counter("keys published after it"), 11, "{health:?}");
    assert_eq!(health.counter("hits"), KEYS - 10, "{health:?}");

    // Turned off: no generation tier, and keys are read one at a time, as before (a key
    // only the generation holds is then not found).
    let off = machine(
        &dir.path().join("off/o.tcache"),
        settings(&proxy.url(), &[("TUNECACHE_GENERATION", "off")]),
    );
    assert_eq!(generation_state(&off), None);
    // In any case; and a cache without a file is not warmed (it writes nothing anywhere).
    let upper = machine(
        &dir.path().join("upper/u.tcache"),
        settings(&proxy.url(), &[("TUNECACHE_GENERATION", "OFF")]),
    );
    assert_eq!(generation_state(&upper), None);
    let disabled = Cache::builder(registry())
        .file(dir.path().join("disabled/d.tcache"))
        .disabled(true)
        .with_settings(settings(&proxy.url(), &[]))
        .scope(scope())
        .remote_from_env()
        .expect("a usable address")
        .open();
    assert_eq!(generation_state(&disabled), None);
    assert!(off.get(ns(), &key(5).fingerprint()).is_none());
    let per_key = off.get(ns(), &key(97).fingerprint()).expect("read per key");
    assert_eq!(per_key.candidates()[0].id.algorithm, "new");
}
