//! `tunecache list`: entries with their best candidate, one per line (JSON lines with
//! `--json`, so a large cache streams).

use std::ops::ControlFlow;

use clap::Args;
use serde::Serialize;

use cache_format::json::{JsonCandidate, candidate_json};
use cache_format::{Entry, Fields, Outcome};

use crate::context::Context;
use crate::damage::Damage;
use crate::exit;
use crate::output::{Out, Report};
use crate::render::{fmt_ns, scope_filter, short};

/// The arguments of `tunecache list`.
#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// Only this namespace
    #[arg(long, short = 'n')]
    namespace: Option<String>,
    /// Only this scope (JSON object of its fields)
    #[arg(long)]
    scope: Option<String>,
    /// Print at most this many entries
    #[arg(long)]
    limit: Option<usize>,
}

/// One line of the listing.
#[derive(Debug, Serialize)]
struct ListItem<'a> {
    scope: String,
    namespace: &'a str,
    key: &'a Fields,
    fingerprint: String,
    candidates: usize,
    best: Option<JsonCandidate>,
    #[serde(skip)]
    entry: &'a Entry,
}

impl ListArgs {
    pub(crate) fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        let found = ctx.inspect_as_read(&ctx.path()?)?;
        let scope = scope_filter(self.scope.as_deref())?;
        // Entries are decoded one at a time and printing stops at the limit, so a listing
        // of a few entries costs a few entries.
        let mut left = self.limit.unwrap_or(usize::MAX);
        let mut failed: anyhow::Result<()> = Ok(());
        let mut walked = Vec::new();
        if left > 0 {
            walked = found.for_each_entry(|s, n, e| {
                if self.namespace.as_deref().is_some_and(|want| n != want)
                    || scope.as_ref().is_some_and(|want| s != want)
                {
                    return ControlFlow::Continue(());
                }
                let item = ListItem {
                    scope: short(s.fingerprint()),
                    namespace: n,
                    key: e.key().fields(),
                    fingerprint: e.fingerprint().to_hex(),
                    candidates: e.candidates().len(),
                    best: e.candidates().first().map(|c| candidate_json(c)),
                    entry: e,
                };
                if let Err(err) = out.item(&item, ctx.json) {
                    failed = Err(err);
                    return ControlFlow::Break(());
                }
                left -= 1;
                if left == 0 || out.closed() {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            });
        }
        failed?;
        let damage = Damage::of([found.problems.as_slice(), walked.as_slice()]);
        if damage.is_empty() || out.closed() {
            return Ok(exit::OK);
        }
        damage.say("the list holds what could be read: the entries under the \"damaged:\" lines are not in it");
        Ok(exit::PROBLEMS)
    }
}

impl Report for ListItem<'_> {
    fn text(&self, out: &mut Out) -> anyhow::Result<()> {
        let (best, time) = match self.entry.candidates().first() {
            Some(c) => {
                let time = match &c.outcome {
                    Outcome::Measured(s) => fmt_ns(s.median_ns),
                    Outcome::Failed(_) => "failed".to_owned(),
                    Outcome::Chosen(_) => "chosen".to_owned(),
                };
                (c.id.label(), time)
            }
            None => ("-".to_owned(), "-".to_owned()),
        };
        out.line(format!(
            "{} {:<16} {:<40} {best} {time}",
            self.scope,
            self.namespace,
            self.entry.key().to_string()
        ))
    }
}
