//! `tunecache stats`: versions, sizes, entries per scope and namespace, and the gate this
//! build would apply.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Args;
use serde::Serialize;

use crate::context::Context;
use crate::exit;
use crate::output::{Out, Report};

/// The arguments of `tunecache stats`.
#[derive(Debug, Args)]
pub(crate) struct StatsArgs {}

#[derive(Debug, Serialize)]
struct StatsReport {
    path: PathBuf,
    snapshot_bytes: Option<u64>,
    format: Option<u32>,
    app: Option<String>,
    schema: Option<u32>,
    generation: Option<String>,
    /// What loading it would do, e.g. "as stored, schema 8; this build migrates it to 9".
    gate: Option<String>,
    entries: usize,
    journal: JournalReport,
    scopes: Vec<ScopeReport>,
    problems: Vec<String>,
    notes: Vec<String>,
    /// The shared tier named by `TUNECACHE_REMOTE`, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    shared_tier: Option<TierReport>,
}

#[derive(Debug, Serialize)]
struct TierReport {
    server: String,
    /// Round trip, if it answered.
    round_trip_ms: Option<f64>,
    /// Entries of this application and schema on it, if it could list them.
    entries: Option<usize>,
    error: Option<String>,
}

/// The shared tier's line of `stats`: reachable or not, and what it holds for `app`.
fn tier_report(ctx: &Context<'_>, app: &str, schema: u32) -> anyhow::Result<Option<TierReport>> {
    if crate::settings().get_os(cache_remote::ENV_REMOTE).is_none() {
        return Ok(None);
    }
    let registry = ctx
        .registry(app)
        .filter(|r| r.current() == schema)
        .cloned()
        .unwrap_or_else(|| cache_core::cache_migrate::Migrations::new(app, schema));
    let Some(tier) = crate::shared::tier(&registry)? else {
        return Ok(None);
    };
    let mut report = TierReport {
        server: tier.describe().to_owned(),
        round_trip_ms: None,
        entries: None,
        error: None,
    };
    match tier
        .ping(crate::shared::WAIT)
        .and_then(|rtt| Ok((rtt, tier.count(crate::shared::WAIT)?)))
    {
        Ok((rtt, n)) => {
            report.round_trip_ms = Some(rtt.as_secs_f64() * 1e3);
            report.entries = Some(n);
        }
        Err(e) => report.error = Some(e.to_string()),
    }
    Ok(Some(report))
}

#[derive(Debug, Serialize)]
struct JournalReport {
    bytes: Option<u64>,
    records: usize,
    stale: bool,
    damaged: usize,
    torn_bytes: u64,
}

#[derive(Debug, Serialize)]
struct ScopeReport {
    scope: cache_format::Fields,
    fingerprint: String,
    #[serde(skip)]
    text: String,
    namespaces: BTreeMap<String, usize>,
}

impl StatsArgs {
    pub(crate) fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        let mut found = ctx.inspect(&ctx.path()?)?;
        // Counted from the stored fingerprints, without decoding the entries (`verify`
        // decodes and checks them).
        let (counts, broken) = found.counts();
        found.problems.extend(broken);
        let header = found.snapshot.header.as_ref();
        let shared_tier = tier_report(
            ctx,
            &header.map_or_else(|| ctx.app(), |h| h.app.clone()),
            header.map_or(1, |h| h.schema),
        )?;
        let report = StatsReport {
            path: found.path.clone(),
            snapshot_bytes: found.snapshot.bytes,
            format: found.snapshot.format.map(|f| f.number()),
            app: header.map(|h| h.app.clone()),
            schema: header.map(|h| h.schema),
            generation: header.map(|h| format!("{:016x}", h.generation)),
            gate: found.gate.as_ref().map(ToString::to_string),
            entries: super::total(&counts),
            journal: JournalReport {
                bytes: found.journal.bytes,
                records: found.journal.records,
                stale: found.journal.stale,
                damaged: found.journal.damaged,
                torn_bytes: found.journal.torn_bytes,
            },
            scopes: counts
                .into_iter()
                .map(|(scope, namespaces)| ScopeReport {
                    scope: scope.fields().clone(),
                    fingerprint: scope.fingerprint().to_hex(),
                    text: scope.to_string(),
                    namespaces: namespaces.into_iter().collect(),
                })
                .collect(),
            problems: found.problems,
            notes: found.notes,
            shared_tier,
        };
        out.report(&report, ctx.json)?;
        Ok(exit::OK)
    }
}

impl Report for StatsReport {
    fn text(&self, out: &mut Out) -> anyhow::Result<()> {
        out.line(format!("file       {}", self.path.display()))?;
        if let Some(t) = &self.shared_tier {
            match (&t.error, t.round_trip_ms, t.entries) {
                (Some(e), _, _) => out.line(format!("shared     {}: {e}", t.server))?,
                (None, Some(ms), Some(n)) => out.line(format!(
                    "shared     {} answers in {ms:.2} ms, holds {n} entries of this application and schema",
                    t.server
                ))?,
                _ => out.line(format!("shared     {}", t.server))?,
            }
        }
        match (&self.app, self.snapshot_bytes) {
            (Some(app), Some(bytes)) => out.line(format!(
                "snapshot   {bytes} bytes, format {}, app {app:?} schema {}, generation {}",
                self.format.unwrap_or(0),
                self.schema.unwrap_or(0),
                self.generation.as_deref().unwrap_or("?"),
            ))?,
            (None, Some(bytes)) => out.line(format!("snapshot   {bytes} bytes, unreadable"))?,
            _ => out.line("snapshot   none")?,
        }
        if let Some(gate) = &self.gate {
            out.line(format!("versions   {gate}"))?;
        }
        let j = &self.journal;
        match j.bytes {
            Some(bytes) => out.line(format!(
                "journal    {bytes} bytes, {} records{}{}",
                j.records,
                if j.stale { ", stale" } else { "" },
                if j.torn_bytes > 0 {
                    format!(", {} torn bytes", j.torn_bytes)
                } else {
                    String::new()
                }
            ))?,
            None => out.line("journal    none")?,
        }
        out.line(format!(
            "entries    {} in {} scopes",
            self.entries,
            self.scopes.len()
        ))?;
        for scope in &self.scopes {
            out.line(format!("scope {} {}", &scope.fingerprint[..8], scope.text))?;
            for (ns, n) in &scope.namespaces {
                out.line(format!("  {ns:<24} {n} entries"))?;
            }
        }
        for p in &self.problems {
            out.line(format!("problem: {p}"))?;
        }
        for n in &self.notes {
            out.line(format!("note: {n}"))?;
        }
        Ok(())
    }
}
