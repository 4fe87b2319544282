//! The S3 tier's batches against a bucket that answers requests in parallel, each after a
//! fixed added latency (20 ms, a cross-region bucket's order): an in-process S3 endpoint
//! (test-support's `FakeHttp`, one thread a connection) that keeps objects with ETags and
//! honours `If-None-Match: *` and `If-Match`, so what is measured is tunecache's concurrency,
//! not a server's speed (moto answers one request at a time). Publishing 10,000 keys, and a
//! fresh machine's 1,000-key prefetch with the default read budget, at
//! `TUNECACHE_REMOTE_PARALLEL` 8 (what the store sent before) and 64 (the default), in one
//! run, with the requests each made.
//!
//! `cargo run --release -p cache-remote --features s3,testing --example s3_parallel`
#![allow(clippy::print_stdout, reason = "a benchmark reports what it measured")]

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cache_core::cache_format::{
    Candidate, Entry, Fields, Fingerprint, Key, Origin, Scope, Stats, Value, now_millis,
};
use cache_core::cache_migrate::Migrations;
use cache_core::{Cache, Namespace, Store};
use cache_remote::{Remote, RemoteBuilder as _, RemoteCache as _, S3Remote};
use test_support::fake_http::{FakeHttp, Reply, Request};

const LATENCY: Duration = Duration::from_millis(20);

/// Objects by path, each with its ETag; requests counted.
#[derive(Default)]
struct Bucket {
    objects: Mutex<HashMap<String, (u64, Vec<u8>)>>,
    etags: AtomicU64,
    gets: AtomicU64,
    puts: AtomicU64,
}

impl Bucket {
    fn answer(&self, r: &Request) -> Reply {
        std::thread::sleep(LATENCY);
        let path = r.target.split('?').next().unwrap_or("").to_owned();
        let mut objects = self.objects.lock().unwrap_or_else(|p| p.into_inner());
        let tag = |etag: u64| vec![("etag".to_owned(), format!("\"{etag}\""))];
        match r.method.as_str() {
            "GET" => {
                self.gets.fetch_add(1, Ordering::Relaxed);
                match objects.get(&path) {
                    Some((etag, body)) => Reply::With(200, tag(*etag), body.clone()),
                    None => Reply::With(
                        404,
                        Vec::new(),
                        b"<Error><Code>NoSuchKey</Code></Error>".to_vec(),
                    ),
                }
            }
            "PUT" => {
                self.puts.fetch_add(1, Ordering::Relaxed);
                let held = objects.get(&path).map(|(e, _)| format!("\"{e}\""));
                let refused = match (r.header("if-none-match"), r.header("if-match")) {
                    (Some("*"), _) => held.is_some(),
                    (_, Some(want)) => held.as_deref() != Some(want),
                    _ => false,
                };
                if refused {
                    return Reply::With(412, Vec::new(), Vec::new());
                }
                let etag = self.etags.fetch_add(1, Ordering::Relaxed) + 1;
                objects.insert(path, (etag, r.body.clone()));
                Reply::With(200, tag(etag), Vec::new())
            }
            _ => Reply::With(501, Vec::new(), Vec::new()),
        }
    }

    fn requests(&self) -> u64 {
        self.gets.swap(0, Ordering::Relaxed) + self.puts.swap(0, Ordering::Relaxed)
    }
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

fn cache(path: &Path, remote: Arc<dyn Remote>, publish_budget: Duration) -> Cache {
    // The store's own options (a one-second read budget, per round of a batch), with a
    // publication allowed as long as 10k keys need: this measures the work.
    let options = cache_remote::RemoteOptions {
        publish_budget,
        ..remote.default_options()
    };
    Cache::builder(Migrations::new("bench", 1))
        .file(path)
        .ignore_env()
        .scope(scope())
        .refresh_interval(None)
        .remote_with(remote, options)
        .open()
}

/// Publishes `n` keys from one cache, then prefetches 1k of them on a fresh one: the seconds
/// and requests of each, and how many keys the prefetch found.
fn run(dir: &Path, bucket: &Arc<Bucket>, url: &str, parallel: &str, n: u64) -> [f64; 5] {
    let prefix = format!("s3://bench/p{parallel}");
    let remote: Arc<dyn Remote> = Arc::new(
        S3Remote::open(&prefix, |name| match name {
            "AWS_ENDPOINT_URL" => Some(url.to_owned()),
            "AWS_ACCESS_KEY_ID" | "AWS_SECRET_ACCESS_KEY" => Some("bench".to_owned()),
            "TUNECACHE_REMOTE_PARALLEL" => Some(parallel.to_owned()),
            _ => None,
        })
        .expect("address"),
    );
    let ns = Namespace::new("matmul").expect("valid");
    let long = Duration::from_secs(900);
    let writer = cache(
        &dir.join(format!("w{parallel}.tcache")),
        Arc::clone(&remote),
        long,
    );
    for id in 0..n {
        writer.put(ns, entry(id));
    }
    bucket.requests();
    let t = Instant::now();
    writer.publish_within(long).expect("published");
    let publish = t.elapsed().as_secs_f64();
    let publish_requests = bucket.requests() as f64;
    let fresh = cache(&dir.join(format!("f{parallel}.tcache")), remote, long);
    let fps: Vec<Fingerprint> = (0..1000).map(|id| key(id).fingerprint()).collect();
    let t = Instant::now();
    let found = fresh.prefetch(ns, &fps) as f64;
    let read = t.elapsed().as_secs_f64();
    let read_requests = bucket.requests() as f64;
    [publish, publish_requests, read, read_requests, found]
}

fn main() {
    let n = 10_000;
    let bucket = Arc::new(Bucket::default());
    let server = FakeHttp::start({
        let bucket = Arc::clone(&bucket);
        move |r| bucket.answer(r)
    });
    let dir = tempfile::tempdir().expect("dir");
    println!(
        "| requests at once | publish {n} keys | its requests | 1k-key prefetch, default budget | its requests | found |"
    );
    println!("|---|---|---|---|---|---|");
    for parallel in ["8", "64"] {
        let [p, pr, r, rr, found] = run(dir.path(), &bucket, &server.url(), parallel, n);
        println!(
            "| {parallel} | {p:.2} s | {pr:.0} | {:.0} ms | {rr:.0} | {found:.0} |",
            r * 1e3
        );
    }
}
