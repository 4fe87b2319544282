//! `tunecache tune`: the built-in workload (the demo application, `crate::workload`) tuned end
//! to end on the CPU or CUDA backend, with a progress bar on a terminal and a summary.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use cache_core::{Cache, Mode, Namespace, Store};
use cache_format::{Fields, Key, Scope, Value};
use cache_remote::RemoteCache as _;
use clap::{Args, ValueEnum};
use gpu_tuner::{Progress, Tuner};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use crate::context::Context;
use crate::exit;
use crate::output::{Out, Report, say};
use crate::render::fmt_duration;
use crate::workload::{self, Call, Summary};

/// What the summary's columns count (`tunecache tune --help`; docs/cli.md says the same).
pub(crate) const COLUMNS: &str = "The summary, per namespace:
  calls     calls the workload made
  keys      distinct problem keys among them
  tuned     keys measured in this run (a miss: every candidate timed; on a device new to
            the key, the best five of the other devices' ranking, the rest only if they
            measure here nearly the other way round)
  bucket    keys served, without measuring, by a cache key this run measured for another key
            of the same bucket (shapes are rounded into buckets before the cache is asked)
  reused    keys served, without measuring, by what the cache held before this run (or a
            shared tier, or another process)
  hits      calls served from the in-memory dispatch table (a key called again)
  measured  candidates timed (or found failing)
  tuning    time spent preparing and timing candidates
  saved     the tuning time the reused keys had cost when they were measured
tuned + bucket + reused = keys; keys + hits = calls. A second run measures nothing: every key
is reused.";

/// Which backend measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Backend {
    /// CUDA if a driver, NVRTC and a device are usable, else the CPU.
    Auto,
    /// The CPU.
    Cpu,
    /// CUDA (an error if it is not usable).
    Cuda,
}

/// The arguments of `tunecache tune`.
#[derive(Debug, Args)]
pub(crate) struct TuneArgs {
    /// Which backend measures
    #[arg(long, value_enum, default_value = "auto")]
    backend: Backend,
    /// The CUDA device
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Run the workload this many times in this process
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// Run only the first N of the workload's 12 steps
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    steps: Option<u64>,
    /// Draw no progress bar
    #[arg(long)]
    no_progress: bool,
    /// Write a buffer larger than L2 before every CUDA sample
    #[arg(long)]
    flush_l2: bool,
}

/// What a tune did.
#[derive(Debug, Serialize)]
struct TuneReport {
    cache: PathBuf,
    backend: String,
    device: Option<String>,
    scope: Fields,
    wall_seconds: f64,
    tuning_seconds: f64,
    saved_seconds: f64,
    namespaces: BTreeMap<String, NamespaceReport>,
}

#[derive(Debug, Serialize)]
struct NamespaceReport {
    calls: usize,
    distinct_keys: usize,
    keys_tuned: u64,
    keys_bucketed: u64,
    keys_reused: u64,
    hits: u64,
    candidates_measured: u64,
    /// Winners from the shared tier that ran far slower here than their recorded figures:
    /// tuned here instead.
    remote_distrusted: u64,
    tuning_seconds: f64,
    saved_seconds: f64,
    /// The winner per cache key (after bucketing).
    winners: BTreeMap<String, String>,
    /// The winner's median time per cache key, in nanoseconds, where recorded.
    #[serde(skip)]
    medians: BTreeMap<String, f64>,
}

impl TuneArgs {
    pub(crate) fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        let path = ctx.path()?;
        ctx.check_writable("tune")?;
        let steps = self
            .steps
            .map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
        let calls = workload::builtin_steps(steps);
        let use_cuda = match self.backend {
            Backend::Cpu => false,
            Backend::Cuda => {
                cuda_usable().context("--backend cuda")?;
                true
            }
            Backend::Auto => match cuda_usable() {
                Ok(()) => true,
                Err(why) => {
                    say(format_args!("no usable GPU ({why:#}); tuning on the CPU"));
                    false
                }
            },
        };
        let pb = progress_bar(!self.no_progress && !ctx.json);
        let (summary, backend, scope, cache) = if use_cuda {
            run_cuda(&path, self.device, self.repeat, self.flush_l2, &calls, &pb)?
        } else {
            let scope = gpu_tuner::cpu::scope();
            let cache = open_cache(&path, scope.clone())?;
            let tuner = tuner_with_progress(&cache, &pb);
            let matmul = tuner.register(gpu_tuner::cpu::Matmul, workload::op_config("matmul"))?;
            let reduce = tuner.register(gpu_tuner::cpu::Reduce, workload::op_config("reduce"))?;
            let summary = run_repeated(&matmul, &reduce, &calls, self.repeat)?;
            (summary, "cpu".to_owned(), scope, cache)
        };
        pb.finish_and_clear();
        let durable = cache.flush();
        if let Some(remote) = cache.remote_health()
            && remote.mode == cache_remote::RemoteMode::ReadWrite
        {
            match cache.publish_within(crate::shared::WAIT) {
                Ok(()) => say(format_args!(
                    "shared tier at {}: {} read, {} published",
                    remote.describe,
                    remote.hits,
                    cache.remote_health().map_or(0, |r| r.published)
                )),
                Err(e) => say(format_args!(
                    "could not publish to the shared tier at {}: {e} (the local save still counts)",
                    remote.describe
                )),
            }
        }
        let report = TuneReport::new(path.clone(), backend, &scope, &summary, &cache);
        out.report(&report, ctx.json)?;
        match durable {
            Ok(()) => Ok(exit::OK),
            Err(e) => {
                say(format_args!(
                    "the results were not all saved to {}: {e}",
                    path.display()
                ));
                Ok(exit::ERROR)
            }
        }
    }
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

#[cfg(feature = "cuda")]
fn cuda_usable() -> anyhow::Result<()> {
    gpu_tuner::cuda::usable().context("CUDA is not usable here")
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
    calls: &[Call],
    pb: &ProgressBar,
) -> anyhow::Result<(Summary, String, Scope, Arc<Cache>)> {
    let artifacts_dir = cache_core::ArtifactStore::default_dir()
        .unwrap_or_else(|| path.parent().unwrap_or(Path::new(".")).join("artifacts"));
    let artifacts = match cache_core::ArtifactStore::open(&artifacts_dir, 512 << 20) {
        Ok(a) => Some(a),
        Err(e) => {
            say(format_args!("compiled kernels will not be kept ({e})"));
            None
        }
    };
    let device = gpu_tuner::cuda::Device::open(ordinal, artifacts)?;
    let scope = device.scope();
    let cache = open_cache(path, scope.clone())?;
    let tuner = tuner_with_progress(&cache, pb);
    let mut mm = gpu_tuner::cuda::CudaMatmul::new(Arc::clone(&device));
    mm.flush_l2 = flush_l2;
    let mut rd = gpu_tuner::cuda::CudaReduce::new(Arc::clone(&device));
    rd.flush_l2 = flush_l2;
    let matmul = tuner.register(mm, workload::op_config("matmul"))?;
    let reduce = tuner.register(rd, workload::op_config("reduce"))?;
    let summary = run_repeated(&matmul, &reduce, calls, repeat)?;
    let (compiled, reused) = device.compiler().counts();
    say(format_args!(
        "{compiled} kernels compiled by NVRTC, {reused} loaded from {}",
        artifacts_dir.display()
    ));
    Ok((summary, "cuda".to_owned(), scope, cache))
}

#[cfg(not(feature = "cuda"))]
fn run_cuda(
    _: &Path,
    _: usize,
    _: u32,
    _: bool,
    _: &[Call],
    _: &ProgressBar,
) -> anyhow::Result<(Summary, String, Scope, Arc<Cache>)> {
    anyhow::bail!("this tunecache was built without the cuda feature")
}

fn open_cache(path: &Path, scope: Scope) -> anyhow::Result<Arc<Cache>> {
    use cache_remote::RemoteBuilder as _;
    let system: Vec<PathBuf> = crate::settings().system_paths();
    let builder = Cache::builder(workload::registry())
        .file(path)
        .ignore_env()
        .scope(scope)
        .refresh_interval(None)
        .system_files(system);
    // The shared tier is the one setting taken from the environment here (the file comes
    // from the command line): TUNECACHE_REMOTE and its mode and budget.
    // A generation the environment pins on its bucket (or, with none pinned, the bucket's
    // current one as a warm-up) comes before it, as for the library.
    let builder = match crate::settings().get(cache_remote::ENV_REMOTE) {
        Some(address) => match cache_remote::from_settings(crate::settings())? {
            Some(remote) => {
                let (options, warnings) = remote.default_options().from_settings(crate::settings());
                for w in warnings {
                    say(w);
                }
                builder.remote_at(remote, options, address, crate::settings())
            }
            None => builder,
        },
        None => builder,
    };
    let cache = builder.open();
    if cache.health().mode != Mode::Persistent {
        say(format_args!(
            "results will not be saved: {}",
            cache
                .health()
                .reason
                .unwrap_or_else(|| "the cache is not persistent".into())
        ));
    }
    Ok(Arc::new(cache))
}

fn tuner_with_progress(cache: &Arc<Cache>, pb: &ProgressBar) -> Tuner {
    // Processes sharing a tier lease each key, so one of them measures it.
    let tuner = match gpu_tuner::fleet::of_cache(cache) {
        Some(fleet) => Tuner::new(Arc::clone(cache)).with_fleet(fleet),
        None => Tuner::new(Arc::clone(cache)),
    };
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
    calls: &[Call],
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
    let ns = Namespace::new(namespace).ok()?;
    let Value::Map(fields) = serde_json::from_str::<Value>(key).ok()? else {
        return None;
    };
    let entry = cache.lookup(ns, &Key::new(fields))?;
    entry.best().and_then(|c| c.stats()).map(|s| s.median_ns)
}

impl TuneReport {
    fn new(
        cache_path: PathBuf,
        backend: String,
        scope: &Scope,
        summary: &Summary,
        cache: &Cache,
    ) -> Self {
        let device = scope.fields().get("device").map(|v| match v {
            Value::Str(s) => s.clone(),
            other => other.to_string(),
        });
        let namespaces = summary
            .namespaces
            .iter()
            .map(|(ns, s)| {
                let medians = s
                    .winners
                    .keys()
                    .filter_map(|key| median_of(cache, ns, key).map(|m| (key.clone(), m)))
                    .collect();
                let report = NamespaceReport {
                    calls: s.calls,
                    distinct_keys: s.distinct_keys,
                    keys_tuned: s.stats.tuned_keys,
                    keys_bucketed: s.stats.bucketed_keys,
                    keys_reused: s.stats.reused_keys,
                    hits: s.stats.hits,
                    candidates_measured: s.stats.measured,
                    remote_distrusted: s.stats.remote_distrusted,
                    tuning_seconds: s.stats.tuning_time.as_secs_f64(),
                    saved_seconds: s.stats.saved_time.as_secs_f64(),
                    winners: s.winners.clone(),
                    medians,
                };
                (ns.clone(), report)
            })
            .collect();
        TuneReport {
            cache: cache_path,
            backend,
            device,
            scope: scope.fields().clone(),
            wall_seconds: summary.wall.as_secs_f64(),
            tuning_seconds: summary.tuning_time().as_secs_f64(),
            saved_seconds: summary.saved_time().as_secs_f64(),
            namespaces,
        }
    }
}

fn secs(s: f64) -> String {
    fmt_duration(Duration::from_secs_f64(s))
}

impl Report for TuneReport {
    fn text(&self, out: &mut Out) -> anyhow::Result<()> {
        out.line(format!(
            "tunecache tune: {} backend ({}), cache {}",
            self.backend,
            self.device.as_deref().unwrap_or("unknown device"),
            self.cache.display()
        ))?;
        out.line("")?;
        out.line(format!(
            "{:<10} {:>6} {:>6} {:>7} {:>7} {:>7} {:>6} {:>9} {:>12} {:>12}",
            "namespace",
            "calls",
            "keys",
            "tuned",
            "bucket",
            "reused",
            "hits",
            "measured",
            "tuning",
            "saved"
        ))?;
        for (ns, s) in &self.namespaces {
            out.line(format!(
                "{:<10} {:>6} {:>6} {:>7} {:>7} {:>7} {:>6} {:>9} {:>12} {:>12}",
                ns,
                s.calls,
                s.distinct_keys,
                s.keys_tuned,
                s.keys_bucketed,
                s.keys_reused,
                s.hits,
                s.candidates_measured,
                secs(s.tuning_seconds),
                secs(s.saved_seconds)
            ))?;
        }
        out.line("")?;
        out.line("winners (cache key after bucketing → best candidate, median time):")?;
        for (ns, s) in &self.namespaces {
            for (key, winner) in &s.winners {
                let median = s
                    .medians
                    .get(key)
                    .map(|m| fmt_duration(Duration::from_nanos(*m as u64)))
                    .unwrap_or_default();
                out.line(format!("  {ns:<7} {key:<46} {winner:<22} {median}"))?;
            }
        }
        out.line("")?;
        let sum = |f: fn(&NamespaceReport) -> u64| self.namespaces.values().map(f).sum::<u64>();
        let tuned = sum(|s| s.keys_tuned);
        let reused = sum(|s| s.keys_reused);
        let bucketed = sum(|s| s.keys_bucketed);
        let hits = sum(|s| s.hits);
        let distrusted = sum(|s| s.remote_distrusted);
        if distrusted > 0 {
            out.line(format!(
                "{distrusted} winners from the shared tier ran far slower here than recorded: their keys were tuned here"
            ))?;
        }
        if tuned == 0 {
            out.line(format!(
                "warm run: every key came from the cache ({reused} reused, {hits} hits, nothing measured) in {}; saved {} of tuning",
                secs(self.wall_seconds),
                secs(self.saved_seconds)
            ))
        } else {
            let mut served = vec![format!(
                "{bucketed} more served by a key of their bucket tuned in this run"
            )];
            if reused > 0 {
                served.push(format!("{reused} reused from the cache"));
            }
            served.push(format!("{hits} hits"));
            out.line(format!(
                "tuned {tuned} keys in {} ({}); run `tunecache tune` again to see them hit",
                secs(self.tuning_seconds),
                served.join(", ")
            ))
        }
    }
}
