//! `tunecache generation`: whole-cache generations on the S3 bucket `TUNECACHE_REMOTE` names
//! (cache-remote's `Generations`): publish the cache file as one (`snapshot`), list them, fetch
//! one into the cache's folder, prune old ones. A job pins its ranks to one with
//! `TUNECACHE_GENERATION=<id>` (or `current`): each machine fetches it once and reads it as
//! its system tier.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use serde::Serialize;

use cache_core::BundleWriter;
use cache_core::cache_format::{Limits, now_millis};
use cache_core::cache_migrate::Migrations;
use cache_remote::{Generations, S3Remote};

use crate::context::Context;
use crate::damage::Damage;
use crate::exit;
use crate::options::usage;
use crate::output::{Out, Report};

/// The arguments of `tunecache generation`.
#[derive(Debug, Args)]
pub(crate) struct GenerationArgs {
    #[command(subcommand)]
    action: Action,
    /// How long the bucket may take, in seconds
    #[arg(long, default_value_t = 300)]
    timeout: u64,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Publish the cache file as a generation and make it the current one
    Snapshot {
        /// Publish even if the cache is damaged: without what could not be read (each lost
        /// block is said on stderr). Without it, a damaged cache publishes nothing and exits 3
        #[arg(long)]
        allow_damaged: bool,
    },
    /// The generations in the bucket, and the current one
    List,
    /// Download a generation (default: the current one) into the cache's folder, verified
    Fetch {
        /// A generation's id (64 hex digits), or `current`
        #[arg(default_value = "current")]
        id: String,
    },
    /// Delete generations older than this many days, never the current one
    Prune {
        /// Age in days
        #[arg(long)]
        older_than_days: u64,
    },
}

#[derive(Debug, Default, Serialize)]
struct GenerationReport {
    bucket: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    current: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    published: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fetched: Option<PathBuf>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    generations: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pruned: Vec<String>,
}

impl Report for GenerationReport {
    fn text(&self, out: &mut Out) -> anyhow::Result<()> {
        let mut lines = vec![format!("generations in {}", self.bucket)];
        if let Some(id) = &self.published {
            lines.push(format!("  published {id} (now current)"));
        }
        if let Some(path) = &self.fetched {
            lines.push(format!("  fetched into {}", path.display()));
        }
        for id in &self.generations {
            let mark = if self.current.as_deref() == Some(id.as_str()) {
                "  (current)"
            } else {
                ""
            };
            lines.push(format!("  {id}{mark}"));
        }
        for id in &self.pruned {
            lines.push(format!("  pruned {id}"));
        }
        for line in lines {
            out.line(line)?;
        }
        Ok(())
    }
}

/// The generations of the bucket `TUNECACHE_REMOTE` names.
pub(crate) fn from_env() -> anyhow::Result<(Generations, String)> {
    let address = std::env::var(cache_remote::ENV_REMOTE).map_err(|_| {
        usage(format!(
            "`tunecache generation` needs a bucket: set {}=s3://BUCKET/PREFIX",
            cache_remote::ENV_REMOTE
        ))
    })?;
    if !address.trim().starts_with("s3://") {
        return Err(usage(format!(
            "generations live on an S3 bucket; {} is {address:?}",
            cache_remote::ENV_REMOTE
        )));
    }
    let store = S3Remote::open(address.trim(), |name| std::env::var(name).ok())?;
    let describe = cache_remote::Remote::describe(&store);
    Ok((Generations::new(store), describe))
}

/// Where a machine keeps the generations it fetched: `generations/` beside the cache file.
pub(crate) fn local_dir(cache_file: &std::path::Path) -> PathBuf {
    cache_file
        .parent()
        .map_or_else(|| PathBuf::from("generations"), |p| p.join("generations"))
}

/// The generation `TUNECACHE_GENERATION` pins (an id, or `current`), fetched once beside
/// `cache_file`, to read as a system file; a failure is said and the command goes on without.
pub(crate) fn pinned(cache_file: &std::path::Path) -> Option<PathBuf> {
    let id = std::env::var(cache_remote::ENV_GENERATION).ok()?;
    let id = id.trim();
    if id.is_empty() {
        return None;
    }
    let fetched = from_env().and_then(|(generations, _)| {
        Ok(generations.fetch(id, &local_dir(cache_file), Duration::from_secs(300))?)
    });
    match fetched {
        Ok(path) => Some(path),
        Err(e) => {
            crate::output::say(format_args!(
                "{}={id} is not used: {e:#}",
                cache_remote::ENV_GENERATION
            ));
            None
        }
    }
}

impl GenerationArgs {
    pub(crate) fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        let (generations, bucket) = from_env()?;
        let timeout = Duration::from_secs(self.timeout);
        let mut report = GenerationReport {
            bucket,
            ..GenerationReport::default()
        };
        match self.action {
            Action::Snapshot { allow_damaged } => {
                let path = ctx.path()?;
                let found = ctx.inspect_as_read(&path)?;
                let Some((app, schema)) = ctx.version_as_read(&found) else {
                    bail!("{}: no readable cache to snapshot", path.display());
                };
                // Written where this machine keeps generations, so it has the one it publishes.
                let dir = local_dir(&path);
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
                let bundle = dir.join(format!(".snapshot.{}.tcb", std::process::id()));
                // Reproducible: the same entries give the same bytes, so the same generation.
                let not_written =
                    || format!("the generation of {} was not written", path.display());
                let mut writer = BundleWriter::create(
                    &bundle,
                    &Migrations::new(app, schema),
                    &Limits::default(),
                )
                .with_context(not_written)?;
                let mut walk = found.in_key_order();
                for (_, scope, ns, entry) in walk.by_ref() {
                    writer.add(&scope, &ns, &entry).with_context(not_written)?;
                }
                let damage = Damage::of([found.problems.as_slice(), walk.problems()]);
                if let Some(code) = damage.refuse("the generation", allow_damaged) {
                    return Ok(code);
                }
                writer
                    .finish(Some(0), "tunecache generation")
                    .with_context(not_written)?;
                let published = generations.publish(&bundle, timeout);
                let id = match published {
                    Ok(id) => id,
                    Err(e) => {
                        let _ = std::fs::remove_file(&bundle);
                        return Err(e.into());
                    }
                };
                let kept = dir.join(format!("{id}.tcb"));
                if kept.exists() {
                    let _ = std::fs::remove_file(&bundle);
                } else {
                    std::fs::rename(&bundle, &kept)
                        .with_context(|| format!("cannot keep {}", kept.display()))?;
                }
                report.published = Some(id.clone());
                report.current = Some(id);
            }
            Action::List => {
                report.current = generations.current(timeout).ok();
                report.generations = generations
                    .list(timeout)?
                    .into_iter()
                    .map(|g| g.id)
                    .collect();
            }
            Action::Fetch { id } => {
                let dir = local_dir(&ctx.path()?);
                report.fetched = Some(generations.fetch(&id, &dir, timeout)?);
            }
            Action::Prune { older_than_days } => {
                // Saturating: a huge number of days is "older than anything", never a wrap
                // round to a short age (or a panic).
                let age = Duration::from_secs(older_than_days.saturating_mul(24 * 3600));
                report.pruned = generations.prune(age, now_millis(), timeout)?;
                report.current = generations.current(timeout).ok();
            }
        }
        out.report(&report, ctx.json)?;
        Ok(exit::OK)
    }
}
