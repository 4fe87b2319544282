//! `tunecache put`: records one measurement (from a script) through the library, under the
//! same lock and version gate.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use serde::Serialize;

use cache_core::cache_migrate::Migrations;
use cache_core::{AppendOptions, Appended, Namespace, Store, append_to_file};
use cache_format::{
    Candidate, CandidateId, Entry, Fingerprint, Key, Origin, Outcome, Scope, Stats, now_millis,
};

use crate::context::{Context, close, saving};
use crate::exit;
use crate::options::{KeyArgs, WaitArgs, nonneg_f64, usage};
use crate::output::{Out, Report};
use crate::render::parse_fields;

/// The arguments of `tunecache put`.
#[derive(Debug, Args)]
pub(crate) struct PutArgs {
    #[command(flatten)]
    key: KeyArgs,
    /// The candidate's algorithm name
    #[arg(long)]
    algo: String,
    /// The candidate's params, as a JSON object
    #[arg(long, default_value = "{}")]
    params: String,
    /// Median time in nanoseconds (required unless --failed)
    #[arg(long, value_parser = nonneg_f64, required_unless_present = "failed")]
    median_ns: Option<f64>,
    /// Fastest sample in nanoseconds [default: the median]
    #[arg(long, value_parser = nonneg_f64)]
    min_ns: Option<f64>,
    /// Spread of the samples in nanoseconds [default: 0]
    #[arg(long, value_parser = nonneg_f64)]
    spread_ns: Option<f64>,
    /// Number of samples
    #[arg(long, default_value_t = 1)]
    samples: u32,
    /// Record the candidate as failed, with this reason, instead of a timing
    #[arg(long, conflicts_with_all = ["median_ns", "min_ns", "spread_ns"])]
    failed: Option<String>,
    /// The scope (JSON object)
    #[arg(long, default_value = "{}")]
    scope: String,
    /// Checksum of the candidate set measured (32 hex digits) [default: unknown]
    #[arg(long)]
    candidate_set: Option<String>,
    /// Schema version of a new file (an existing file keeps its own)
    #[arg(long, default_value_t = 1)]
    schema: u32,
    #[command(flatten)]
    wait: WaitArgs,
}

#[derive(Debug, Serialize)]
struct PutReport {
    recorded: bool,
    namespace: String,
    #[serde(skip)]
    key: Key,
    fingerprint: String,
    path: PathBuf,
}

impl PutArgs {
    fn candidate(&self) -> anyhow::Result<Candidate> {
        if self.algo.is_empty() {
            return Err(usage("--algo must name the algorithm (it is empty)"));
        }
        let params = parse_fields("--params", &self.params)?;
        let outcome = match (&self.failed, self.median_ns) {
            (Some(reason), _) => Outcome::Failed(reason.clone()),
            (None, Some(median)) => {
                // No measured kernel takes no time: the shared tier's readers refuse a zero
                // median as made up (`-0` and NaN included).
                if !(median.is_finite() && median > 0.0) {
                    return Err(usage(format!(
                        "--median-ns must be a number of nanoseconds above 0, got {median}"
                    )));
                }
                let min = self.min_ns.unwrap_or(median);
                if min > median {
                    return Err(usage(format!(
                        "--min-ns {min} is above --median-ns {median}: the fastest sample cannot be slower than the median"
                    )));
                }
                if self.samples == 0 {
                    return Err(usage("--samples must be at least 1 for a measurement"));
                }
                Outcome::Measured(Stats {
                    median_ns: median,
                    min_ns: min,
                    spread_ns: self.spread_ns.unwrap_or(0.0),
                    samples: self.samples,
                })
            }
            (None, None) => return Err(usage("--median-ns is required unless --failed is given")),
        };
        Ok(Candidate::new(
            CandidateId::with_params(self.algo.clone(), params),
            outcome,
        ))
    }

    pub(crate) fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        let path = ctx.path()?;
        let candidate = self.candidate()?;
        let set = match &self.candidate_set {
            Some(hex) => hex.parse().context("--candidate-set")?,
            None => Fingerprint::default(),
        };
        let key = Key::new(parse_fields("--key", &self.key.key)?);
        let scope = Scope::new(parse_fields("--scope", &self.scope)?);
        let ns = Namespace::new(&self.key.namespace)?;
        let origin = match cache_core::measured_here() {
            Origin::Measured(who) => Origin::Measured(format!("{who} via tunecache put")),
            other => other,
        };
        let target = ctx.write_target(&path, self.schema)?;
        let entry = Entry::new(key.clone(), set, origin, now_millis(), [candidate]);
        // One record appended under the lock, reading only the header: the cost does not
        // depend on the cache's size. A file that needs more (none yet, an older schema,
        // repairs, a compaction due) goes through a Cache, as the library would.
        ctx.check_writable("put")?;
        crate::shared::check_publishable()?;
        let options = AppendOptions {
            lock_timeout: self.wait.wait,
            ..AppendOptions::default()
        };
        let registry = Migrations::new(target.0.clone(), target.1);
        let appended = saving("the result", &path, || {
            append_to_file(
                &path,
                &registry,
                &scope,
                vec![(ns, entry.clone())],
                &options,
            )
        })
        .with_context(|| format!("the result was not saved to {}", path.display()))?;
        if let Appended::NeedsCache { reason } = appended {
            tracing::debug!("tunecache put: through a full open: {reason}");
            let cache = ctx.open_for_write("put", &path, target, scope.clone(), self.wait.wait)?;
            cache.try_put(ns, entry.clone())?;
            close(cache, "the result", &path)?;
        }
        let mut published = cache_format::CacheData::new();
        published.insert(&scope, ns.name(), entry);
        crate::shared::publish(&registry, &published)?;
        let report = PutReport {
            recorded: true,
            namespace: self.key.namespace,
            fingerprint: key.fingerprint().to_hex(),
            key,
            path,
        };
        out.item(&report, ctx.json)?;
        Ok(exit::OK)
    }
}

impl Report for PutReport {
    fn text(&self, out: &mut Out) -> anyhow::Result<()> {
        out.line(format!(
            "recorded {} {} ({}) in {}",
            self.namespace,
            self.key,
            self.fingerprint,
            self.path.display()
        ))
    }
}
