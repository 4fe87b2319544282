//! `tunecache stability`: how far the stored winners of the built-in workload can be trusted
//! on this machine. A sample of the stored matmul and sum keys of the CPU's scope is measured
//! again, several times, as a tune measures them (nothing is recorded); per key, how often a
//! run's winner is not the stored one (flip rate), the stored winner's regret (its median
//! over the runs against the best's, minus one) and whether its winner is clearly best (every
//! run's time of the runner-up above every run's time of the best); per namespace, the
//! geometric mean regret, the agreement on the keys whose winner is clearly best (near-ties
//! flip without harm) and the cross-run regret (each run's winner timed in the other runs:
//! p50, p90, worst). `--max-regret` and `--max-flip-rate` (clearly-won keys only) make it exit
//! 3 past them, for CI.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use clap::Args;
use serde::Serialize;

use cache_core::cache_format::{Entry, Value};
use cache_core::{Cache, Namespace};
use gpu_tuner::cpu::{Matmul, MatmulKey, Reduce, ReduceKey};
use gpu_tuner::{Operation, StabilityReport, Tuner};

use crate::context::Context;
use crate::exit;
use crate::output::{Out, Report};
use crate::progress::Pace;
use crate::workload;

/// The arguments of `tunecache stability`.
#[derive(Debug, Args)]
pub(crate) struct StabilityArgs {
    /// Measurements of each key
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(2..=1000))]
    runs: u32,
    /// Stored keys measured per namespace (spread over the namespace)
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    sample: u32,
    /// Exit 3 if a namespace's geometric-mean regret exceeds this, in percent
    #[arg(long, value_name = "PCT", value_parser = percent)]
    max_regret: Option<f64>,
    /// Exit 3 if the flip rate of a key whose winner is clearly best exceeds this, in percent
    #[arg(long, value_name = "PCT", value_parser = percent)]
    max_flip_rate: Option<f64>,
}

#[derive(Debug, Serialize)]
struct StabilityOut {
    cache: PathBuf,
    runs: u32,
    namespaces: Vec<NamespaceOut>,
    /// Why it exits 3, if it does.
    failed: Vec<String>,
    /// Keys measured (each `runs` times), and how fast.
    pace: Pace,
}

#[derive(Debug, Serialize)]
struct NamespaceOut {
    namespace: String,
    geomean_regret: f64,
    /// The largest flip rate of a key whose winner is clearly best.
    worst_flip_rate: f64,
    /// Keys whose winner is clearly best, and the share of them every run agreed on.
    clear_keys: usize,
    agreement: Option<f64>,
    /// Each run's winner timed in every other run against its best, minus one.
    cross_regret_p50: f64,
    cross_regret_p90: f64,
    cross_regret_max: f64,
    keys: Vec<KeyOut>,
    /// Stored keys that could not be measured here, with why (left out of the figures).
    skipped: Vec<SkippedOut>,
}

#[derive(Debug, Serialize)]
struct SkippedOut {
    key: String,
    why: String,
}

#[derive(Debug, Serialize)]
struct KeyOut {
    key: String,
    stored: Option<String>,
    winners: std::collections::BTreeMap<String, usize>,
    flip_rate: f64,
    regret: f64,
    clear_gap: bool,
}

impl StabilityArgs {
    pub(crate) fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        let started = Instant::now();
        let path = ctx.path()?;
        let cache = Arc::new(
            Cache::builder(workload::registry())
                .file(&path)
                .ignore_env()
                .read_only(true)
                .scope(gpu_tuner::cpu::scope())
                .refresh_interval(None)
                .open(),
        );
        let tuner = Tuner::new(Arc::clone(&cache));
        let matmul = tuner.register(Matmul, workload::op_config("matmul"))?;
        let reduce = tuner.register(Reduce, workload::op_config("reduce"))?;
        let sample = self.sample as usize;
        let mm_keys: Vec<MatmulKey> = stored(&cache, &Matmul, sample, |e| {
            Some(MatmulKey::f32(int(e, "m")?, int(e, "n")?, int(e, "k")?))
        });
        let rd_keys: Vec<ReduceKey> = stored(&cache, &Reduce, sample, |e| {
            Some(ReduceKey::f32(u64::from(int(e, "n")?)))
        });
        let runs = self.runs as usize;
        let reports = [
            matmul.stability(&mm_keys, runs).context("matmul")?,
            reduce.stability(&rd_keys, runs).context("reduce")?,
        ];
        let mut failed = Vec::new();
        for r in reports.iter().filter(|r| !r.keys.is_empty()) {
            if let Some(max) = self.max_regret
                && r.geomean_regret() * 100.0 > max
            {
                failed.push(format!(
                    "{}: geomean regret {:.1}% > {max}%",
                    r.namespace,
                    r.geomean_regret() * 100.0
                ));
            }
            if let Some(max) = self.max_flip_rate
                && r.worst_flip_rate() * 100.0 > max
            {
                failed.push(format!(
                    "{}: a clearly won key's winner flips in {:.0}% of runs > {max}%",
                    r.namespace,
                    r.worst_flip_rate() * 100.0
                ));
            }
        }
        let report = StabilityOut {
            cache: path,
            runs: self.runs,
            namespaces: reports.iter().map(namespace_out).collect(),
            failed,
            pace: Pace::since(started, reports.iter().map(|r| r.keys.len() as u64).sum()),
        };
        out.report(&report, ctx.json)?;
        Ok(if report.failed.is_empty() {
            exit::OK
        } else {
            exit::PROBLEMS
        })
    }
}

/// Up to `sample` stored keys of `op`'s namespace, spread evenly in fingerprint order, as the
/// operation's keys (`key_of`: `None` for a key it cannot read).
fn stored<O: Operation, K>(
    cache: &Cache,
    op: &O,
    sample: usize,
    key_of: impl Fn(&Entry) -> Option<K>,
) -> Vec<K> {
    let Ok(ns) = Namespace::new(op.namespace()) else {
        return Vec::new();
    };
    let mut entries: Vec<Arc<Entry>> = cache
        .entries()
        .into_iter()
        .filter(|(n, _)| *n == ns)
        .map(|(_, e)| e)
        .collect();
    entries.sort_by_key(|e| e.fingerprint());
    let step = entries.len().div_ceil(sample).max(1);
    entries
        .iter()
        .step_by(step)
        .filter(|e| e.key().fields().get("dtype") == Some(&Value::from("f32")))
        .filter_map(|e| key_of(e))
        .collect()
}

/// A threshold in percent: finite and not negative.
fn percent(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(p) if p.is_finite() && p >= 0.0 => Ok(p),
        _ => Err(format!(
            "{text:?} is not a percentage (a number, 0 or more)"
        )),
    }
}

fn int(entry: &Entry, name: &str) -> Option<u32> {
    match entry.key().fields().get(name)? {
        Value::Int(v) => u32::try_from(*v).ok(),
        _ => None,
    }
}

fn namespace_out(r: &StabilityReport) -> NamespaceOut {
    NamespaceOut {
        namespace: r.namespace.clone(),
        geomean_regret: r.geomean_regret(),
        worst_flip_rate: r.worst_flip_rate(),
        clear_keys: r.clear_keys(),
        agreement: r.agreement(),
        cross_regret_p50: r.cross_regret(0.5),
        cross_regret_p90: r.cross_regret(0.9),
        cross_regret_max: r.cross_regret(1.0),
        keys: r
            .keys
            .iter()
            .map(|k| KeyOut {
                key: k.key.to_string(),
                stored: k.stored.as_ref().map(|c| c.label()),
                winners: k.winners.clone(),
                flip_rate: k.flip_rate,
                regret: k.regret,
                clear_gap: k.clear_gap,
            })
            .collect(),
        skipped: r
            .skipped
            .iter()
            .map(|(key, why)| SkippedOut {
                key: key.clone(),
                why: why.to_string(),
            })
            .collect(),
    }
}

impl Report for StabilityOut {
    fn text(&self, out: &mut Out) -> anyhow::Result<()> {
        out.line(format!(
            "tunecache stability: {} runs per key, cache {}",
            self.runs,
            self.cache.display()
        ))?;
        for ns in &self.namespaces {
            out.line("")?;
            for k in &ns.skipped {
                out.line(format!(
                    "{}: skipped {} (cannot be measured here: {})",
                    ns.namespace, k.key, k.why
                ))?;
            }
            if ns.keys.is_empty() {
                out.line(format!(
                    "{}: no stored key measured on this machine",
                    ns.namespace
                ))?;
                continue;
            }
            let agreement = ns
                .agreement
                .map_or("-".to_owned(), |a| format!("{:.0}%", a * 100.0));
            out.line(format!(
                "{}: geomean regret {:.1}%; {} of {} keys clearly won, agreement on them {}, \
                 worst flip rate {:.0}%; cross-run regret p50 {:.1}%, p90 {:.1}%, worst {:.1}%",
                ns.namespace,
                ns.geomean_regret * 100.0,
                ns.clear_keys,
                ns.keys.len(),
                agreement,
                ns.worst_flip_rate * 100.0,
                ns.cross_regret_p50 * 100.0,
                ns.cross_regret_p90 * 100.0,
                ns.cross_regret_max * 100.0
            ))?;
            for k in &ns.keys {
                let winners: Vec<String> =
                    k.winners.iter().map(|(w, n)| format!("{w}×{n}")).collect();
                let tie = if k.clear_gap { "" } else { "  near-tie" };
                out.line(format!(
                    "  {}  stored {}  flips {:.0}%  regret {:.1}%  ({}){tie}",
                    k.key,
                    k.stored.as_deref().unwrap_or("-"),
                    k.flip_rate * 100.0,
                    k.regret * 100.0,
                    winners.join(", ")
                ))?;
            }
        }
        for f in &self.failed {
            out.line(format!("FAILED: {f}"))?;
        }
        Ok(())
    }
}
