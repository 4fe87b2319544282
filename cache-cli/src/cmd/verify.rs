//! `tunecache verify`: every checksum, fingerprint and record of a cache, without touching it;
//! exit 3 if anything is wrong.

use std::path::PathBuf;

use clap::Args;
use serde::Serialize;

use crate::context::Context;
use crate::exit;
use crate::output::{Out, Report};
use crate::progress::Pace;

/// The arguments of `tunecache verify`.
#[derive(Debug, Args)]
pub(crate) struct VerifyArgs {}

#[derive(Debug, Serialize)]
struct VerifyReport {
    path: PathBuf,
    ok: bool,
    entries: usize,
    journal_records: usize,
    gate: Option<String>,
    problems: Vec<String>,
    notes: Vec<String>,
    /// Entries checked, and how fast.
    pace: Pace,
}

impl VerifyArgs {
    pub(crate) fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        let started = std::time::Instant::now();
        let mut found = ctx.inspect(&ctx.path()?)?;
        // Entry by entry, in constant memory.
        let (entries, problems) = found.check_entries();
        found.problems.extend(problems);
        let report = VerifyReport {
            ok: found.problems.is_empty(),
            entries,
            journal_records: found.journal.records,
            gate: found.gate.as_ref().map(ToString::to_string),
            path: found.path,
            problems: found.problems,
            notes: found.notes,
            pace: Pace::since(started, entries as u64),
        };
        out.report(&report, ctx.json)?;
        Ok(if report.ok { exit::OK } else { exit::PROBLEMS })
    }
}

impl Report for VerifyReport {
    fn text(&self, out: &mut Out) -> anyhow::Result<()> {
        for p in &self.problems {
            out.line(format!("problem: {p}"))?;
        }
        for n in &self.notes {
            out.line(format!("note: {n}"))?;
        }
        if let Some(gate) = &self.gate {
            out.line(format!("versions: {gate}"))?;
        }
        if self.ok {
            out.line(format!(
                "ok: {} entries, {} journal records, checksums and fingerprints verified",
                self.entries, self.journal_records
            ))
        } else {
            out.line(format!(
                "{} problems in {}",
                self.problems.len(),
                self.path.display()
            ))
        }
    }
}
