//! Prediction quality on this machine's CPU, in one run: the matmul keys of `tunecache tune`'s
//! built-in workload, and a denser matmul grid, are tuned in full (every candidate measured,
//! as `tunecache tune` measures them, in memory); then 30% of each grid's keys are held out
//! and predicted from the rest (`gpu_tuner::predict::evaluate`). Each method is scored by its
//! regret, the true median of what it chose over the true best median, minus one, and by the
//! tuning time it spent as a share of measuring every candidate of the held-out keys.
//!
//! Run with `cargo run --release -p cache-cli --example predict_report` (about a minute).
#![allow(clippy::print_stdout, reason = "a report printed for the reader")]

use std::collections::BTreeSet;
use std::sync::Arc;

use cache_core::cache_format::{CandidateId, Entry, Value};
use cache_core::{Cache, Namespace};
use gpu_tuner::cpu::{Matmul, MatmulKey};
use gpu_tuner::predict::{Predictor, evaluate};
use gpu_tuner::{Operation, Tuner};

use cache_cli::workload::{self, Call};

/// The matmul shapes of the built-in workload (bucketed to powers of two by the tuner).
fn builtin() -> Vec<MatmulKey> {
    let keys: BTreeSet<(u32, u32, u32)> = workload::builtin()
        .into_iter()
        .filter_map(|call| match call {
            Call::Matmul(k) => Some((k.m, k.n, k.k)),
            Call::Reduce(_) => None,
        })
        .collect();
    keys.into_iter()
        .map(|(m, n, k)| MatmulKey::f32(m, n, k))
        .collect()
}

/// Every (m, n, k) of m in 16..=1024 and n, k in {16, 64, 256}, powers of two.
fn dense() -> Vec<MatmulKey> {
    let mut keys = Vec::new();
    for m in (4..=10).map(|p| 1u32 << p) {
        for n in [16, 64, 256] {
            for k in [16, 64, 256] {
                keys.push(MatmulKey::f32(m, n, k));
            }
        }
    }
    keys
}

/// Tunes `keys` in a fresh in-memory cache and returns the matmul entries.
fn tune(keys: &[MatmulKey]) -> Vec<Entry> {
    let cache = Arc::new(
        Cache::builder(workload::registry())
            .ignore_env()
            .disabled(true)
            .scope(gpu_tuner::cpu::scope())
            .open(),
    );
    let tuner = Tuner::new(Arc::clone(&cache));
    let tuned = tuner
        .register(Matmul, workload::op_config("matmul"))
        .expect("register");
    for key in keys {
        tuned.get(key).expect("tuned");
    }
    let ns = Namespace::new("matmul").expect("namespace");
    cache
        .entries()
        .into_iter()
        .filter(|(n, _)| *n == ns)
        .map(|(_, e)| Entry::clone(&e))
        .collect()
}

/// The candidates that apply to an entry's (bucketed) key, in the operation's order.
fn current(entry: &Entry) -> Vec<CandidateId> {
    let int = |name: &str| match entry.key().fields().get(name) {
        Some(Value::Int(v)) => u32::try_from(*v).unwrap_or(0),
        _ => 0,
    };
    let key = MatmulKey::f32(int("m"), int("n"), int("k"));
    Matmul
        .candidates()
        .into_iter()
        .filter(|c| Matmul.applies(c, &key))
        .collect()
}

fn main() {
    for (name, keys) in [("built-in workload", builtin()), ("dense grid", dense())] {
        let entries = tune(&keys);
        let eval = evaluate(&entries, &current, &Predictor::default(), &[2, 3]);
        println!(
            "\n{name}: {} keys tuned in full, {} held out and predicted from the rest\n",
            eval.keys, eval.held_out
        );
        println!(
            "| method | geomean regret | worst regret | exact | tuning time spent |\n|---|---|---|---|---|"
        );
        for m in &eval.methods {
            println!(
                "| {} | {:.1}% | {:.1}% | {}/{} | {:.0}% |",
                m.method,
                m.geomean_regret * 100.0,
                m.worst_regret * 100.0,
                m.exact,
                eval.held_out,
                m.tuning_share * 100.0
            );
        }
    }
}
