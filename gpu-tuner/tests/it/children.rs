//! What child processes run. In a normal test run `TUNECACHE_TEST_CHILD` is unset and the
//! entry point returns at once (it is a harness hook, not a test).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cache_core::Store;
use cache_core::cache_migrate::Migrations;
use gpu_tuner::cpu::{Matmul, MatmulKey, Reduce, ReduceKey};
use gpu_tuner::{Bucketing, MeasureConfig, OpConfig, Progress, Rule, Tuner};

use crate::support::{MARK, TestKey, TestOp, open, quick};

macro_rules! say {
    ($($arg:tt)*) => {
        println!("{MARK}{}", format_args!($($arg)*))
    };
}

#[test]
fn child_process_entry() {
    let Some((role, path, args)) = test_support::child::role() else {
        return;
    };
    match role.as_str() {
        "tune-one" => tune_one(path, args[0].parse().expect("micros")),
        "tune-slow" => tune_slow(path),
        "cpu-workload" => cpu_workload(path),
        "fleet" => crate::fleet::child(path, args),
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

/// Tunes keys 1 to 6 of three slow candidates, one after the other, saying when each key's
/// tuning starts and when it is done (durable).
fn tune_slow(path: PathBuf) {
    let cache = open(&path);
    let op = TestOp::new("t", &[("a", 20_000), ("b", 25_000), ("c", 30_000)]);
    let tuner = Tuner::new(Arc::clone(&cache));
    tuner.on_progress(|p| {
        if let Progress::Tuning { key, .. } = p {
            say!("tuning {key}");
        }
    });
    let t = tuner.register(op.clone(), quick()).expect("register");
    for size in 1..=6 {
        let choice = t.get(&TestKey { size }).expect("choice");
        say!("tuned {size} {}", choice.candidate().algorithm);
    }
}

/// A small workload on the real CPU kernels; reports the counters.
fn cpu_workload(path: PathBuf) {
    let cache = Arc::new(
        cache_core::Cache::builder(Migrations::new("tuner-test", 1))
            .file(&path)
            .ignore_env()
            .scope(gpu_tuner::cpu::scope())
            .refresh_interval(None)
            .save_delay(Duration::from_millis(10))
            .open(),
    );
    let tuner = Tuner::new(Arc::clone(&cache));
    let config = |bucketing: Bucketing| OpConfig {
        bucketing,
        measure: MeasureConfig {
            warmup: Duration::ZERO,
            samples: 3,
            max_per_candidate: Duration::from_millis(200),
            ..MeasureConfig::default()
        },
        ..OpConfig::default()
    };
    let pow2 = |fields: &[&str]| {
        fields
            .iter()
            .fold(Bucketing::none(), |b, f| b.field(*f, Rule::PowerOfTwo))
    };
    let matmul = tuner
        .register(Matmul, config(pow2(&["m", "n", "k"])))
        .expect("matmul");
    let reduce = tuner
        .register(Reduce, config(pow2(&["n"])))
        .expect("reduce");
    let mut winners = BTreeSet::new();
    for key in [
        MatmulKey::f32(16, 16, 16),
        MatmulKey::f32(24, 40, 8),
        MatmulKey::f32(16, 16, 16),
    ] {
        let choice = matmul.get(&key).expect("matmul choice");
        winners.insert(format!("matmul {} {}", choice.key(), choice.candidate()));
    }
    for key in [
        ReduceKey::f32(1000),
        ReduceKey::f32(5000),
        ReduceKey::f32(1000),
    ] {
        let choice = reduce.get(&key).expect("reduce choice");
        winners.insert(format!("reduce {} {}", choice.key(), choice.candidate()));
    }
    for w in &winners {
        say!("winner {w}");
    }
    let (m, r) = (matmul.stats(), reduce.stats());
    say!("measured {}", m.measured + r.measured);
    say!("tuned {}", m.tuned_keys + r.tuned_keys);
    say!("reused {}", m.reused_keys + r.reused_keys);
    say!("hits {}", m.hits + r.hits);
    cache.flush().expect("flush");
}
