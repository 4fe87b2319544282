//! `tunecache show`: one key's candidates, best first, as a bar chart of their median times
//! (with `--json`, the same records as `get`).

use std::time::Duration;

use clap::Args;

use cache_format::{Entry, Outcome, Scope};

use crate::cmd::get::Lookup;
use crate::context::Context;
use crate::exit;
use crate::options::{KeyArgs, ScopeFilter};
use crate::output::Out;
use crate::render::fmt_duration;

/// The arguments of `tunecache show`.
#[derive(Debug, Args)]
pub(crate) struct ShowArgs {
    #[command(flatten)]
    key: KeyArgs,
    #[command(flatten)]
    scope: ScopeFilter,
}

impl ShowArgs {
    pub(crate) fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        let lookup = Lookup::new(ctx, &self.key, &self.scope)?;
        let entries = lookup.entries();
        if entries.is_empty() {
            return Ok(lookup.not_found());
        }
        if ctx.json {
            lookup.print_json(out)?;
            return Ok(exit::OK);
        }
        for (scope, entry) in &entries {
            chart(&lookup.namespace, scope, entry, out)?;
        }
        Ok(exit::OK)
    }
}

/// The bar chart of one entry.
fn chart(namespace: &str, scope: &Scope, entry: &Entry, out: &mut Out) -> anyhow::Result<()> {
    const WIDTH: f64 = 40.0;
    out.line(format!("{namespace} {}", entry.key()))?;
    out.line(format!("  scope {scope}"))?;
    let slowest = entry
        .candidates()
        .iter()
        .filter_map(|c| c.stats().map(|s| s.median_ns))
        .fold(0.0f64, f64::max);
    let label_width = entry
        .candidates()
        .iter()
        .map(|c| c.id.label().chars().count())
        .max()
        .unwrap_or(0);
    for (rank, c) in entry.candidates().iter().enumerate() {
        let label = c.id.label();
        let line = match &c.outcome {
            Outcome::Measured(st) => {
                let filled = if slowest > 0.0 {
                    ((st.median_ns / slowest) * WIDTH).round().max(1.0) as usize
                } else {
                    1
                };
                format!(
                    "{:<w$}  {:<40}  {:>10}  ±{:>8}  n={}{}",
                    label,
                    "█".repeat(filled),
                    fmt_duration(Duration::from_nanos(st.median_ns as u64)),
                    fmt_duration(Duration::from_nanos(st.spread_ns as u64)),
                    st.samples,
                    if rank == 0 { "  ← best" } else { "" },
                    w = label_width
                )
            }
            Outcome::Failed(reason) => {
                format!("{label:<w$}  failed: {reason}", w = label_width)
            }
            Outcome::Chosen(by) => format!(
                "{label:<w$}  chosen by {by}, not measured{}",
                if rank == 0 { "  ← best" } else { "" },
                w = label_width
            ),
        };
        out.line(format!("  {line}"))?;
    }
    Ok(())
}
