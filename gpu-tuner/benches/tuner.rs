//! Benchmarks of the tuner: dispatch on a hit, a prediction among 100k tuned keys (issue 41's
//! bound: 100 µs), and NVRTC compilation against loading cached PTX. (The built-in workload
//! cold and warm is cache-cli's `tune` bench.)
//!
//! `cargo bench -p gpu-tuner` (the NVRTC pair runs only where libnvrtc loads; see .ci/run).
#![allow(clippy::print_stdout, reason = "benchmarks report what they skipped")]

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cache_core::cache_format::{
    Candidate, CandidateId, Entry, Fields, Fingerprint, Key, Origin, Scope, Stats, Value,
};
use cache_core::cache_migrate::Migrations;
use cache_core::{Cache, Namespace, Store as _};
use criterion::{Criterion, criterion_group, criterion_main};
use gpu_tuner::cpu::{Matmul, MatmulKey};
use gpu_tuner::predict::{KeyIndex, Predictor, Query, TunedKeys, Voters};
use gpu_tuner::{MeasureConfig, OpConfig, Tuner};

fn open(path: &std::path::Path) -> Arc<Cache> {
    Arc::new(
        Cache::builder(Migrations::new("bench", 1))
            .file(path)
            .ignore_env()
            .scope(gpu_tuner::cpu::scope())
            .refresh_interval(None)
            .open(),
    )
}

fn dispatch(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("dir");
    let tuner = Tuner::new(open(&dir.path().join("d.tcache")));
    let quick = OpConfig {
        measure: MeasureConfig {
            samples: 3,
            max_per_candidate: Duration::from_millis(50),
            ..MeasureConfig::default()
        },
        ..OpConfig::default()
    };
    let matmul = tuner.register(Matmul, quick).expect("register");
    let key = MatmulKey::f32(64, 64, 64);
    matmul.get(&key).expect("tuned once, before timing");
    // Other keys in the table, as in a real run.
    for m in [8u32, 16, 32] {
        matmul.get(&MatmulKey::f32(m, m, m)).expect("tuned");
    }
    let mut group = c.benchmark_group("dispatch");
    group.bench_function("hit", |b| {
        b.iter(|| matmul.get(black_box(&key)).expect("hit"))
    });
    // `run` borrows the choice: no shared reference count on the hot path.
    group.bench_function("run_hit", |b| {
        b.iter(|| matmul.run(black_box(&key), |h| Ok(black_box(h) as *const _ as usize)))
    });
    group.bench_function("run_hit_2_threads", |b| {
        b.iter_custom(|iters| {
            let stop = AtomicBool::new(false);
            std::thread::scope(|s| {
                s.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        black_box(matmul.run(&key, |h| Ok(black_box(h) as *const _ as usize)))
                            .expect("hit");
                    }
                });
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(matmul.run(black_box(&key), |h| Ok(h as *const _ as usize)))
                        .expect("hit");
                }
                let took = start.elapsed();
                stop.store(true, Ordering::Relaxed);
                took
            })
        })
    });
    // Baseline in the same process: a std HashMap probe with the same key, returning an Arc.
    let baseline: HashMap<MatmulKey, Arc<u64>> =
        [(key, Arc::new(1)), (MatmulKey::f32(8, 8, 8), Arc::new(2))].into();
    group.bench_function("baseline_std_hashmap_get_arc", |b| {
        b.iter(|| Arc::clone(baseline.get(black_box(&key)).expect("present")))
    });
    group.bench_function("hit_2_threads", |b| {
        b.iter_custom(|iters| {
            let stop = AtomicBool::new(false);
            std::thread::scope(|s| {
                s.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        black_box(matmul.get(&key).expect("hit"));
                    }
                });
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(matmul.get(black_box(&key)).expect("hit"));
                }
                let took = start.elapsed();
                stop.store(true, Ordering::Relaxed);
                took
            })
        })
    });
    group.finish();
}

#[cfg(feature = "cuda")]
fn nvrtc(c: &mut Criterion) {
    use gpu_tuner::cuda::{self, kernels};
    if let Err(why) = cuda::nvrtc_available() {
        println!("nvrtc benchmarks skipped: {why}");
        return;
    }
    let dir = tempfile::tempdir().expect("dir");
    let compiler = cuda::Compiler::new(Some(
        cache_core::ArtifactStore::open(dir.path(), 64 << 20).expect("store"),
    ))
    .expect("compiler");
    compiler
        .ptx(&kernels::MATMUL_TILED, &[("TILE", 16)], "compute_90")
        .expect("compiles");
    let mut group = c.benchmark_group("nvrtc");
    group.sample_size(20);
    group.bench_function("compile_matmul_tiled", |b| {
        b.iter(|| {
            cuda::compile(&kernels::MATMUL_TILED, &[("TILE", 16)], "compute_90").expect("compiles")
        })
    });
    group.bench_function("cached_ptx_from_artifact_store", |b| {
        b.iter(|| {
            compiler
                .ptx(&kernels::MATMUL_TILED, &[("TILE", 16)], "compute_90")
                .expect("cached")
        })
    });
    group.finish();
}

#[cfg(not(feature = "cuda"))]
fn nvrtc(_: &mut Criterion) {
    println!("nvrtc benchmarks skipped: built without the cuda feature");
}

/// An entry of `n` candidates `cfg {"i": ..}` timed from `seed`.
fn timed_entry(fields: Fields, n: usize, seed: u64) -> Entry {
    let candidates = (0..n).map(|i| {
        let t = 1000.0 + ((seed.wrapping_mul(2_654_435_761) ^ i as u64) % 997) as f64;
        let stats = Stats {
            median_ns: t,
            min_ns: t,
            spread_ns: 0.0,
            samples: 3,
        };
        Candidate::measured(
            "cfg",
            Fields::from([("i".to_owned(), Value::Int(i as i64))]),
            stats,
        )
    });
    Entry::new(
        Key::new(fields),
        Fingerprint::default(),
        Origin::Measured("bench".into()),
        0,
        candidates,
    )
}

/// The key of an f16 mm.
fn mm(m: i64, n: i64, k: i64) -> Fields {
    Fields::from([
        ("m".to_owned(), Value::Int(m)),
        ("n".to_owned(), Value::Int(n)),
        ("k".to_owned(), Value::Int(k)),
        ("dtype".to_owned(), Value::from("f16")),
    ])
}

/// 100,000 tuned mm keys of 30 candidates each, as an Inductor mm, and those candidates.
fn tuned_keys() -> (Vec<Entry>, Vec<CandidateId>) {
    let tuned = (0..100_000u64)
        .map(|i| {
            let (m, n, k) = (
                64 + (i % 97) * 37,
                64 + (i / 97 % 89) * 41,
                64 + (i % 83) * 53,
            );
            timed_entry(mm(m as i64, n as i64, k as i64), 30, i)
        })
        .collect();
    let current = (0..30)
        .map(|i| CandidateId::new("cfg", &[("i", i)]))
        .collect();
    (tuned, current)
}

/// A prediction for a key never tuned among 100,000 tuned keys, and a transfer from five
/// devices' results for a key of 4,362 candidates (a Kernel Tuner space).
fn predict(c: &mut Criterion) {
    let (tuned, current) = tuned_keys();
    let target = mm(1000, 2000, 3000);
    let walked: Vec<&Entry> = tuned.iter().collect();
    let query = Query {
        target: &target,
        current: &current,
        voters: Voters::Scope {
            tuned: TunedKeys::Entries(&walked),
            elsewhere: &[],
        },
    };
    c.bench_function("predict among 100k tuned keys (30 candidates)", |b| {
        b.iter(|| black_box(Predictor::default().predict(&query)))
    });
    let shared: Vec<Arc<Entry>> = tuned.iter().cloned().map(Arc::new).collect();
    c.bench_function("index 100k tuned keys", |b| {
        b.iter(|| black_box(KeyIndex::new(shared.iter().cloned())))
    });
    let index = KeyIndex::new(shared.iter().cloned());
    c.bench_function(
        "predict among 100k tuned keys, indexed (30 candidates)",
        |b| {
            let query = Query {
                target: &target,
                current: &current,
                voters: Voters::Scope {
                    tuned: TunedKeys::Indexed {
                        index: &index,
                        fresher: &[],
                    },
                    elsewhere: &[],
                },
            };
            b.iter(|| black_box(Predictor::default().predict(&query)))
        },
    );
    let space: Vec<CandidateId> = (0..4362)
        .map(|i| CandidateId::new("cfg", &[("i", i)]))
        .collect();
    let devices: Vec<Entry> = (0..5)
        .map(|d| timed_entry(mm(4096, 4096, 1), 4362, d))
        .collect();
    let key = mm(4096, 4096, 1);
    let devices: Vec<&Entry> = devices.iter().collect();
    let query = Query {
        target: &key,
        current: &space,
        voters: Voters::Devices {
            tuned: &devices,
            measured: &[],
        },
    };
    c.bench_function("transfer from 5 devices (4,362 candidates)", |b| {
        b.iter(|| black_box(Predictor { neighbours: 5 }.predict(&query)))
    });
}

/// A device with tuned keys of its own and five others' results for the key beside them
/// (what the tuner does on a miss once a device has any key tuned), and what the miss reads
/// for them: the key under every other scope of a file of six devices.
fn beside(c: &mut Criterion) {
    let (tuned, current) = tuned_keys();
    let target = mm(1000, 2000, 3000);
    let index = KeyIndex::new(tuned.iter().cloned().map(Arc::new));
    let others: Vec<Entry> = (0..5)
        .map(|d| timed_entry(target.clone(), 30, 7 + d))
        .collect();
    c.bench_function(
        "predict among 100k tuned keys, indexed, 5 devices' results beside (30 candidates)",
        |b| {
            let others: Vec<&Entry> = others.iter().collect();
            let query = Query {
                target: &target,
                current: &current,
                voters: Voters::Scope {
                    tuned: TunedKeys::Indexed {
                        index: &index,
                        fresher: &[],
                    },
                    elsewhere: &others,
                },
            };
            b.iter(|| black_box(Predictor::default().predict(&query)))
        },
    );
    let dir = tempfile::tempdir().expect("dir");
    let ns = Namespace::new("mm").expect("ns");
    let device = |d: i64| Scope::new(Fields::from([("device".to_owned(), Value::Int(d))]));
    let open_as = |path: &std::path::Path, scope: Scope| {
        Cache::builder(Migrations::new("bench", 1))
            .file(path)
            .ignore_env()
            .scope(scope)
            .refresh_interval(None)
            .open()
    };
    let path = dir.path().join("devices.tcache");
    for d in 0..6 {
        let cache = open_as(&path, device(d));
        for e in tuned.iter().take(20_000) {
            cache.put(ns, e.clone());
        }
        cache.put(ns, timed_entry(target.clone(), 30, d as u64));
        cache.close().expect("saved");
    }
    let device0 = open_as(&path, device(0));
    let fp = Key::new(target.clone()).fingerprint();
    assert_eq!(device0.lookup_other_scopes(ns, &fp).len(), 5);
    c.bench_function("a key under the 5 other scopes of a 120k-entry file", |b| {
        b.iter(|| black_box(device0.lookup_other_scopes(ns, &fp)))
    });
    // The same look where the file holds one device only (most caches): nothing to read.
    let single = open_as(&dir.path().join("alone.tcache"), device(0));
    for e in tuned.iter().take(20_000) {
        single.put(ns, e.clone());
    }
    single.flush().expect("saved");
    c.bench_function("a key under the other scopes of a one-scope file", |b| {
        b.iter(|| black_box(single.lookup_other_scopes(ns, &fp)))
    });
}

criterion_group!(benches, dispatch, predict, beside, nvrtc);
criterion_main!(benches);
