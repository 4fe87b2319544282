//! `tunecache merge -o OUT A B ...`: the join of several caches (the one merge rule,
//! `Entry::merge`), after filters, written as a new file whose bytes do not depend on the order
//! or grouping of the inputs; with a report of the keys whose winners differ between inputs.

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::Args;
use serde::Serialize;

use cache_core::cache_migrate::Migrations;
use cache_core::{Inspection, KeyedEntry, TableWriter};
use cache_format::{Candidate, Entry, Limits, Outcome, Scope, now_millis};

use crate::context::Context;
use crate::damage::Damage;
use crate::exit;
use crate::options::nonneg_f64;
use crate::output::{Out, Report};
use crate::progress::Pace;
use crate::render::{fmt_ns, scope_filter};

/// The filters, parsed once.
struct Filters {
    scope: Option<Scope>,
    oldest: Option<u64>,
}

/// The arguments of `tunecache merge`.
#[derive(Debug, Args)]
pub(crate) struct MergeArgs {
    /// The merged cache to write (a new file: an existing one is refused)
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    output: PathBuf,
    /// The caches to merge, of one application and schema
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    /// Keep only this scope (a JSON object)
    #[arg(long)]
    scope: Option<String>,
    /// Keep only this namespace (repeatable)
    #[arg(short = 'n', long = "namespace")]
    namespaces: Vec<String>,
    /// Drop entries recorded more than this many days ago
    #[arg(long, value_name = "DAYS", value_parser = nonneg_f64)]
    max_age: Option<f64>,
    /// Drop measurements taken with fewer samples (failures are kept)
    #[arg(long, value_name = "N")]
    min_samples: Option<u32>,
    /// Write the merge even if an input is damaged: without what could not be read (each
    /// lost block and what it cost is said on stderr). Without it, a damaged input writes
    /// nothing and exits 3
    #[arg(long)]
    allow_damaged: bool,
}

#[derive(Debug, Serialize)]
struct Winner {
    input: usize,
    winner: String,
    median_ns: f64,
}

#[derive(Debug, Serialize)]
struct Conflict {
    scope: String,
    namespace: String,
    key: String,
    /// The winner each input that has the key measured.
    winners: Vec<Winner>,
    /// The slowest of these winners' medians over the fastest; `None` (null) when the fastest
    /// is 0 ns (a result another tool chose, without figures, or a recorded 0).
    ratio: Option<f64>,
}

/// A key the merge took past the candidates one entry keeps.
#[derive(Debug, Serialize)]
struct Bounded {
    scope: String,
    namespace: String,
    key: String,
    dropped: usize,
}

#[derive(Debug, Serialize)]
struct MergeReport {
    output: PathBuf,
    app: String,
    schema: u32,
    inputs: Vec<(PathBuf, usize)>,
    entries: usize,
    bytes: u64,
    conflicts: Vec<Conflict>,
    /// Keys whose inputs together held more candidates than one entry keeps (65,536): how
    /// many the merge dropped (those measured longest ago; FORMAT.md, "Merging").
    bounded: Vec<Bounded>,
    /// Entries written, and how fast.
    pace: Pace,
}

/// The conflict of one key, if its inputs' winners differ: how far apart their times are (the
/// slowest winner's median over the fastest).
fn conflict(scope: &Scope, namespace: &str, key: String, winners: Vec<Winner>) -> Option<Conflict> {
    let differ = winners.iter().any(|x| {
        winners
            .first()
            .is_some_and(|first| first.winner != x.winner)
    });
    if !differ {
        return None;
    }
    let fastest = winners
        .iter()
        .map(|w| w.median_ns)
        .fold(f64::INFINITY, f64::min);
    let slowest = winners.iter().map(|w| w.median_ns).fold(0.0, f64::max);
    Some(Conflict {
        scope: scope.to_string(),
        namespace: namespace.to_owned(),
        key,
        ratio: (fastest > 0.0).then(|| slowest / fastest),
        winners,
    })
}

impl MergeArgs {
    pub(crate) fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        let started = std::time::Instant::now();
        let filters = Filters {
            scope: scope_filter(self.scope.as_deref())?,
            oldest: self
                .max_age
                .map(|days| now_millis().saturating_sub((days * 86_400_000.0) as u64)),
        };
        let (found, target) = self.inputs(ctx)?;
        let (app, schema) = target;
        crate::guard::sweep(&self.output);
        let mut writer = TableWriter::create(
            &self.output,
            &Migrations::new(app.clone(), schema),
            &Limits::default(),
        )
        .with_context(|| format!("the merge was not written to {}", self.output.display()))?;
        // Streamed: every input's entries in key order, the same key from each joined.
        let mut walks: Vec<_> = found.iter().map(Inspection::in_key_order).collect();
        let mut heads: Vec<Option<KeyedEntry>> = walks.iter_mut().map(Iterator::next).collect();
        let mut kept = vec![0usize; walks.len()];
        let mut conflicts = Vec::new();
        let mut bounded = Vec::new();
        let mut entries = 0usize;
        while let Some(key) = heads.iter().flatten().map(|k| k.0).min() {
            let mut merged: Option<(Scope, String, Entry)> = None;
            let mut winners = Vec::new();
            let mut dropped = 0usize;
            for (i, (walk, head)) in walks.iter_mut().zip(heads.iter_mut()).enumerate() {
                if head.as_ref().is_none_or(|k| k.0 != key) {
                    continue;
                }
                let Some((_, s, ns, entry)) = std::mem::replace(head, walk.next()) else {
                    continue;
                };
                let Some(entry) = self.kept(&filters, &s, &ns, &entry) else {
                    continue;
                };
                if let Some(c) = entry.best()
                    && let Some(stats) = c.stats()
                {
                    winners.push(Winner {
                        input: i,
                        winner: c.id.label(),
                        median_ns: stats.median_ns,
                    });
                }
                kept[i] += 1;
                match &mut merged {
                    Some((_, _, m)) => {
                        dropped += m.dropped_by_merging(&entry);
                        m.merge(entry);
                    }
                    None => merged = Some((s, ns, entry)),
                }
            }
            let Some((scope, ns, entry)) = merged else {
                continue;
            };
            if dropped > 0 {
                bounded.push(Bounded {
                    scope: scope.to_string(),
                    namespace: ns.clone(),
                    key: entry.key().to_string(),
                    dropped,
                });
            }
            conflicts.extend(conflict(&scope, &ns, entry.key().to_string(), winners));
            writer.add(&scope, &ns, &entry).with_context(|| {
                format!("the merge was not written to {}", self.output.display())
            })?;
            entries += 1;
        }
        let damage = Damage::of(
            found
                .iter()
                .map(|f| f.problems.as_slice())
                .chain(walks.iter().map(|w| w.problems())),
        );
        if let Some(code) = damage.refuse("the merge", self.allow_damaged) {
            return Ok(code);
        }
        let bytes = writer
            .finish()
            .with_context(|| format!("the merge was not written to {}", self.output.display()))?;
        let report = MergeReport {
            output: self.output,
            app,
            schema,
            inputs: self.inputs.iter().cloned().zip(kept).collect(),
            entries,
            bytes,
            conflicts,
            bounded,
            pace: Pace::since(started, entries as u64),
        };
        out.report(&report, ctx.json)?;
        Ok(exit::OK)
    }

    /// The inputs, inspected as this build reads them, and their one application and schema.
    fn inputs(&self, ctx: &Context<'_>) -> anyhow::Result<(Vec<Inspection>, (String, u32))> {
        let mut target: Option<(String, u32)> = None;
        let mut found = Vec::new();
        for path in &self.inputs {
            crate::guard::refuse_cache_files(&self.output, path, "the merge")?;
            let inspection = ctx.inspect_as_read(path)?;
            let Some((app, schema)) = ctx.version_as_read(&inspection) else {
                bail!("{}: no readable snapshot to merge", path.display());
            };
            match &target {
                None => target = Some((app.clone(), schema)),
                Some((first, s)) if *first != app || *s != schema => bail!(
                    "{} is application {app:?} schema {schema}, the first input {first:?} schema {s}: \
                     merge caches of one application and schema (`tunecache migrate` brings one \
                     forward)",
                    path.display(),
                ),
                Some(_) => {}
            }
            found.push(inspection);
        }
        Ok((found, target.context("no input")?))
    }

    /// `entry` (of namespace `ns` in `scope`) as the filters keep it, or `None`.
    fn kept(&self, filters: &Filters, scope: &Scope, ns: &str, entry: &Entry) -> Option<Entry> {
        let keep_scope = filters.scope.as_ref().is_none_or(|w| w == scope);
        let keep_ns = self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == ns);
        let keep_age = filters.oldest.is_none_or(|t| entry.recorded_at() >= t);
        if !(keep_scope && keep_ns && keep_age) {
            return None;
        }
        self.with_enough_samples(entry)
    }

    /// `entry` without the measurements below `--min-samples` (`None`: nothing left).
    fn with_enough_samples(&self, entry: &Entry) -> Option<Entry> {
        let Some(min) = self.min_samples else {
            return Some(entry.clone());
        };
        let kept: Vec<_> = entry
            .candidates()
            .iter()
            .filter(|c| match &c.outcome {
                Outcome::Measured(s) => s.samples >= min,
                Outcome::Failed(_) | Outcome::Chosen(_) => true,
            })
            .map(|c| Candidate::clone(c))
            .collect();
        if kept.is_empty() {
            return None;
        }
        Some(Entry::new(
            entry.key().clone(),
            entry.candidate_set(),
            entry.origin().clone(),
            entry.recorded_at(),
            kept,
        ))
    }
}

impl Report for MergeReport {
    fn text(&self, out: &mut Out) -> anyhow::Result<()> {
        for c in &self.conflicts {
            let winners: Vec<String> = c
                .winners
                .iter()
                .map(|w| format!("#{} {} {}", w.input + 1, w.winner, fmt_ns(w.median_ns)))
                .collect();
            let apart = match c.ratio {
                Some(r) => format!("{r:.2}x apart"),
                None => "one at 0 ns: no ratio".to_owned(),
            };
            out.line(format!(
                "conflict {} {} [{}]: {} ({apart})",
                c.namespace,
                c.key,
                c.scope,
                winners.join(", "),
            ))?;
        }
        for b in &self.bounded {
            out.line(format!(
                "over the bound {} {} [{}]: {} candidates dropped (one entry keeps 65536: the \
                 winner and those measured last)",
                b.namespace, b.key, b.scope, b.dropped
            ))?;
        }
        for (i, (path, n)) in self.inputs.iter().enumerate() {
            out.line(format!(
                "input #{} {}: {n} entries kept",
                i + 1,
                path.display()
            ))?;
        }
        out.line(format!(
            "merged {} entries ({} bytes, application {:?} schema {}) into {}; {} keys whose winners differ",
            self.entries,
            self.bytes,
            self.app,
            self.schema,
            self.output.display(),
            self.conflicts.len()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn winner(input: usize, name: &str, median_ns: f64) -> Winner {
        Winner {
            input,
            winner: name.to_owned(),
            median_ns,
        }
    }

    /// A winner at 0 ns (chosen without figures, or a recorded 0) has no ratio to the others;
    /// the report once said "1.00x apart" of 1 µs against 0 ns.
    #[test]
    fn a_conflict_with_a_winner_at_zero_has_no_ratio() {
        let scope = Scope::default();
        let at = |a: f64, b: f64| {
            conflict(
                &scope,
                "mm",
                "k".into(),
                vec![winner(0, "x", a), winner(1, "y", b)],
            )
            .expect("the winners differ")
            .ratio
        };
        assert_eq!(at(1000.0, 0.0), None);
        assert_eq!(at(1000.0, 500.0), Some(2.0));
        assert!(
            conflict(
                &scope,
                "mm",
                "k".into(),
                vec![winner(0, "x", 1.0), winner(1, "x", 2.0)]
            )
            .is_none()
        );
    }
}
