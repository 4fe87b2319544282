//! The demo application of `tunecache tune` (public for the `tune` benchmark and for tools that
//! embed the CLI and want the same demo): the `tunecache` application's schema registry and its
//! built-in workload: a small model run on inputs whose shapes vary
//! from step to step (batch size and sequence length), as in the cuDNN persistence request,
//! so many distinct shapes come and recur. Each step calls four matmuls and two sums.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cache_core::cache_migrate::Migrations;
use gpu_tuner::cpu::{MatmulKey, ReduceKey};
use gpu_tuner::{Bucketing, MeasureConfig, OpConfig, Operation, Rule, TuneError, TuneStats, Tuned};

/// The registry of the `tunecache` application (the schema of what `tunecache tune`
/// records), from `cache-cli/tunecache-migrations.json` (linked from
/// `golden/tunecache/migrations.json`, where the release check sees it).
pub fn registry() -> Migrations {
    Migrations::from_json(include_str!("../tunecache-migrations.json"))
        .expect("the committed migration file of the tunecache application is valid")
}

/// One call of the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Call {
    /// A matrix multiply.
    Matmul(MatmulKey),
    /// A sum.
    Reduce(ReduceKey),
}

/// The calls of the built-in workload, in order.
pub fn builtin() -> Vec<Call> {
    builtin_steps(usize::MAX)
}

/// The calls of the first `steps` steps of the built-in workload (it has 12).
pub(crate) fn builtin_steps(steps: usize) -> Vec<Call> {
    // (batch, sequence length) per step: shapes vary and recur.
    const STEPS: [(u32, u32); 12] = [
        (1, 24),
        (3, 40),
        (8, 64),
        (2, 100),
        (5, 64),
        (8, 48),
        (1, 24),
        (6, 128),
        (4, 100),
        (8, 40),
        (3, 64),
        (7, 128),
    ];
    let mut calls = Vec::new();
    for &(batch, seq) in STEPS.iter().take(steps) {
        let tokens = batch * seq;
        calls.push(Call::Matmul(MatmulKey::f32(tokens, 64, 64)));
        calls.push(Call::Matmul(MatmulKey::f32(tokens, 256, 64)));
        calls.push(Call::Matmul(MatmulKey::f32(tokens, 64, 256)));
        calls.push(Call::Matmul(MatmulKey::f32(seq, seq, 64)));
        calls.push(Call::Reduce(ReduceKey::f32(u64::from(tokens) * 256)));
        calls.push(Call::Reduce(ReduceKey::f32(u64::from(tokens) * 64 * 64)));
    }
    calls
}

/// How `tunecache tune` configures an operation: sizes bucketed to powers of two, and a
/// measurement budget that keeps a cold run short.
pub fn op_config(namespace: &str) -> OpConfig {
    let bucketing = match namespace {
        "matmul" => Bucketing::none()
            .field("m", Rule::PowerOfTwo)
            .field("n", Rule::PowerOfTwo)
            .field("k", Rule::PowerOfTwo),
        "reduce" => Bucketing::none().field("n", Rule::PowerOfTwo),
        _ => Bucketing::none(),
    };
    OpConfig {
        bucketing,
        measure: MeasureConfig {
            warmup: Duration::from_millis(1),
            samples: 9,
            max_per_candidate: Duration::from_millis(300),
            ..MeasureConfig::default()
        },
        ..OpConfig::default()
    }
}

/// What one namespace did during a run.
#[derive(Debug, Clone, Default)]
pub struct NamespaceSummary {
    /// Calls made.
    pub calls: usize,
    /// Distinct keys called.
    pub distinct_keys: usize,
    /// The tuner's counters.
    pub stats: TuneStats,
    /// The chosen candidate per (bucketed) cache key, as text.
    pub winners: BTreeMap<String, String>,
}

/// What a run of the workload did.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// By namespace.
    pub namespaces: BTreeMap<String, NamespaceSummary>,
    /// Wall time of the run.
    pub wall: Duration,
}

impl Summary {
    /// Time spent measuring, over all namespaces.
    pub fn tuning_time(&self) -> Duration {
        self.namespaces.values().map(|n| n.stats.tuning_time).sum()
    }

    /// Tuning time recorded for the keys reused from the cache, over all namespaces.
    pub fn saved_time(&self) -> Duration {
        self.namespaces.values().map(|n| n.stats.saved_time).sum()
    }
}

fn serve<O: Operation>(
    tuned: &Tuned<O>,
    key: &O::Key,
    summary: &mut NamespaceSummary,
) -> Result<(), TuneError> {
    let choice = tuned.get(key)?;
    summary.calls += 1;
    summary
        .winners
        .insert(choice.key().to_string(), choice.candidate().label());
    Ok(())
}

/// Runs `calls` against a matmul and a sum operation (CPU or CUDA), tuning on misses.
pub fn run<M, R>(matmul: &Tuned<M>, reduce: &Tuned<R>, calls: &[Call]) -> Result<Summary, TuneError>
where
    M: Operation<Key = MatmulKey>,
    R: Operation<Key = ReduceKey>,
{
    let started = Instant::now();
    let mut mm = NamespaceSummary::default();
    let mut rd = NamespaceSummary::default();
    let mut mm_keys = std::collections::HashSet::new();
    let mut rd_keys = std::collections::HashSet::new();
    for call in calls {
        match call {
            Call::Matmul(k) => {
                mm_keys.insert(*k);
                serve(matmul, k, &mut mm)?;
            }
            Call::Reduce(k) => {
                rd_keys.insert(*k);
                serve(reduce, k, &mut rd)?;
            }
        }
    }
    mm.distinct_keys = mm_keys.len();
    rd.distinct_keys = rd_keys.len();
    mm.stats = matmul.stats();
    rd.stats = reduce.stats();
    let mut summary = Summary {
        wall: started.elapsed(),
        ..Summary::default()
    };
    summary
        .namespaces
        .insert(matmul.operation().namespace().to_owned(), mm);
    summary
        .namespaces
        .insert(reduce.operation().namespace().to_owned(), rd);
    Ok(summary)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_workload_has_many_shapes_that_recur() {
        let calls = super::builtin();
        let distinct: std::collections::HashSet<_> = calls.iter().collect();
        assert!(distinct.len() >= 30, "{} distinct calls", distinct.len());
        assert!(calls.len() > distinct.len(), "shapes recur");
        assert_eq!(super::registry().app(), "tunecache");
    }
}
