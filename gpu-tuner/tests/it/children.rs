//! What child processes run. In a normal test run `TUNECACHE_TEST_CHILD` is unset and the
//! entry point returns at once (it is a harness hook, not a test).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cache_core::Store;
use gpu_tuner::cpu::{Matmul, MatmulKey, Reduce, ReduceKey};
use gpu_tuner::workload::{Call, run};
use gpu_tuner::{MeasureConfig, OpConfig, Progress, Tuner};

use crate::support::{MARK, TestKey, TestOp, open, quick};

macro_rules! say {
    ($($arg:tt)*) => {
        println!("{MARK}{}", format_args!($($arg)*))
    };
}

#[test]
fn child_process_entry() {
    let Ok(role) = std::env::var("TUNECACHE_TEST_CHILD") else {
        return;
    };
    let path = PathBuf::from(std::env::var("TUNECACHE_TEST_PATH").expect("path"));
    let args: Vec<String> = std::env::var("TUNECACHE_TEST_ARGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    match role.as_str() {
        "tune-one" => tune_one(path, args[0].parse().expect("micros")),
        "tune-slow" => tune_slow(path),
        "cpu-workload" => cpu_workload(path),
        other => panic!("unknown child role {other}"),
    }
}

/// Tunes one key of a three-candidate operation; reports what it measured and chose.
fn tune_one(path: PathBuf, micros: u64) {
    let cache = open(&path);
    let op = TestOp::new("t", &[("a", micros), ("b", micros * 2), ("c", micros * 3)]);
    let t = Tuner::new(Arc::clone(&cache))
        .register(op.clone(), quick())
        .expect("register");
    let choice = t.get(&TestKey { size: 7 }).expect("choice");
    say!("measured {}", op.measured().len());
    say!("winner {}", choice.candidate().algorithm);
    say!("provisional {}", choice.is_provisional());
}

/// Tunes one key of five slow candidates, reporting each measurement as it is recorded.
fn tune_slow(path: PathBuf) {
    let cache = open(&path);
    let op = TestOp::new(
        "t",
        &[
            ("a", 20_000),
            ("b", 25_000),
            ("c", 30_000),
            ("d", 35_000),
            ("e", 40_000),
        ],
    );
    let tuner = Tuner::new(Arc::clone(&cache));
    tuner.on_progress(|p| {
        if let Progress::Measured { candidate, .. } = p {
            say!("measured {}", candidate.algorithm);
        }
    });
    let t = tuner.register(op.clone(), quick()).expect("register");
    let choice = t.get(&TestKey { size: 9 }).expect("choice");
    say!("all {}", op.measured().join(","));
    say!("winner {}", choice.candidate().algorithm);
}

/// A small workload on the real CPU kernels; reports the counters.
fn cpu_workload(path: PathBuf) {
    let cache = Arc::new(
        cache_core::Cache::builder(gpu_tuner::workload::registry())
            .file(&path)
            .ignore_env()
            .scope(gpu_tuner::cpu::scope())
            .refresh_interval(None)
            .save_delay(Duration::from_millis(10))
            .open(),
    );
    let tuner = Tuner::new(Arc::clone(&cache));
    let config = |ns: &str| OpConfig {
        measure: MeasureConfig {
            warmup: Duration::ZERO,
            samples: 3,
            max_per_candidate: Duration::from_millis(200),
            ..MeasureConfig::default()
        },
        ..gpu_tuner::workload::op_config(ns)
    };
    let matmul = tuner.register(Matmul, config("matmul")).expect("matmul");
    let reduce = tuner.register(Reduce, config("reduce")).expect("reduce");
    let calls = [
        Call::Matmul(MatmulKey::f32(16, 16, 16)),
        Call::Matmul(MatmulKey::f32(24, 40, 8)),
        Call::Reduce(ReduceKey::f32(1000)),
        Call::Matmul(MatmulKey::f32(16, 16, 16)),
        Call::Reduce(ReduceKey::f32(5000)),
        Call::Reduce(ReduceKey::f32(1000)),
    ];
    let summary = run(&matmul, &reduce, &calls).expect("workload");
    let mut measured = 0;
    let mut tuned = 0;
    let mut reused = 0;
    let mut hits = 0;
    for (ns, s) in &summary.namespaces {
        measured += s.stats.measured;
        tuned += s.stats.tuned_keys;
        reused += s.stats.reused_keys;
        hits += s.stats.hits;
        for (key, winner) in &s.winners {
            say!("winner {ns} {key} {winner}");
        }
    }
    say!("measured {measured}");
    say!("tuned {tuned}");
    say!("reused {reused}");
    say!("hits {hits}");
    cache.flush().expect("flush");
}
