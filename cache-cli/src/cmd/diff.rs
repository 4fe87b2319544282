//! `tunecache diff A B`: a semantic comparison of two caches, key by key (never bytes): what
//! only one has, and for the keys both have whether the winner stayed, changed within the
//! noise, changed, or got slower beyond the spread, whether the candidate set or a failure
//! status changed. A summary (counts, and the geometric-mean change of the winners' times),
//! `--fail-on CATEGORY` for CI (exit 3), `--json`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::bail;
use clap::{Args, ValueEnum};
use serde::Serialize;

use cache_core::KeyedEntry;
use cache_format::{Candidate, CandidateId, Entry, Outcome};

use crate::context::Context;
use crate::damage::Damage;
use crate::exit;
use crate::output::{Out, Report};
use crate::progress::Pace;

/// The arguments of `tunecache diff`.
#[derive(Debug, Args)]
pub(crate) struct DiffArgs {
    /// The cache before (the baseline)
    a: PathBuf,
    /// The cache after
    b: PathBuf,
    /// Exit 3 if any key falls in this category (repeatable)
    #[arg(long = "fail-on", value_enum)]
    fail_on: Vec<Category>,
}

/// What happened to one key between A and B. A key both caches have falls in exactly one,
/// the first that applies in this order: failure status, candidate set, regression, winner
/// changed, winner changed within noise, same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Category {
    /// Only A has the key.
    OnlyInA,
    /// Only B has the key.
    OnlyInB,
    /// A candidate measured in both failed in one and not the other, or only one has a
    /// measured winner.
    FailureChanged,
    /// The candidate-set checksums differ (candidates added, removed, or a new salt).
    CandidatesChanged,
    /// B's winner is slower than A's by more than the larger of their spreads.
    Regression,
    /// Another winner, faster by more than the larger of the spreads.
    WinnerChanged,
    /// Another winner, within the larger of the spreads of A's.
    WinnerChangedWithinNoise,
    /// The same winner, not slower beyond the spread.
    Same,
}

impl Category {
    fn name(self) -> &'static str {
        match self {
            Category::OnlyInA => "only-in-a",
            Category::OnlyInB => "only-in-b",
            Category::FailureChanged => "failure-changed",
            Category::CandidatesChanged => "candidates-changed",
            Category::Regression => "regression",
            Category::WinnerChanged => "winner-changed",
            Category::WinnerChangedWithinNoise => "winner-changed-within-noise",
            Category::Same => "same",
        }
    }
}

/// One key that is not `same`.
#[derive(Debug, Serialize)]
struct Change {
    category: Category,
    scope: String,
    namespace: String,
    key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    winner_a: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    winner_b: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    median_a_ns: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    median_b_ns: Option<f64>,
}

#[derive(Debug, Serialize)]
struct DiffReport {
    a: PathBuf,
    b: PathBuf,
    counts: BTreeMap<Category, usize>,
    /// Geometric mean of B's winner median over A's, over the keys both have measured
    /// winners for (1.0: unchanged; below: faster).
    geomean_ratio: Option<f64>,
    changes: Vec<Change>,
    /// The `--fail-on` categories that were found.
    failed_on: Vec<Category>,
    /// Keys compared, and how fast.
    #[serde(skip_serializing_if = "Option::is_none")]
    pace: Option<Pace>,
    /// What could not be read of either cache (the diff is then incomplete: exit 3).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    damaged: Vec<String>,
}

impl DiffArgs {
    pub(crate) fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        let started = std::time::Instant::now();
        let (a, b) = (ctx.inspect_as_read(&self.a)?, ctx.inspect_as_read(&self.b)?);
        // Key by key is only meaningful within one application and schema: two others'
        // fingerprints may coincide and their candidates mean other things.
        if let (Some(va), Some(vb)) = (ctx.version_as_read(&a), ctx.version_as_read(&b))
            && va != vb
        {
            bail!(
                "{} is application {:?} schema {}, {} is application {:?} schema {}: diff compares caches of one application and schema (`tunecache migrate` brings one forward)",
                self.a.display(),
                va.0,
                va.1,
                self.b.display(),
                vb.0,
                vb.1
            );
        }
        // Streamed: both caches in key order, joined key by key.
        let (mut walk_a, mut walk_b) = (a.in_key_order(), b.in_key_order());
        let mut report = diff(&mut walk_a, &mut walk_b);
        let damage = Damage::of([
            a.problems.as_slice(),
            walk_a.problems(),
            b.problems.as_slice(),
            walk_b.problems(),
        ]);
        report.damaged = damage.lines().to_vec();
        report.a = self.a;
        report.b = self.b;
        report.failed_on = self
            .fail_on
            .iter()
            .copied()
            .filter(|c| report.counts.get(c).is_some_and(|n| *n > 0))
            .collect();
        report.failed_on.sort();
        report.failed_on.dedup();
        report.pace = Some(Pace::since(
            started,
            report.counts.values().sum::<usize>() as u64,
        ));
        out.report(&report, ctx.json)?;
        damage.say(
            "the diff is of what could be read; keys under the damage may show as only in one",
        );
        Ok(if report.failed_on.is_empty() && damage.is_empty() {
            exit::OK
        } else {
            exit::PROBLEMS
        })
    }
}

/// The diff of two caches' entries, each given in table-key order.
fn diff(a: impl Iterator<Item = KeyedEntry>, b: impl Iterator<Item = KeyedEntry>) -> DiffReport {
    let (mut a, mut b) = (a.peekable(), b.peekable());
    let mut counts: BTreeMap<Category, usize> = BTreeMap::new();
    let mut changes = Vec::new();
    let mut log_sum = 0.0;
    let mut n_ratios = 0usize;
    loop {
        let key = match (a.peek(), b.peek()) {
            (None, None) => break,
            (Some(x), None) => x.0,
            (None, Some(y)) => y.0,
            (Some(x), Some(y)) => x.0.min(y.0),
        };
        let ea = a.next_if(|k| k.0 == key);
        let eb = b.next_if(|k| k.0 == key);
        let (scope, ns, entry) = match (&ea, &eb) {
            (Some((_, s, ns, e)), _) | (None, Some((_, s, ns, e))) => (s, ns, e),
            (None, None) => continue,
        };
        let category = match (&ea, &eb) {
            (Some(_), None) => Category::OnlyInA,
            (None, Some(_)) => Category::OnlyInB,
            (Some((.., x)), Some((.., y))) => {
                let (wa, wb) = (x.best(), y.best());
                if let (Some(wa), Some(wb)) =
                    (wa.and_then(Candidate::stats), wb.and_then(Candidate::stats))
                    && wa.median_ns > 0.0
                    && wb.median_ns > 0.0
                {
                    log_sum += (wb.median_ns / wa.median_ns).ln();
                    n_ratios += 1;
                }
                classify(x, y)
            }
            (None, None) => continue,
        };
        *counts.entry(category).or_default() += 1;
        if category == Category::Same {
            continue;
        }
        let (wa, wb) = (
            ea.as_ref().and_then(|(.., e)| e.best()),
            eb.as_ref().and_then(|(.., e)| e.best()),
        );
        changes.push(Change {
            category,
            scope: scope.to_string(),
            namespace: ns.clone(),
            key: entry.key().to_string(),
            winner_a: wa.map(|c| c.id.label()),
            winner_b: wb.map(|c| c.id.label()),
            median_a_ns: wa.and_then(|c| c.stats()).map(|s| s.median_ns),
            median_b_ns: wb.and_then(|c| c.stats()).map(|s| s.median_ns),
        });
    }
    DiffReport {
        a: PathBuf::new(),
        b: PathBuf::new(),
        counts,
        geomean_ratio: (n_ratios > 0).then(|| (log_sum / n_ratios as f64).exp()),
        changes,
        failed_on: Vec::new(),
        pace: None,
        damaged: Vec::new(),
    }
}

/// The category of a key both caches have (see [`Category`] for the order).
fn classify(a: &Entry, b: &Entry) -> Category {
    let status = |e: &Entry| -> BTreeMap<CandidateId, bool> {
        e.candidates()
            .iter()
            .map(|c| (c.id.clone(), matches!(c.outcome, Outcome::Failed(_))))
            .collect()
    };
    let (sa, sb) = (status(a), status(b));
    let flipped = sa
        .iter()
        .any(|(id, failed)| sb.get(id).is_some_and(|f| f != failed));
    if flipped || a.best().is_some() != b.best().is_some() {
        return Category::FailureChanged;
    }
    if a.candidate_set() != b.candidate_set() {
        return Category::CandidatesChanged;
    }
    let (Some(wa), Some(wb)) = (a.best(), b.best()) else {
        return Category::Same;
    };
    let (Some(ta), Some(tb)) = (wa.stats(), wb.stats()) else {
        // A winner without figures (a shipped config another tool chose) on either side: only
        // its identity can differ.
        return if wa.id == wb.id {
            Category::Same
        } else {
            Category::WinnerChanged
        };
    };
    let noise = ta.spread_ns.max(tb.spread_ns);
    if tb.median_ns > ta.median_ns + noise {
        return Category::Regression;
    }
    if wa.id == wb.id {
        Category::Same
    } else if (ta.median_ns - tb.median_ns).abs() <= noise {
        Category::WinnerChangedWithinNoise
    } else {
        Category::WinnerChanged
    }
}

impl Report for DiffReport {
    fn text(&self, out: &mut Out) -> anyhow::Result<()> {
        for c in &self.changes {
            let time = |m: Option<f64>| m.map_or_else(|| "-".to_owned(), crate::render::fmt_ns);
            out.line(format!(
                "{:<28} {} {} [{}]: {} {} -> {} {}",
                c.category.name(),
                c.namespace,
                c.key,
                c.scope,
                c.winner_a.as_deref().unwrap_or("-"),
                time(c.median_a_ns),
                c.winner_b.as_deref().unwrap_or("-"),
                time(c.median_b_ns),
            ))?;
        }
        out.line(format!("{} -> {}", self.a.display(), self.b.display()))?;
        for (category, n) in &self.counts {
            out.line(format!("  {:<28} {n}", category.name()))?;
        }
        if let Some(r) = self.geomean_ratio {
            out.line(format!(
                "  winners' time, geometric mean: {:.3}x ({:+.1}%)",
                r,
                (r - 1.0) * 100.0
            ))?;
        }
        for c in &self.failed_on {
            out.line(format!("failed on {}", c.name()))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cache_format::{Fields, Fingerprint, Key, Origin, Stats, Value};

    fn entry(set: u8, cands: &[(&str, Option<(f64, f64)>)]) -> Entry {
        let key = Key::new(Fields::from([("m".to_owned(), Value::Int(1))]));
        Entry::new(
            key,
            Fingerprint([set; 16]),
            Origin::Imported("t".into()),
            1,
            cands.iter().map(|(name, t)| {
                let id = CandidateId::new(*name, &[]);
                let outcome = match t {
                    Some((median_ns, spread_ns)) => Outcome::Measured(Stats {
                        median_ns: *median_ns,
                        min_ns: *median_ns,
                        spread_ns: *spread_ns,
                        samples: 5,
                    }),
                    None => Outcome::Failed("boom".into()),
                };
                Candidate::new(id, outcome)
            }),
        )
    }

    #[test]
    fn each_category_is_recognised() {
        let base = entry(0, &[("x", Some((100.0, 5.0))), ("y", Some((200.0, 5.0)))]);
        let cases = [
            (base.clone(), Category::Same),
            (
                entry(0, &[("x", Some((103.0, 5.0))), ("y", Some((200.0, 5.0)))]),
                Category::Same,
            ),
            (
                entry(0, &[("x", Some((104.0, 5.0))), ("y", Some((101.0, 5.0)))]),
                Category::WinnerChangedWithinNoise,
            ),
            (
                entry(0, &[("x", Some((100.0, 5.0))), ("y", Some((50.0, 5.0)))]),
                Category::WinnerChanged,
            ),
            (
                entry(0, &[("x", Some((150.0, 5.0))), ("y", Some((200.0, 5.0)))]),
                Category::Regression,
            ),
            (
                entry(1, &[("x", Some((100.0, 5.0))), ("y", Some((200.0, 5.0)))]),
                Category::CandidatesChanged,
            ),
            (
                entry(0, &[("x", None), ("y", Some((200.0, 5.0)))]),
                Category::FailureChanged,
            ),
        ];
        for (b, want) in cases {
            assert_eq!(classify(&base, &b), want, "{b:?}");
        }
    }

    #[test]
    fn a_shipped_config_that_changed_is_a_changed_winner() {
        let shipped = |name: &str| {
            let key = Key::new(Fields::from([("m".to_owned(), Value::Int(1))]));
            let c = Candidate::chosen(name, Fields::new(), "vllm config");
            Entry::new(
                key,
                Fingerprint([0; 16]),
                Origin::Imported("t".into()),
                1,
                [c],
            )
        };
        assert_eq!(classify(&shipped("x"), &shipped("x")), Category::Same);
        assert_eq!(
            classify(&shipped("x"), &shipped("y")),
            Category::WinnerChanged
        );
        let measured = entry(0, &[("y", Some((100.0, 5.0)))]);
        assert_eq!(classify(&shipped("x"), &measured), Category::WinnerChanged);
    }
}
