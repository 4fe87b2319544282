//! `tunecache get`: the ranked candidates recorded for one key, in every scope (or one);
//! exit 4 if there are none.

use std::path::Path;

use clap::Args;
use serde::Serialize;

use cache_core::Inspection;
use cache_format::json::{JsonRecord, record};
use cache_format::{Entry, Key, Limits, Outcome, Scope, Value};

use crate::context::Context;
use crate::exit;
use crate::options::{KeyArgs, ScopeFilter};
use crate::output::{Out, Report, say};
use crate::render::{entries_for, fmt_ns, fmt_time, parse_fields, scope_filter, short};

/// The arguments of `tunecache get`.
#[derive(Debug, Args)]
pub(crate) struct GetArgs {
    #[command(flatten)]
    key: KeyArgs,
    #[command(flatten)]
    scope: ScopeFilter,
}

/// One scope's entry for the key: the interchange record (what `--json` prints, one per line).
#[derive(Debug, Serialize)]
#[serde(transparent)]
struct Found<'a> {
    record: JsonRecord,
    #[serde(skip)]
    scope: &'a Scope,
    #[serde(skip)]
    entry: &'a Entry,
}

/// What `get` and `show` look up: the key's entries in the inspected file.
pub(crate) struct Lookup {
    pub(crate) found: Inspection,
    pub(crate) namespace: String,
    pub(crate) key: Key,
    pub(crate) scope: Option<Scope>,
    /// What the shared tier had, when the file had nothing (read through, as a cache would;
    /// the file is not changed).
    remote: Vec<(Scope, Entry)>,
}

impl Lookup {
    pub(crate) fn new(
        ctx: &Context<'_>,
        key: &KeyArgs,
        scope: &ScopeFilter,
    ) -> anyhow::Result<Self> {
        let path = ctx.path()?;
        // A machine with no cache file yet (the first thing a new machine of a fleet does)
        // still reads the shared tier: the file is then an empty one.
        let no_file = !path.exists() && std::env::var_os(cache_remote::ENV_REMOTE).is_some();
        let found = if no_file {
            cache_core::inspect(&path, &Limits::default(), None)?
        } else {
            ctx.inspect_as_read(&path)?
        };
        let mut lookup = Lookup {
            found,
            namespace: key.namespace.clone(),
            key: Key::new(parse_fields("--key", &key.key)?),
            scope: scope_filter(scope.scope.as_deref())?,
            remote: Vec::new(),
        };
        if lookup.entries().is_empty() {
            lookup.remote = lookup.read_through(ctx)?;
        }
        Ok(lookup)
    }

    /// A local miss: the key in the shared tier, if `TUNECACHE_REMOTE` names one.
    fn read_through(&self, ctx: &Context<'_>) -> anyhow::Result<Vec<(Scope, Entry)>> {
        if std::env::var_os(cache_remote::ENV_REMOTE).is_none() {
            return Ok(Vec::new());
        }
        let (app, schema) = match &self.found.snapshot.header {
            Some(h) => (h.app.clone(), h.schema),
            None => {
                let app = ctx.app();
                let schema = ctx.registry(&app).map_or(1, |r| r.current());
                (app, schema)
            }
        };
        let registry = ctx
            .registry(&app)
            .filter(|r| r.current() == schema)
            .cloned()
            .unwrap_or_else(|| cache_core::cache_migrate::Migrations::new(app, schema));
        let Some(tier) = crate::shared::tier(&registry)? else {
            return Ok(Vec::new());
        };
        let fp = self.key.fingerprint();
        match tier.find(
            &self.namespace,
            &fp,
            self.scope.as_ref(),
            crate::shared::WAIT,
        ) {
            Ok(found) => {
                if !found.is_empty() {
                    say(format_args!(
                        "not in {}; read from the shared tier at {}",
                        self.found.path.display(),
                        tier.describe()
                    ));
                }
                let rejected: u64 = tier.health().rejected.values().sum();
                if rejected > 0 {
                    say(format_args!(
                        "the shared tier at {} held {rejected} value(s) for this key that failed the checks: {:?}",
                        tier.describe(),
                        tier.health().rejected
                    ));
                }
                Ok(found)
            }
            Err(e) => {
                say(format_args!(
                    "not in {}, and the shared tier at {} could not be read: {e}",
                    self.found.path.display(),
                    tier.describe()
                ));
                Ok(Vec::new())
            }
        }
    }

    /// The file's entries for the key (in the scope filter, if any), without the shared tier.
    pub(crate) fn local_entries(&self) -> Vec<(Scope, Entry)> {
        entries_for(&self.found, &self.namespace, &self.key, self.scope.as_ref())
    }

    /// The shared tier's entries for the key (already read if the file had none).
    pub(crate) fn remote_entries(&self, ctx: &Context<'_>) -> anyhow::Result<Vec<(Scope, Entry)>> {
        if !self.remote.is_empty() {
            return Ok(self.remote.clone());
        }
        self.read_through(ctx)
    }

    pub(crate) fn entries(&self) -> Vec<(Scope, Entry)> {
        if !self.remote.is_empty() {
            return self.remote.clone();
        }
        entries_for(&self.found, &self.namespace, &self.key, self.scope.as_ref())
    }

    /// Says on stderr that nothing was found, and gives the exit code for it.
    pub(crate) fn not_found(&self) -> u8 {
        say(format_args!(
            "no entry for {} in namespace {:?} of {}",
            self.key,
            self.namespace,
            Path::display(&self.found.path)
        ));
        exit::NOT_FOUND
    }

    /// Prints the entries as interchange records, one JSON line each.
    pub(crate) fn print_json(&self, out: &mut Out) -> anyhow::Result<()> {
        for (scope, entry) in self.entries() {
            out.json_line(&record(&scope, &self.namespace, &entry))?;
        }
        Ok(())
    }
}

impl GetArgs {
    pub(crate) fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        let lookup = Lookup::new(ctx, &self.key, &self.scope)?;
        let entries = lookup.entries();
        if entries.is_empty() {
            return Ok(lookup.not_found());
        }
        for (scope, entry) in &entries {
            let found = Found {
                record: record(scope, &lookup.namespace, entry),
                scope,
                entry,
            };
            out.item(&found, ctx.json)?;
        }
        Ok(exit::OK)
    }
}

impl Report for Found<'_> {
    fn text(&self, out: &mut Out) -> anyhow::Result<()> {
        let (scope, entry) = (self.scope, self.entry);
        out.line(format!("scope {} {scope}", short(scope.fingerprint())))?;
        out.line(format!(
            "{} {} (fingerprint {}), recorded {} by {}",
            self.record.namespace,
            entry.key(),
            entry.fingerprint(),
            fmt_time(entry.recorded_at()),
            entry.origin()
        ))?;
        for (rank, c) in entry.candidates().iter().enumerate() {
            let detail = match &c.outcome {
                Outcome::Measured(s) => format!(
                    "median {:>12}  min {:>12}  spread {:>10}  n={}",
                    fmt_ns(s.median_ns),
                    fmt_ns(s.min_ns),
                    fmt_ns(s.spread_ns),
                    s.samples
                ),
                Outcome::Failed(r) => format!("failed: {r}"),
                Outcome::Chosen(by) => format!("chosen by {by} (not measured)"),
            };
            out.line(format!(
                "  {:>2}. {:<20} {:<28} {detail}",
                rank + 1,
                c.id.algorithm,
                Value::Map(c.id.params.clone()).to_string()
            ))?;
        }
        Ok(())
    }
}
