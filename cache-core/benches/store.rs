//! Benchmarks of the store: hits, recording, loading and saving a 100k-entry cache.
//!
//! Run with `cargo bench -p cache-core`. Figures go in the issue notes, as ratios against a
//! baseline measured in the same run where one exists (this machine is shared and noisy).
#![allow(
    clippy::print_stdout,
    reason = "benchmarks report the size of their inputs"
)]

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cache_core::cache_format::{
    CacheData, Candidate, Entry, Fields, Fingerprint, Key, Origin, Scope, Stats, Value,
    encode_snapshot,
};
use cache_core::cache_migrate::Migrations;
use cache_core::{Cache, MemoryStore, Namespace, Store};
use criterion::{Criterion, criterion_group, criterion_main};
use serde::Serialize;

#[derive(Serialize, Clone, Copy)]
struct MatmulKey {
    m: u32,
    n: u32,
    k: u32,
    dtype: &'static str,
}

fn key_of(i: u64) -> MatmulKey {
    MatmulKey {
        m: 64 + (i % 97) as u32 * 16,
        n: 64 + (i / 97 % 101) as u32 * 16,
        k: 64 + (i / 9797) as u32 * 16,
        dtype: "float16",
    }
}

fn entry(i: u64) -> Entry {
    let key = Key::from_serialize(&key_of(i)).expect("valid key");
    let cand = |algo: &str, tile: i64, t: f64| {
        Candidate::measured(
            algo,
            Fields::from([
                ("tile".to_owned(), Value::Int(tile)),
                ("order".to_owned(), Value::from("ikj")),
            ]),
            Stats {
                median_ns: t,
                min_ns: t * 0.95,
                spread_ns: t * 0.01,
                samples: 15,
            },
        )
    };
    Entry::new(
        key,
        Fingerprint([7; 16]),
        Origin::Measured("bench".into()),
        1_700_000_000_000 + i,
        [
            cand("tiled", 32, 1000.0 + i as f64),
            cand("tiled", 64, 1100.0),
            cand("naive", 0, 5000.0),
        ],
    )
}

fn big_file(n: u64) -> Vec<u8> {
    let mut data = CacheData::new();
    for i in 0..n {
        data.insert(&Scope::default(), "matmul", entry(i));
    }
    encode_snapshot("bench", 1, &data)
}

fn registry() -> Migrations {
    Migrations::new("bench", 1)
}

/// Times `iters` calls of `mine` on this thread while another thread calls `theirs` the
/// whole time.
fn with_neighbour(iters: u64, theirs: impl Fn() + Sync, mine: impl Fn()) -> Duration {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                theirs();
            }
        });
        let start = Instant::now();
        for _ in 0..iters {
            mine();
        }
        let took = start.elapsed();
        stop.store(true, Ordering::Relaxed);
        took
    })
}

fn hits(c: &mut Criterion) {
    let ns = Namespace::new("matmul").expect("valid");
    let store = MemoryStore::new();
    for i in 0..10_000 {
        store.merge(ns, entry(i));
    }
    let fp = Key::from_serialize(&key_of(4242))
        .expect("key")
        .fingerprint();
    let mut group = c.benchmark_group("hit");
    group.bench_function("precomputed_fingerprint", |b| {
        b.iter(|| store.get(black_box(ns), black_box(&fp)))
    });
    let k = key_of(4242);
    group.bench_function("from_key_struct", |b| {
        b.iter(|| {
            let key = Key::from_serialize(black_box(&k)).expect("key");
            store.get(ns, &key.fingerprint())
        })
    });
    group.bench_function("precomputed_fingerprint_2_threads", |b| {
        // A second thread hits the same key the whole time; we time this thread's hits.
        b.iter_custom(|iters| {
            with_neighbour(
                iters,
                || {
                    black_box(store.get(ns, &fp));
                },
                || {
                    black_box(store.get(black_box(ns), black_box(&fp)));
                },
            )
        })
    });
    let other_fp = Key::from_serialize(&key_of(777))
        .expect("key")
        .fingerprint();
    group.bench_function("precomputed_fingerprint_2_threads_other_key", |b| {
        b.iter_custom(|iters| {
            with_neighbour(
                iters,
                || {
                    black_box(store.get(ns, &other_fp));
                },
                || {
                    black_box(store.get(black_box(ns), black_box(&fp)));
                },
            )
        })
    });
    group.bench_function("with_entry_2_threads", |b| {
        // The same key from both threads, through the accessor that takes no reference.
        b.iter_custom(|iters| {
            with_neighbour(
                iters,
                || {
                    black_box(store.with_entry(ns, &fp, |e| e.candidates().len()));
                },
                || {
                    black_box(
                        store.with_entry(black_box(ns), black_box(&fp), |e| e.candidates().len()),
                    );
                },
            )
        })
    });
    let miss = Key::from_serialize(&MatmulKey {
        m: 1,
        n: 1,
        k: 1,
        dtype: "x",
    })
    .expect("key")
    .fingerprint();
    group.bench_function("miss", |b| {
        b.iter(|| store.get(black_box(ns), black_box(&miss)))
    });
    group.bench_function("with_entry", |b| {
        b.iter(|| store.with_entry(black_box(ns), black_box(&fp), |e| e.candidates().len()))
    });
    // What a hit through `get` adds to the lookup (`miss`, `with_entry`): the reference count
    // of the entry it returns, taken and given back. Timed in the same run, for the ratio.
    let held = store.get(ns, &fp).expect("a hit");
    group.bench_function("baseline_arc_clone_and_drop", |b| {
        b.iter(|| Arc::clone(black_box(&held)))
    });
    group.finish();
}

fn record(c: &mut Criterion) {
    let ns = Namespace::new("matmul").expect("valid");
    let dir = tempfile::tempdir().expect("dir");
    // A long save delay keeps the saver out of the measurement: this is the caller's cost.
    let cache = Cache::builder(registry())
        .file(dir.path().join("r.tcache"))
        .ignore_env()
        .save_delay(Duration::from_secs(3600))
        .refresh_interval(None)
        .open();
    let mut i = 0u64;
    c.bench_function("record_one_result", |b| {
        b.iter_batched(
            || {
                i += 1;
                entry(i % 50_000)
            },
            |e| cache.put(ns, e),
            criterion::BatchSize::SmallInput,
        )
    });
    // The baseline in the same run (issue 54's goal: a put at most 5x it): the same entries
    // inserted into a mutex-guarded `HashMap` by key fingerprint, the entry it replaces
    // dropped, as a framework's own in-process cache keeps its results.
    let map: std::sync::Mutex<std::collections::HashMap<Fingerprint, Entry>> =
        std::sync::Mutex::default();
    let mut i = 0u64;
    c.bench_function("record_baseline_mutex_hashmap_insert", |b| {
        b.iter_batched(
            || {
                i += 1;
                entry(i % 50_000)
            },
            |e| {
                let replaced = map.lock().expect("not poisoned").insert(e.fingerprint(), e);
                drop(black_box(replaced));
            },
            criterion::BatchSize::SmallInput,
        )
    });
}

/// A put into the memory tier of a small and of a large store: the cost should not grow with
/// the store (issue 10: it copied a whole shard, N/1024 entries, so N puts were quadratic).
fn put_by_size(c: &mut Criterion) {
    let ns = Namespace::new("matmul").expect("valid");
    let mut group = c.benchmark_group("memory_put");
    for n in [10_000u64, 1_000_000] {
        let store = MemoryStore::new();
        store.merge_many((0..n).map(|i| (ns, entry(i))));
        let mut i = n;
        group.bench_function(format!("into_{n}"), |b| {
            b.iter_batched(
                || {
                    i += 1;
                    entry(i)
                },
                |e| store.merge(ns, e),
                criterion::BatchSize::SmallInput,
            )
        });
    }
    // An update of a key the store holds (a re-measurement merged into its entry).
    let store = MemoryStore::new();
    store.merge_many((0..10_000u64).map(|i| (ns, entry(i))));
    let mut i = 0u64;
    group.bench_function("update_in_10000", |b| {
        b.iter_batched(
            || {
                i += 1;
                entry(i % 10_000)
            },
            |e| store.merge(ns, e),
            criterion::BatchSize::SmallInput,
        )
    });
    group.finish();
}

fn load_and_save(c: &mut Criterion) {
    let ns = Namespace::new("matmul").expect("valid");
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("big.tcache");
    let bytes = big_file(100_000);
    std::fs::write(&path, &bytes).expect("write");
    println!("100k-entry file: {} bytes", bytes.len());
    if let Ok(out) = std::env::var("TUNECACHE_BENCH_WRITE_FILE") {
        std::fs::write(&out, &bytes).expect("write the file for the Python baseline");
    }
    let mut group = c.benchmark_group("load_100k");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(20));
    group.bench_function("decode_only", |b| {
        b.iter(|| {
            let snap =
                cache_core::cache_format::read_snapshot(black_box(&bytes), &Default::default())
                    .expect("valid");
            cache_format::raw::decode_snapshot(&snap)
                .expect("decodes")
                .len()
        })
    });
    group.bench_function("open_cache", |b| {
        b.iter(|| {
            let cache = Cache::builder(registry())
                .file(&path)
                .ignore_env()
                .read_only(true)
                .refresh_interval(None)
                .open();
            assert_eq!(cache.len(), 100_000);
            cache
        })
    });
    group.finish();

    let mut group = c.benchmark_group("save_one_change_100k");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(20));
    let mut i = 1_000_000u64;
    let appender = Cache::builder(registry())
        .file(&path)
        .ignore_env()
        .save_delay(Duration::from_secs(3600))
        .refresh_interval(None)
        .open();
    group.bench_function("journal_append", |b| {
        b.iter(|| {
            i += 1;
            appender.put(ns, entry(i));
            appender.flush().expect("flush")
        })
    });
    drop(appender);
    let rewriter = Cache::builder(registry())
        .file(&path)
        .ignore_env()
        .save_delay(Duration::from_secs(3600))
        .refresh_interval(None)
        .compaction(0.0, 0)
        .open();
    group.bench_function("full_rewrite", |b| {
        b.iter(|| {
            i += 1;
            rewriter.put(ns, entry(i));
            rewriter.flush().expect("flush")
        })
    });
    group.finish();
}

/// Shipping 100k entries: reading a bundle (checksums, hash, decode), and opening a cache whose
/// system tier is that bundle, beside opening the same entries as the user's own file.
fn bundles(c: &mut Criterion) {
    use cache_core::cache_format::bundle::{encode_bundle, manifest_of, read_bundle};
    let mut data = CacheData::new();
    for i in 0..100_000 {
        data.insert(&Scope::default(), "matmul", entry(i));
    }
    let snapshot = encode_snapshot("bench", 1, &data);
    let manifest = manifest_of(&data, "bench", 1, &snapshot, 0, "bench");
    let bundle = encode_bundle(&manifest, &snapshot);
    let dir = tempfile::tempdir().expect("dir");
    let (bundle_path, file_path) = (dir.path().join("b.tcb"), dir.path().join("f.tcache"));
    std::fs::write(&bundle_path, &bundle).expect("write");
    std::fs::write(&file_path, &snapshot).expect("write");
    println!("100k-entry bundle: {} bytes", bundle.len());
    let mut group = c.benchmark_group("bundle_100k");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(15));
    group.bench_function("read_and_decode", |b| {
        b.iter(|| {
            let bundle = read_bundle(black_box(&bundle), &Default::default()).expect("valid");
            let snap =
                cache_core::cache_format::read_snapshot(bundle.snapshot, &Default::default())
                    .expect("valid");
            cache_core::cache_migrate::upgrade(
                &registry(),
                snap.format,
                &snap.header.app,
                snap.header.schema,
                snap.payload_bytes(),
                &Default::default(),
            )
            .expect("current")
            .data
            .len()
        })
    });
    group.bench_function("open_with_system_bundle", |b| {
        b.iter(|| {
            Cache::builder(registry())
                .ignore_env()
                .disabled(true)
                .system_files([&bundle_path])
                .open()
        })
    });
    group.bench_function("open_own_file_baseline", |b| {
        b.iter(|| {
            Cache::builder(registry())
                .file(&file_path)
                .ignore_env()
                .read_only(true)
                .refresh_interval(None)
                .open()
        })
    });
    group.finish();
}

criterion_group!(benches, hits, record, put_by_size, load_and_save, bundles);
criterion_main!(benches);
