//! `tunecache outputs stats|verify|gc|clear DIR`: an output cache's directory (crate
//! cache-outputs): what it holds, whether every value is sound, pruning to a size, emptying.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use serde::Serialize;

use cache_core::ArtifactStore;

use crate::context::Context;
use crate::exit;
use crate::output::{Out, Report};

/// The arguments of `tunecache outputs`.
#[derive(Debug, Args)]
pub(crate) struct OutputsArgs {
    #[command(subcommand)]
    command: OutputsCommand,
}

#[derive(Debug, Subcommand)]
enum OutputsCommand {
    /// How many values, how many bytes, the oldest and newest use
    Stats {
        /// The output cache's directory
        dir: PathBuf,
    },
    /// Check every value (framing, checksum, header); exit 3 if any is damaged
    Verify {
        /// The output cache's directory
        dir: PathBuf,
        /// Also remove the damaged values (a reader would remove them anyway)
        #[arg(long)]
        remove: bool,
    },
    /// Remove the least recently used values until the directory holds at most SIZE
    Gc {
        /// The output cache's directory
        dir: PathBuf,
        /// The size to fit (bytes, or with K, M or G)
        #[arg(long, value_name = "SIZE", value_parser = super::gc::size)]
        max_size: u64,
        /// Say what would go; change nothing
        #[arg(long)]
        dry_run: bool,
    },
    /// Remove every value
    Clear {
        /// The output cache's directory
        dir: PathBuf,
    },
}

#[derive(Debug, Serialize)]
struct OutputsOut {
    dir: PathBuf,
    action: &'static str,
    values: usize,
    bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    oldest_use_secs_ago: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    newest_use_secs_ago: Option<u64>,
    removed: usize,
    freed: u64,
    damaged: Vec<Damaged>,
    dry_run: bool,
}

#[derive(Debug, Serialize)]
struct Damaged {
    path: PathBuf,
    problem: String,
}

fn open(dir: &Path) -> anyhow::Result<ArtifactStore> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => bail!("{} is not a directory", dir.display()),
        Err(e) => bail!("cannot use {}: {e}", dir.display()),
    }
    ArtifactStore::open(dir, u64::MAX).with_context(|| format!("cannot open {}", dir.display()))
}

fn secs_ago(t: SystemTime) -> u64 {
    SystemTime::now()
        .duration_since(t)
        .map_or(0, |d| d.as_secs())
}

impl OutputsArgs {
    pub(crate) fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        let (dir, action) = match &self.command {
            OutputsCommand::Stats { dir } => (dir.clone(), "stats"),
            OutputsCommand::Verify { dir, .. } => (dir.clone(), "verify"),
            OutputsCommand::Gc { dir, .. } => (dir.clone(), "gc"),
            OutputsCommand::Clear { dir } => (dir.clone(), "clear"),
        };
        let store = open(&dir)?;
        let blobs = store
            .blobs()
            .with_context(|| format!("cannot list {}", dir.display()))?;
        let mut report = OutputsOut {
            dir: dir.clone(),
            action,
            values: blobs.len(),
            bytes: blobs.iter().map(|b| b.len).sum(),
            oldest_use_secs_ago: blobs.iter().map(|b| b.last_use).min().map(secs_ago),
            newest_use_secs_ago: blobs.iter().map(|b| b.last_use).max().map(secs_ago),
            removed: 0,
            freed: 0,
            damaged: Vec::new(),
            dry_run: false,
        };
        let mut code = exit::OK;
        match self.command {
            OutputsCommand::Stats { .. } => {}
            OutputsCommand::Verify { remove, .. } => {
                for b in &blobs {
                    let problem = match ArtifactStore::read_checked(&b.path) {
                        Ok(Some(payload)) => cache_outputs::check_value(&payload)
                            .err()
                            .map(|e| e.to_string()),
                        Ok(None) => Some("a wrong magic, length or checksum".to_owned()),
                        Err(e) => Some(e.to_string()),
                    };
                    if let Some(problem) = problem {
                        if remove && std::fs::remove_file(&b.path).is_ok() {
                            report.removed += 1;
                            report.freed += b.len;
                        }
                        report.damaged.push(Damaged {
                            path: b.path.clone(),
                            problem,
                        });
                    }
                }
                if !report.damaged.is_empty() {
                    code = exit::PROBLEMS;
                }
            }
            OutputsCommand::Gc {
                max_size, dry_run, ..
            } => {
                report.dry_run = dry_run;
                if dry_run {
                    let mut sorted = blobs.clone();
                    sorted.sort_by(|a, b| a.last_use.cmp(&b.last_use).then(a.path.cmp(&b.path)));
                    let mut total = report.bytes;
                    for b in sorted {
                        if total <= max_size {
                            break;
                        }
                        total -= b.len;
                        report.removed += 1;
                        report.freed += b.len;
                    }
                } else {
                    let e = store
                        .evict_to(max_size, 1.0)
                        .with_context(|| format!("cannot prune {}", dir.display()))?;
                    report.removed = e.removed;
                    report.freed = e.freed;
                }
            }
            OutputsCommand::Clear { .. } => {
                report.removed = store
                    .clear()
                    .with_context(|| format!("cannot clear {}", dir.display()))?;
                report.freed = report.bytes;
            }
        }
        out.report(&report, ctx.json)?;
        Ok(code)
    }
}

impl Report for OutputsOut {
    fn text(&self, out: &mut Out) -> anyhow::Result<()> {
        out.line(format!(
            "{}: {} values, {} bytes",
            self.dir.display(),
            self.values,
            self.bytes
        ))?;
        if let (Some(o), Some(n)) = (self.oldest_use_secs_ago, self.newest_use_secs_ago) {
            out.line(format!("last used: oldest {o} s ago, newest {n} s ago"))?;
        }
        for d in &self.damaged {
            out.line(format!("damaged: {}: {}", d.path.display(), d.problem))?;
        }
        match self.action {
            "verify" if self.damaged.is_empty() => out.line("every value is sound")?,
            "verify" | "gc" | "clear" => {
                let verb = if self.dry_run {
                    "would remove"
                } else {
                    "removed"
                };
                out.line(format!(
                    "{verb} {} values, {} bytes",
                    self.removed, self.freed
                ))?;
            }
            _ => {}
        }
        Ok(())
    }
}
