//! `tunecache migrate`: brings a cache to the current schema and format, with the library's
//! own code path (the same bytes as a `Cache` that migrated the file on load).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use serde::Serialize;

use cache_core::{MigrateOptions, MigrateOutcome, migrate_file};
use cache_format::Limits;
use cache_migrate::{Migrations, Report as MigrationReport};

use crate::context::{Context, peek_app};
use crate::exit;
use crate::options::seconds;
use crate::output::{Out, Report};
use crate::progress::Pace;

/// The arguments of `tunecache migrate`.
#[derive(Debug, Args)]
pub(crate) struct MigrateArgs {
    /// The application's migration file (JSON); needed unless the embedding tool
    /// provides the registry
    #[arg(long, value_name = "FILE")]
    migrations: Option<PathBuf>,
    /// Also keep the file as it was, as <file>.bak.<ms>
    #[arg(long)]
    backup: bool,
    /// Report the plan and what would change; write nothing
    #[arg(long)]
    dry_run: bool,
    /// Longest wait, in seconds, for another process holding the cache lock
    #[arg(long, default_value = "10", value_parser = seconds)]
    lock_timeout: Duration,
}

#[derive(Debug, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
enum Outcome {
    /// No file.
    Missing { path: PathBuf },
    /// Already current.
    Current {
        path: PathBuf,
        schema: u32,
        entries: usize,
    },
    /// Migrated (or would be, in a dry run).
    #[serde(rename = "migrated")]
    Migrated(Migrated),
    #[serde(rename = "dry-run")]
    DryRun(Migrated),
}

#[derive(Debug, Serialize)]
struct Migrated {
    path: PathBuf,
    app: String,
    from: u32,
    to: u32,
    entries: usize,
    steps: Vec<StepLine>,
    collisions: Vec<String>,
    backups: Vec<PathBuf>,
    seconds: f64,
    /// The entries migrated, and how fast.
    pace: Pace,
    /// The plan's lines (dry run text only).
    #[serde(skip)]
    plan: Vec<String>,
    #[serde(skip)]
    summary: String,
}

#[derive(Debug, Serialize)]
struct StepLine {
    from: u32,
    to: u32,
    description: String,
    lines: Vec<String>,
}

impl MigrateArgs {
    pub(crate) fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        if !self.dry_run {
            ctx.check_writable("migrate")?;
        }
        let from_file = self
            .migrations
            .as_deref()
            .map(|f| ctx.migration_file(f))
            .transpose()?;
        // The application (and so the default file) may come from the migration file.
        let app = ctx.app_or(from_file.as_ref().map(Migrations::app));
        let path = ctx.path_for(&app)?;
        let file_app = peek_app(&path).unwrap_or(app);
        let registry = match from_file {
            Some(r) => r,
            None => ctx.registry(&file_app).cloned().with_context(|| {
                format!(
                    "no migration registry for application {file_app:?}: pass --migrations FILE"
                )
            })?,
        };
        let options = MigrateOptions {
            backup: self.backup,
            dry_run: self.dry_run,
            lock_timeout: self.lock_timeout,
            limits: Limits::default(),
        };
        let started = Instant::now();
        let outcome = migrate_file(&path, &registry, &options)?;
        let report = match outcome {
            MigrateOutcome::Missing => Outcome::Missing { path },
            MigrateOutcome::Current { entries } => Outcome::Current {
                path,
                schema: registry.current(),
                entries,
            },
            MigrateOutcome::Migrated {
                report,
                written,
                backups,
                entries,
            } => {
                let migrated = Migrated::new(&registry, path, report, backups, entries, started);
                if written {
                    Outcome::Migrated(migrated)
                } else {
                    Outcome::DryRun(migrated)
                }
            }
        };
        out.item(&report, ctx.json)?;
        Ok(exit::OK)
    }
}

impl Migrated {
    fn new(
        registry: &Migrations,
        path: PathBuf,
        report: MigrationReport,
        backups: Vec<PathBuf>,
        entries: usize,
        started: Instant,
    ) -> Self {
        let pace = Pace::since(started, entries as u64);
        Migrated {
            app: report.app.clone(),
            from: report.from,
            to: report.to,
            entries,
            steps: report
                .steps
                .iter()
                .map(|s| StepLine {
                    from: s.from,
                    to: s.to,
                    description: s.description.clone(),
                    lines: s.lines(),
                })
                .collect(),
            collisions: report.collisions.iter().map(ToString::to_string).collect(),
            backups,
            seconds: pace.seconds,
            pace,
            plan: registry
                .path(report.from)
                .unwrap_or_default()
                .iter()
                .map(ToString::to_string)
                .collect(),
            summary: report.to_string(),
            path,
        }
    }
}

impl Report for Outcome {
    fn text(&self, out: &mut Out) -> anyhow::Result<()> {
        match self {
            Outcome::Missing { path } => out.line(format!(
                "no cache file at {}; nothing to migrate",
                path.display()
            )),
            Outcome::Current {
                path,
                schema,
                entries,
            } => out.line(format!(
                "{} is already at schema {schema} ({entries} entries); nothing to do",
                path.display()
            )),
            Outcome::DryRun(m) => {
                out.line(format!(
                    "plan for {} (schema {} → {}):",
                    m.path.display(),
                    m.from,
                    m.to
                ))?;
                for step in &m.plan {
                    out.lines(step)?;
                }
                out.lines(&m.summary)?;
                out.line("dry run: nothing was written")
            }
            Outcome::Migrated(m) => {
                out.lines(&m.summary)?;
                out.line(format!(
                    "wrote {} ({} entries) in {:.3} s",
                    m.path.display(),
                    m.entries,
                    m.seconds
                ))?;
                for b in &m.backups {
                    out.line(format!("backup: {}", b.display()))?;
                }
                Ok(())
            }
        }
    }
}
