//! `tunecache gc`: prune a cache file: entries past an age, the entries recorded longest ago
//! past a size limit, claim files no process holds, and (only when asked) the copies kept
//! aside after damage, migrations and torn appends. `--dry-run` says what would go.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use serde::Serialize;

use cache_core::cache_migrate::Migrations;
use cache_core::{GcPolicy, gc_file};

use crate::context::{Context, saving};
use crate::exit;
use crate::options::{WaitArgs, nonneg_f64};
use crate::output::{Out, Report};

/// The arguments of `tunecache gc`.
#[derive(Debug, Args)]
pub(crate) struct GcArgs {
    /// Keep the file at most this size (bytes, or with K, M or G), dropping first the entries
    /// of stale scopes (nothing recorded there for 30 days while other scopes got results),
    /// then those recorded longest ago
    #[arg(long, value_name = "SIZE", value_parser = size)]
    max_size: Option<u64>,
    /// Drop entries recorded more than this many days ago
    #[arg(long, value_name = "DAYS", value_parser = nonneg_f64)]
    max_age: Option<f64>,
    /// Also remove the copies kept aside (.unusable-*, .bak.*, .damaged-*, .torn-*) older than
    /// this many days, each counted from when it was set aside
    #[arg(long, value_name = "DAYS", value_parser = nonneg_f64)]
    leftovers: Option<f64>,
    /// Say what would go; change nothing
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    wait: WaitArgs,
}

#[derive(Debug, Serialize)]
struct GcOut {
    path: PathBuf,
    dry_run: bool,
    entries_before: usize,
    entries_after: usize,
    dropped_by_age: usize,
    dropped_by_size: usize,
    bytes_before: u64,
    bytes_after: u64,
    claims_removed: usize,
    leftovers_removed: Vec<PathBuf>,
}

/// `1234`, `64K`, `10M`, `2G` (powers of 1024).
pub(crate) fn size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("{s:?} is not a size (bytes, or a number with K, M or G)"))
}

fn days(d: f64) -> Duration {
    Duration::from_secs_f64((d * 86_400.0).min(1e15))
}

impl GcArgs {
    pub(crate) fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        let path = ctx.path()?;
        if !self.dry_run {
            ctx.check_writable("gc")?;
        }
        let (app, schema) = ctx.write_target(&path, 1)?;
        let registry = ctx
            .registry(&app)
            .cloned()
            .unwrap_or_else(|| Migrations::new(app, schema));
        let policy = GcPolicy {
            max_bytes: self.max_size,
            max_age: self.max_age.map(days),
            leftovers_older_than: self.leftovers.map(days),
            dry_run: self.dry_run,
            lock_timeout: self.wait.wait,
            ..GcPolicy::default()
        };
        let r = saving("the pruned cache", &path, || {
            gc_file(&path, &registry, &policy)
        })
        .with_context(|| format!("{} was not pruned", path.display()))?;
        let report = GcOut {
            path,
            dry_run: self.dry_run,
            entries_before: r.entries_before,
            entries_after: r.entries_after,
            dropped_by_age: r.dropped_by_age,
            dropped_by_size: r.dropped_by_size,
            bytes_before: r.bytes_before,
            bytes_after: r.bytes_after,
            claims_removed: r.claims_removed,
            leftovers_removed: r.leftovers_removed,
        };
        out.report(&report, ctx.json)?;
        Ok(exit::OK)
    }
}

impl Report for GcOut {
    fn text(&self, out: &mut Out) -> anyhow::Result<()> {
        let verb = if self.dry_run {
            "would drop"
        } else {
            "dropped"
        };
        out.line(format!(
            "{}: {verb} {} entries for their age and {} for size: {} → {} entries, {} → {} bytes",
            self.path.display(),
            self.dropped_by_age,
            self.dropped_by_size,
            self.entries_before,
            self.entries_after,
            self.bytes_before,
            self.bytes_after
        ))?;
        let verb = if self.dry_run {
            "would remove"
        } else {
            "removed"
        };
        out.line(format!("{verb} {} unheld claim files", self.claims_removed))?;
        for p in &self.leftovers_removed {
            out.line(format!("{verb} {}", p.display()))?;
        }
        Ok(())
    }
}
