//! `tunecache tune` (the built-in workload, end to end) and `tunecache show` (one key's
//! candidates as a bar chart).

use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use cache_core::{Cache, Mode, Store};
use cache_format::{Key, Outcome, Scope, Value};
use gpu_tuner::workload::{self, Summary};
use gpu_tuner::{Progress, Tuner};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;

use crate::args::Backend;
use crate::exit;
use crate::output::Out;

/// Human duration: `812.000 µs`, `3.400 ms`, `12.700 s` (the CLI's one time format).
pub(crate) fn fmt_duration(d: Duration) -> String {
    crate::commands::fmt_ns(d.as_nanos() as f64)
}

fn progress_bar(enabled: bool) -> ProgressBar {
    if !enabled || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
    pb.set_style(
        ProgressStyle::with_template(
            "{spinner} measuring [{bar:30}] {pos}/{len} candidates  {wide_msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}

/// The flags of `tunecache tune`.
pub(crate) struct TuneOptions {
    pub(crate) backend: Backend,
    pub(crate) device: usize,
    pub(crate) repeat: u32,
    pub(crate) progress: bool,
    pub(crate) flush_l2: bool,
}

pub(crate) fn tune(
    path: &Path,
    options: &TuneOptions,
    calls: &[workload::Call],
    as_json: bool,
    out: &mut Out,
) -> anyhow::Result<u8> {
    let TuneOptions {
        backend,
        device,
        repeat,
        progress,
        flush_l2,
    } = *options;
    let use_cuda = match backend {
        Backend::Cpu => false,
        Backend::Cuda => {
            cuda_usable().context("--backend cuda")?;
            true
        }
        Backend::Auto => match cuda_usable() {
            Ok(()) => true,
            Err(why) => {
                eprintln!("tunecache: no usable GPU ({why}); tuning on the CPU");
                false
            }
        },
    };
    let pb = progress_bar(progress && !as_json);
    let (summary, backend_name, scope, cache) = if use_cuda {
        run_cuda(path, device, repeat, flush_l2, calls, &pb)?
    } else {
        let scope = gpu_tuner::cpu::scope();
        let cache = open_cache(path, scope.clone());
        let tuner = tuner_with_progress(&cache, &pb);
        let matmul = tuner.register(gpu_tuner::cpu::Matmul, workload::op_config("matmul"))?;
        let reduce = tuner.register(gpu_tuner::cpu::Reduce, workload::op_config("reduce"))?;
        let summary = run_repeated(&matmul, &reduce, calls, repeat)?;
        (summary, "cpu".to_owned(), scope, cache)
    };
    pb.finish_and_clear();
    let durable = cache.flush();
    report(path, &backend_name, &scope, &summary, &cache, as_json, out)?;
    match durable {
        Ok(()) => Ok(exit::OK),
        Err(e) => {
            eprintln!(
                "tunecache: the results were not all saved to {}: {e}",
                path.display()
            );
            Ok(exit::ERROR)
        }
    }
}

#[cfg(feature = "cuda")]
fn cuda_usable() -> anyhow::Result<()> {
    gpu_tuner::cuda::usable().map_err(|why| anyhow::anyhow!("CUDA is not usable here: {why}"))
}

#[cfg(not(feature = "cuda"))]
fn cuda_usable() -> anyhow::Result<()> {
    anyhow::bail!("this tunecache was built without the cuda feature")
}

#[cfg(feature = "cuda")]
fn run_cuda(
    path: &Path,
    ordinal: usize,
    repeat: u32,
    flush_l2: bool,
    calls: &[workload::Call],
    pb: &ProgressBar,
) -> anyhow::Result<(Summary, String, Scope, Arc<Cache>)> {
    let artifacts_dir = cache_core::ArtifactStore::default_dir()
        .unwrap_or_else(|| path.parent().unwrap_or(Path::new(".")).join("artifacts"));
    let artifacts = match cache_core::ArtifactStore::open(&artifacts_dir, 512 << 20) {
        Ok(a) => Some(a),
        Err(e) => {
            eprintln!("tunecache: compiled kernels will not be kept ({e})");
            None
        }
    };
    let device =
        gpu_tuner::cuda::Device::open(ordinal, artifacts).map_err(|e| anyhow::anyhow!(e))?;
    let scope = device.scope();
    let cache = open_cache(path, scope.clone());
    let tuner = tuner_with_progress(&cache, pb);
    let mut mm = gpu_tuner::cuda::CudaMatmul::new(Arc::clone(&device));
    mm.flush_l2 = flush_l2;
    let mut rd = gpu_tuner::cuda::CudaReduce::new(Arc::clone(&device));
    rd.flush_l2 = flush_l2;
    let matmul = tuner.register(mm, workload::op_config("matmul"))?;
    let reduce = tuner.register(rd, workload::op_config("reduce"))?;
    let summary = run_repeated(&matmul, &reduce, calls, repeat)?;
    let (compiled, reused) = device.compiler().counts();
    eprintln!(
        "tunecache: {compiled} kernels compiled by NVRTC, {reused} loaded from {}",
        artifacts_dir.display()
    );
    Ok((summary, "cuda".to_owned(), scope, cache))
}

#[cfg(not(feature = "cuda"))]
fn run_cuda(
    _: &Path,
    _: usize,
    _: u32,
    _: bool,
    _: &[workload::Call],
    _: &ProgressBar,
) -> anyhow::Result<(Summary, String, Scope, Arc<Cache>)> {
    anyhow::bail!("this tunecache was built without the cuda feature")
}

fn open_cache(path: &Path, scope: Scope) -> Arc<Cache> {
    let cache = Cache::builder(workload::registry())
        .file(path)
        .ignore_env()
        .scope(scope)
        .refresh_interval(None)
        .open();
    if cache.health().mode != Mode::Persistent {
        eprintln!(
            "tunecache: results will not be saved: {}",
            cache
                .health()
                .reason
                .unwrap_or_else(|| "the cache is not persistent".into())
        );
    }
    Arc::new(cache)
}

fn tuner_with_progress(cache: &Arc<Cache>, pb: &ProgressBar) -> Tuner {
    let tuner = Tuner::new(Arc::clone(cache));
    let pb = pb.clone();
    tuner.on_progress(move |event| match event {
        Progress::Tuning {
            namespace,
            key,
            candidates,
        } => {
            pb.inc_length(*candidates as u64);
            pb.set_message(format!("{namespace} {key}"));
        }
        Progress::Measured { .. } => pb.inc(1),
        Progress::Tuned {
            namespace,
            key,
            winner,
            elapsed,
        } => {
            pb.println(format!(
                "tuned {namespace} {key}: {winner} ({})",
                fmt_duration(*elapsed)
            ));
        }
    });
    tuner
}

fn run_repeated<M, R>(
    matmul: &gpu_tuner::Tuned<M>,
    reduce: &gpu_tuner::Tuned<R>,
    calls: &[workload::Call],
    repeat: u32,
) -> anyhow::Result<Summary>
where
    M: gpu_tuner::Operation<Key = gpu_tuner::cpu::MatmulKey>,
    R: gpu_tuner::Operation<Key = gpu_tuner::cpu::ReduceKey>,
{
    let mut summary = Summary::default();
    for _ in 0..repeat.max(1) {
        let pass = workload::run(matmul, reduce, calls)?;
        summary.wall += pass.wall;
        for (ns, s) in pass.namespaces {
            let acc = summary.namespaces.entry(ns).or_default();
            acc.calls += s.calls;
            acc.distinct_keys = s.distinct_keys;
            acc.stats = s.stats;
            acc.winners.extend(s.winners);
        }
    }
    Ok(summary)
}

fn median_of(cache: &Cache, namespace: &str, key: &str) -> Option<f64> {
    let ns = cache_core::Namespace::new(namespace).ok()?;
    let fields = serde_json::from_str::<Value>(key).ok()?;
    let Value::Map(fields) = fields else {
        return None;
    };
    let entry = cache.lookup(ns, &Key::new(fields))?;
    entry.best().and_then(|c| c.stats()).map(|s| s.median_ns)
}

fn report(
    path: &Path,
    backend: &str,
    scope: &Scope,
    summary: &Summary,
    cache: &Cache,
    as_json: bool,
    out: &mut Out,
) -> anyhow::Result<()> {
    let device = scope.fields().get("device").map(|v| match v {
        Value::Str(s) => s.clone(),
        other => other.to_string(),
    });
    if as_json {
        let namespaces: serde_json::Map<String, serde_json::Value> = summary
            .namespaces
            .iter()
            .map(|(ns, s)| {
                (
                    ns.clone(),
                    json!({
                        "calls": s.calls,
                        "distinct_keys": s.distinct_keys,
                        "keys_tuned": s.stats.tuned_keys,
                        "keys_reused": s.stats.reused_keys,
                        "hits": s.stats.hits,
                        "candidates_measured": s.stats.measured,
                        "tuning_seconds": s.stats.tuning_time.as_secs_f64(),
                        "saved_seconds": s.stats.saved_time.as_secs_f64(),
                        "winners": s.winners,
                    }),
                )
            })
            .collect();
        return out.json_pretty(&json!({
            "cache": path,
            "backend": backend,
            "device": device,
            "scope": scope.fields(),
            "wall_seconds": summary.wall.as_secs_f64(),
            "tuning_seconds": summary.tuning_time().as_secs_f64(),
            "saved_seconds": summary.saved_time().as_secs_f64(),
            "namespaces": namespaces,
        }));
    }
    out.line(format!(
        "tunecache tune: {backend} backend ({}), cache {}",
        device.unwrap_or_else(|| "unknown device".into()),
        path.display()
    ))?;
    out.line("")?;
    out.line(format!(
        "{:<10} {:>6} {:>6} {:>7} {:>7} {:>6} {:>9} {:>12} {:>12}",
        "namespace", "calls", "keys", "tuned", "reused", "hits", "measured", "tuning", "saved"
    ))?;
    for (ns, s) in &summary.namespaces {
        out.line(format!(
            "{:<10} {:>6} {:>6} {:>7} {:>7} {:>6} {:>9} {:>12} {:>12}",
            ns,
            s.calls,
            s.distinct_keys,
            s.stats.tuned_keys,
            s.stats.reused_keys,
            s.stats.hits,
            s.stats.measured,
            fmt_duration(s.stats.tuning_time),
            fmt_duration(s.stats.saved_time)
        ))?;
    }
    out.line("")?;
    out.line("winners (cache key after bucketing → best candidate, median time):")?;
    for (ns, s) in &summary.namespaces {
        for (key, winner) in &s.winners {
            let median = median_of(cache, ns, key)
                .map(|m| fmt_duration(Duration::from_nanos(m as u64)))
                .unwrap_or_default();
            out.line(format!("  {ns:<7} {key:<46} {winner:<22} {median}"))?;
        }
    }
    out.line("")?;
    let tuned: u64 = summary
        .namespaces
        .values()
        .map(|s| s.stats.tuned_keys)
        .sum();
    let reused: u64 = summary
        .namespaces
        .values()
        .map(|s| s.stats.reused_keys)
        .sum();
    let hits: u64 = summary.namespaces.values().map(|s| s.stats.hits).sum();
    if tuned == 0 {
        out.line(format!(
            "warm run: every key came from the cache ({reused} reused, {hits} hits, nothing measured) in {}; saved {} of tuning",
            fmt_duration(summary.wall),
            fmt_duration(summary.saved_time())
        ))?;
    } else {
        out.line(format!(
            "tuned {tuned} keys in {} ({reused} reused from the cache, {hits} hits); run `tunecache tune` again to see them hit",
            fmt_duration(summary.tuning_time())
        ))?;
    }
    Ok(())
}

/// `tunecache show`: one key's candidates, best first, as a bar chart of their median times.
pub(crate) fn show(
    path: &Path,
    namespace: &str,
    key: &str,
    scope: Option<&str>,
    out: &mut Out,
) -> anyhow::Result<u8> {
    let found = crate::commands::read_inspection(path)?;
    let key = Key::new(crate::commands::parse_fields("--key", key)?);
    let scope = crate::commands::scope_filter(scope)?;
    let mut shown = 0;
    for (s, entry) in crate::commands::entries_for(&found, namespace, &key, scope.as_ref()) {
        shown += 1;
        out.line(format!("{namespace} {key}"))?;
        out.line(format!("  scope {s}"))?;
        let slowest = entry
            .candidates()
            .iter()
            .filter_map(|c| c.stats().map(|s| s.median_ns))
            .fold(0.0f64, f64::max);
        let label_width = entry
            .candidates()
            .iter()
            .map(|c| {
                gpu_tuner::CandidateSpec {
                    algorithm: c.algorithm.clone(),
                    params: c.params.clone(),
                }
                .label()
                .chars()
                .count()
            })
            .max()
            .unwrap_or(0);
        for (rank, c) in entry.candidates().iter().enumerate() {
            let label = gpu_tuner::CandidateSpec {
                algorithm: c.algorithm.clone(),
                params: c.params.clone(),
            }
            .label();
            let line = match &c.outcome {
                Outcome::Measured(st) => {
                    const WIDTH: f64 = 40.0;
                    let filled = if slowest > 0.0 {
                        ((st.median_ns / slowest) * WIDTH).round().max(1.0) as usize
                    } else {
                        1
                    };
                    format!(
                        "{:<w$}  {:<40}  {:>10}  ±{:>8}  n={}{}",
                        label,
                        "█".repeat(filled),
                        fmt_duration(Duration::from_nanos(st.median_ns as u64)),
                        fmt_duration(Duration::from_nanos(st.spread_ns as u64)),
                        st.samples,
                        if rank == 0 { "  ← best" } else { "" },
                        w = label_width
                    )
                }
                Outcome::Failed(reason) => {
                    format!("{label:<w$}  failed: {reason}", w = label_width)
                }
            };
            out.line(format!("  {line}"))?;
        }
    }
    if shown == 0 {
        eprintln!(
            "tunecache: no entry for {key} in namespace {namespace:?} of {}",
            path.display()
        );
        return Ok(exit::NOT_FOUND);
    }
    Ok(exit::OK)
}
