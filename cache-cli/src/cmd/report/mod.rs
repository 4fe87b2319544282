//! `tunecache report -o FILE.html`: one self-contained page that shows a cache: per
//! namespace, the winners over the problem space, the winner's time against problem size,
//! where results came from, how close the runner-up is, and the keys whose winners differ
//! between scopes. Two walks of the entries (the second only for the keys listed as
//! differing), memory bounded by the sample, not by the cache.

mod charts;
mod gather;
mod html;
mod svg;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::ControlFlow;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use serde::Serialize;

use crate::context::Context;
use crate::exit;
use crate::output::{Out, Report, say};
use crate::progress::{Pace, Progress};

/// The arguments of `tunecache report`.
#[derive(Debug, Args)]
pub(crate) struct ReportArgs {
    /// The page to write (HTML, self-contained: it fetches nothing)
    #[arg(long, short = 'o', value_name = "FILE.html")]
    output: PathBuf,
}

#[derive(Debug, Serialize)]
struct ReportSummary {
    path: PathBuf,
    output: PathBuf,
    bytes: usize,
    entries: usize,
    namespaces: usize,
    /// Namespaces whose charts draw a sample of their keys.
    sampled: usize,
    /// Entries read, and how fast.
    pace: Pace,
}

impl Report for ReportSummary {
    fn text(&self, _out: &mut Out) -> anyhow::Result<()> {
        say(format_args!(
            "wrote {} ({} bytes): {} entries in {} namespaces{}",
            self.output.display(),
            self.bytes,
            self.entries,
            self.namespaces,
            if self.sampled > 0 {
                format!(", {} drawn from a sample", self.sampled)
            } else {
                String::new()
            }
        ));
        Ok(())
    }
}

impl ReportArgs {
    pub(crate) fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        let path = ctx.path()?;
        let found = ctx.inspect(&path)?;
        crate::guard::refuse_cache_files(&self.output, &found.path, "the report")?;
        let (counts, _) = found.counts();
        let namespaces: HashSet<&String> = counts.values().flat_map(|n| n.keys()).collect();
        let budget = gather::Budget::for_namespaces(namespaces.len());
        let host = cache_core::host_name();
        let mut g = gather::Gathered::default();
        let total = super::total(&counts);
        crate::interrupt::catch();
        let mut progress = Progress::new("reading entries", Some(total as u64), false, ctx.json);
        let damaged = found.for_each_entry(|scope, ns, entry| {
            if crate::interrupt::requested() {
                return ControlFlow::Break(());
            }
            g.add(scope, ns, entry, host, budget);
            progress.advance(1);
            ControlFlow::Continue(())
        });
        let pace = progress.finish();
        if crate::interrupt::requested() {
            return Err(crate::interrupt::Interrupted.into());
        }
        let mut diffs = BTreeMap::new();
        for (name, n) in g.namespaces.iter_mut().take(budget.namespaces) {
            diffs.insert(name.clone(), n.differing(budget.differing));
        }
        let wanted: HashSet<(String, cache_format::Fingerprint)> = diffs
            .iter()
            .flat_map(|(ns, d)| d.rows.iter().map(|(fp, _)| (ns.clone(), *fp)))
            .collect();
        let mut keys = HashMap::new();
        if !wanted.is_empty() {
            found.for_each_entry(|_, ns, entry| {
                let fp = entry.fingerprint();
                if wanted.contains(&(ns.to_owned(), fp)) {
                    keys.insert(fp, entry.key().to_string());
                }
                ControlFlow::Continue(())
            });
        }
        let header = html::Header {
            path: found.path.display().to_string(),
            app: found.snapshot.header.as_ref().map(|h| h.app.clone()),
            schema: found.snapshot.header.as_ref().map(|h| h.schema),
            problems: found.problems.iter().chain(&damaged).cloned().collect(),
        };
        crate::damage::Damage::of([found.problems.as_slice(), damaged.as_slice()])
            .say("the report shows what could be read; its page lists what could not");
        let page = html::page(&header, &g, budget.namespaces, &diffs, &keys);
        cache_core::file::write_atomic(&self.output, page.as_bytes())
            .with_context(|| format!("cannot write {}", self.output.display()))?;
        let summary = ReportSummary {
            path: found.path.clone(),
            output: self.output,
            bytes: page.len(),
            entries: g.entries,
            namespaces: g.namespaces.len(),
            sampled: g.namespaces.values().filter(|n| n.sampled()).count(),
            pace,
        };
        out.item(&summary, ctx.json)?;
        Ok(exit::OK)
    }
}
