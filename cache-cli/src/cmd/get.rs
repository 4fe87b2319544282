//! `tunecache get`: the ranked candidates recorded for one key, in every scope (or one);
//! exit 4 if there are none.

use std::path::{Path, PathBuf};

use clap::Args;
use serde::Serialize;

use cache_core::{GateVerdict, Inspection};
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
    /// What the system files (`TUNECACHE_SYSTEM_PATH`) hold for the key, each with its file:
    /// the tier a cache asks after its own file.
    pub(crate) system: Vec<(PathBuf, Scope, Entry)>,
    /// What the shared tier had, when the file had nothing (read through, as a cache would;
    /// the file is not changed).
    remote: Vec<(Scope, Entry)>,
    /// The file's entries for the key, read once (a damaged one is said once).
    local: Vec<(Scope, Entry)>,
}

impl Lookup {
    pub(crate) fn new(
        ctx: &Context<'_>,
        key: &KeyArgs,
        scope: &ScopeFilter,
    ) -> anyhow::Result<Self> {
        let path = ctx.path()?;
        // A machine with no cache file yet (the first thing a new machine of a fleet does, or
        // one that only has shipped bundles) still reads the lower tiers: the file is then an
        // empty one.
        let lower_tiers = crate::settings().get_os(cache_remote::ENV_REMOTE).is_some()
            || crate::settings()
                .get_os(cache_core::ENV_SYSTEM_PATH)
                .is_some_and(|p| !p.is_empty());
        let no_file = !path.exists() && lower_tiers;
        let found = if no_file {
            cache_core::inspect(&path, &Limits::default(), None)?
        } else {
            ctx.inspect_as_read(&path)?
        };
        // A file that cannot be read whole says so before the answer: a miss there may be
        // the damage's, not the key's.
        crate::damage::Damage::of([found.problems.as_slice()]).say(format_args!(
            "{}: answered from what could be read",
            path.display()
        ));
        if let Some(GateVerdict::Refused { error, .. }) = &found.gate {
            say(format_args!("{} is not read: {error}", path.display()));
        }
        let mut lookup = Lookup {
            found,
            namespace: key.namespace.clone(),
            key: Key::new(parse_fields("--key", &key.key)?),
            scope: scope_filter(scope.scope.as_deref())?,
            system: Vec::new(),
            remote: Vec::new(),
            local: Vec::new(),
        };
        lookup.local = entries_for(
            &lookup.found,
            &lookup.namespace,
            &lookup.key,
            lookup.scope.as_ref(),
        );
        // The lower tiers only on a miss in the file, as a cache asks them.
        if lookup.local_entries().is_empty() {
            lookup.system = lookup.read_system(ctx);
            if lookup.system.is_empty() {
                lookup.remote = lookup.read_through(ctx)?;
            }
        }
        Ok(lookup)
    }

    /// The key in each system file (`TUNECACHE_SYSTEM_PATH`, in order), as a cache's system
    /// tier reads them: a bundle or a cache file of this file's application (an older schema
    /// shown migrated where this tool knows the steps); one that cannot be used is said and
    /// passed by.
    pub(crate) fn read_system(&self, ctx: &Context<'_>) -> Vec<(PathBuf, Scope, Entry)> {
        #[cfg_attr(
            not(feature = "s3"),
            allow(unused_mut, reason = "extended with a generation")
        )]
        let mut paths: Vec<PathBuf> = crate::settings().system_paths();
        // A pinned generation (TUNECACHE_GENERATION) is read as a system file too.
        #[cfg(feature = "s3")]
        if let Ok(file) = ctx.path() {
            paths.extend(super::generation::pinned(&file));
        }
        if paths.is_empty() {
            return Vec::new();
        }
        let app = self
            .found
            .snapshot
            .header
            .as_ref()
            .map_or_else(|| ctx.app(), |h| h.app.clone());
        let registry = ctx.registry(&app);
        let limits = Limits::default();
        let mut out = Vec::new();
        for path in paths {
            // As a cache's system tier says it.
            if std::fs::symlink_metadata(&path).is_err() {
                say(format_args!(
                    "the system file {} is not used: no such file",
                    path.display()
                ));
                continue;
            }
            let opened = cache_core::open_bundle(&path, &limits, registry)
                .map(|(_, found)| found)
                .or_else(|_| cache_core::inspect(&path, &limits, registry));
            let mut found = match opened {
                Ok(found) => found,
                Err(e) => {
                    say(format_args!(
                        "the system file {} is not used: {e}",
                        path.display()
                    ));
                    continue;
                }
            };
            let usable = match (&found.gate, found.snapshot.header.as_ref()) {
                (_, Some(h)) if h.app != app => Err(format!("it is {}'s, not {app}'s", h.app)),
                (Some(GateVerdict::Refused { error, .. }), _) => Err(error.to_string()),
                (Some(GateVerdict::Migrates { .. }), _) => match registry {
                    Some(r) => found
                        .migrate_in_memory(r, &limits)
                        .map(|_| ())
                        .map_err(|e| e.to_string()),
                    None => Err("its schema is older and this tool has no steps for it".into()),
                },
                (None, None) => Err("it holds no readable cache".into()),
                _ => Ok(()),
            };
            if let Err(why) = usable {
                say(format_args!(
                    "the system file {} is not used: {why}",
                    path.display()
                ));
                continue;
            }
            for (scope, entry) in
                entries_for(&found, &self.namespace, &self.key, self.scope.as_ref())
            {
                out.push((path.clone(), scope, entry));
            }
        }
        out
    }

    /// A local miss: the key in the shared tier, if `TUNECACHE_REMOTE` names one.
    fn read_through(&self, ctx: &Context<'_>) -> anyhow::Result<Vec<(Scope, Entry)>> {
        if crate::settings().get_os(cache_remote::ENV_REMOTE).is_none() {
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
        self.local.clone()
    }

    /// The shared tier's entries for the key (already read if the file had none).
    pub(crate) fn remote_entries(&self, ctx: &Context<'_>) -> anyhow::Result<Vec<(Scope, Entry)>> {
        if !self.remote.is_empty() {
            return Ok(self.remote.clone());
        }
        self.read_through(ctx)
    }

    /// What a lookup answers: the file's entries, else the system files', else the shared
    /// tier's (the order a cache asks its tiers in).
    pub(crate) fn entries(&self) -> Vec<(Scope, Entry)> {
        if !self.local.is_empty() {
            return self.local.clone();
        }
        if let Some((path, ..)) = self.system.first() {
            say(format_args!(
                "not in {}; read from the system file {}",
                self.found.path.display(),
                path.display()
            ));
            return self
                .system
                .iter()
                .map(|(_, s, e)| (s.clone(), e.clone()))
                .collect();
        }
        self.remote.clone()
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
