//! The built-in workload of `tunecache tune` (the demo application), run as a new process would
//! run it: cold (an empty cache: every key is measured) and warm (every key comes from the
//! cache). `cargo bench -p cache-cli`.
#![allow(
    clippy::print_stdout,
    reason = "the benchmark prints the cold and warm tuning times"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use cache_cli::workload;
use cache_core::Cache;
use criterion::{Criterion, criterion_group, criterion_main};
use gpu_tuner::Tuner;
use gpu_tuner::cpu::{Matmul, Reduce};

fn open(path: &std::path::Path) -> Arc<Cache> {
    Arc::new(
        Cache::builder(workload::registry())
            .file(path)
            .ignore_env()
            .scope(gpu_tuner::cpu::scope())
            .refresh_interval(None)
            .open(),
    )
}

/// Runs the whole built-in workload on the cache at `path` as a new process would: open,
/// register, run. Returns the time spent measuring and the wall time.
fn run_workload(path: &std::path::Path) -> (Duration, Duration) {
    let started = Instant::now();
    let tuner = Tuner::new(open(path));
    let matmul = tuner
        .register(Matmul, workload::op_config("matmul"))
        .expect("matmul");
    let reduce = tuner
        .register(Reduce, workload::op_config("reduce"))
        .expect("reduce");
    let summary = workload::run(&matmul, &reduce, &workload::builtin()).expect("workload");
    (summary.tuning_time(), started.elapsed())
}

fn workload_cold_warm(c: &mut Criterion) {
    let mut group = c.benchmark_group("workload");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(30));
    group.bench_function("cold", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let dir = tempfile::tempdir().expect("dir");
                total += run_workload(&dir.path().join("w.tcache")).1;
            }
            total
        })
    });
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("w.tcache");
    let (cold_tuning, cold_wall) = run_workload(&path);
    group.bench_function("warm", |b| b.iter(|| run_workload(&path)));
    group.finish();
    let (warm_tuning, warm_wall) = run_workload(&path);
    println!(
        "workload: cold {:?} wall ({:?} measuring); warm {:?} wall ({:?} measuring)",
        cold_wall, cold_tuning, warm_wall, warm_tuning
    );
}

criterion_group!(benches, workload_cold_warm);
criterion_main!(benches);
