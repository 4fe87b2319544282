//! Benchmarks of the shared tier against a real `redis-server` on loopback (started here):
//! a remote miss that becomes a hit, a miss the server cannot answer with and without the
//! fleet lease a tuner takes next, a batch of 1,000 keys in one round trip, and a miss while
//! the server is unreachable, each beside the local hit and local miss measured in the same
//! run (this machine is shared and noisy: compare ratios).
//!
//! Run with `cargo bench -p cache-remote` (needs `redis-server` on `PATH`).
#![allow(
    clippy::print_stdout,
    reason = "benchmarks report what they could not run"
)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cache_core::cache_format::{
    Candidate, Entry, Fields, Fingerprint, Key, Origin, Scope, Stats, Value, now_millis,
};
use cache_core::cache_migrate::Migrations;
use cache_core::{Cache, Namespace, Store};
use cache_remote::RedisRemote;
use cache_remote::{
    Remote, RemoteBuilder as _, RemoteCache as _, RemoteOptions, encode_value, remote_key,
};
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use test_support::redis_server::Server;

/// Keys stored on the server: enough that no iteration of the miss benchmark repeats one.
const STORED: u64 = 60_000;

fn registry() -> Migrations {
    Migrations::new("benchapp", 1)
}

fn scope() -> Scope {
    Scope::new(Fields::from([("device".to_owned(), Value::from("bench"))]))
}

fn key(i: u64) -> Key {
    Key::new(Fields::from([
        ("m".to_owned(), Value::Int(i as i64)),
        ("dtype".to_owned(), Value::from("f16")),
    ]))
}

fn entry(i: u64) -> Entry {
    let stats = Stats {
        median_ns: 1000.0 + i as f64,
        min_ns: 900.0,
        spread_ns: 5.0,
        samples: 15,
    };
    let candidates = (0..6).map(|t| {
        let params = Fields::from([("tile".to_owned(), Value::Int(16 << t))]);
        let mut c = Candidate::measured("tiled", params, stats);
        c.measured_at = now_millis();
        c
    });
    Entry::new(
        key(i),
        Fingerprint::default(),
        Origin::Measured("bench".into()),
        now_millis(),
        candidates,
    )
}

/// A memory-only cache (no file) on `url`.
fn cache(url: &str) -> Cache {
    Cache::builder(registry())
        .ignore_env()
        .disabled(true)
        .scope(scope())
        .remote_with(
            Arc::new(RedisRemote::open(url).expect("url")) as Arc<dyn Remote>,
            RemoteOptions {
                budget: Duration::from_millis(200),
                ..RemoteOptions::default()
            },
        )
        .open()
}

fn fill(server: &Server) {
    let mut conn = server.admin().expect("server");
    for chunk in (0..STORED).collect::<Vec<_>>().chunks(1000) {
        let mut pipe = redis::pipe();
        for &i in chunk {
            let k = remote_key(
                "benchapp",
                1,
                &scope().fingerprint(),
                "matmul",
                &key(i).fingerprint(),
            );
            pipe.cmd("SET")
                .arg(k)
                .arg(encode_value(&registry(), &scope(), "matmul", &entry(i)))
                .ignore();
        }
        let () = pipe.query(&mut conn).expect("fill");
    }
}

fn shared_tier(c: &mut Criterion) {
    let Some(server) = Server::start() else {
        println!("redis-server is not available: the shared-tier benchmarks did not run");
        return;
    };
    fill(&server);
    let ns = Namespace::new("matmul").expect("name");
    let fps: Vec<Fingerprint> = (0..STORED).map(|i| key(i).fingerprint()).collect();
    let mut group = c.benchmark_group("shared_tier");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(5));

    let local = cache(&server.url());
    local.put(ns, entry(STORED + 1));
    let local_fp = key(STORED + 1).fingerprint();
    group.bench_function("local_hit", |b| {
        b.iter(|| black_box(local.get(ns, black_box(&local_fp))))
    });

    // Each iteration asks for a key memory lacks and the server has: one round trip, the
    // checks, the merge into memory.
    let reader = cache(&server.url());
    let mut next = 0usize;
    group.bench_function("remote_miss_to_hit", |b| {
        b.iter_custom(|iters| {
            let started = Instant::now();
            for _ in 0..iters {
                let fp = &fps[next % fps.len()];
                next += 1;
                assert!(reader.get(ns, fp).is_some());
            }
            started.elapsed()
        })
    });

    // A key the server lacks: one round trip that finds nothing; then the same miss followed
    // by what a tuner does before measuring it (the fleet lease: taken, then given back).
    let absent = cache(&server.url());
    let mut fresh = STORED + 1_000;
    group.bench_function("remote_miss_absent", |b| {
        b.iter(|| {
            fresh += 1;
            assert!(absent.get(ns, &key(fresh).fingerprint()).is_none());
        })
    });
    lease_benches(&mut group, &absent, ns, &mut fresh);

    // 1,000 keys in one round trip, into a fresh cache each time.
    let mut start = 0usize;
    group.bench_function("prefetch_1000", |b| {
        b.iter_batched(
            || {
                start = (start + 1000) % (fps.len() - 1000);
                (cache(&server.url()), start)
            },
            |(c, at)| assert_eq!(c.prefetch(ns, &fps[at..at + 1000]), 1000),
            BatchSize::PerIteration,
        )
    });
    group.finish();

    // A miss while the server is down (after the first, which paid the budget).
    let mut group = c.benchmark_group("unreachable");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(3));
    let down = cache("redis://127.0.0.1:1/0");
    let _ = down.get(ns, &fps[0]);
    let memory_only = Cache::builder(registry())
        .ignore_env()
        .disabled(true)
        .scope(scope())
        .open();
    let mut i = 0usize;
    group.bench_function("local_miss_no_remote", |b| {
        b.iter(|| {
            i += 1;
            black_box(memory_only.get(ns, &fps[i % fps.len()]))
        })
    });
    group.bench_function("miss_breaker_open", |b| {
        b.iter(|| {
            i += 1;
            black_box(down.get(ns, &fps[i % fps.len()]))
        })
    });
    group.finish();
}

criterion_group!(benches, shared_tier);
criterion_main!(benches);

/// A miss followed by the fleet lease a tuner takes next, and a tuner's miss in full (read,
/// record, publish) without and with the lease.
fn lease_benches(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    absent: &Cache,
    ns: Namespace,
    fresh: &mut u64,
) {
    group.bench_function("remote_miss_absent_then_lease", |b| {
        b.iter(|| {
            *fresh += 1;
            let fp = key(*fresh).fingerprint();
            assert!(absent.get(ns, &fp).is_none());
            let claim = absent
                .remote()
                .expect("remote")
                .claim(ns, &fp, Duration::from_secs(1));
            assert!(
                matches!(claim, cache_remote::FleetClaim::Lead(_)),
                "{claim:?}"
            );
        })
    });
    // What a tuner's miss costs the shared tier in full: the miss, the result recorded and
    // published; then the same with the fleet lease taken before measuring and finished with
    // the publication (which releases it in the same step).
    group.bench_function("miss_then_publish", |b| {
        b.iter(|| {
            *fresh += 1;
            let k = key(*fresh);
            assert!(absent.get(ns, &k.fingerprint()).is_none());
            absent.put(ns, entry(*fresh));
            absent
                .publish_within(Duration::from_secs(2))
                .expect("published");
        })
    });
    group.bench_function("miss_lease_then_publish", |b| {
        b.iter(|| {
            *fresh += 1;
            let k = key(*fresh);
            assert!(absent.get(ns, &k.fingerprint()).is_none());
            let cache_remote::FleetClaim::Lead(lease) = absent.remote().expect("remote").claim(
                ns,
                &k.fingerprint(),
                Duration::from_secs(1),
            ) else {
                panic!("leads");
            };
            absent.put(ns, entry(*fresh));
            lease.finish(Duration::from_secs(2)).expect("published");
        })
    });
}
