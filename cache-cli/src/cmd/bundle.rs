//! `tunecache bundle create|inspect|verify|import`: ship a cache's entries into containers,
//! wheels and other machines as one deterministic, checksummed file with a manifest
//! (FORMAT.md, "Bundles"), and take them in again through the same version gate and migration
//! as every read.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;

use cache_core::cache_migrate::Migrations;
use cache_core::{
    AppendOptions, BundleCheck, BundleWriter, Inspection, Spill, check_bundle,
    merge_built_into_file, open_bundle,
};
use cache_format::bundle::Manifest;
use cache_format::{Limits, Scope};

use crate::context::{Context, saving};
use crate::damage::Damage;
use crate::exit;
use crate::options::WaitArgs;
use crate::output::{Out, Report, say};
use crate::progress::Pace;
use crate::render::{parse_fields, scope_filter};

/// The arguments of `tunecache bundle`.
#[derive(Debug, Args)]
pub(crate) struct BundleArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Write the cache's entries (optionally one scope, some namespaces) as a bundle
    Create(CreateArgs),
    /// Show a bundle's manifest, and which of its scopes match this machine
    Inspect(InspectArgs),
    /// Check every checksum, the manifest and every entry; exit 3 on any damage
    Verify(FileArg),
    /// Merge a bundle into the cache (older schemas migrated, newer ones left alone)
    Import(ImportArgs),
}

#[derive(Debug, Args)]
struct CreateArgs {
    /// The bundle to write
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
    /// Only this scope (a JSON object)
    #[arg(long)]
    scope: Option<String>,
    /// Only this namespace (repeatable)
    #[arg(short = 'n', long = "namespace")]
    namespaces: Vec<String>,
    /// Who made it, for the manifest (e.g. a CI job's name)
    #[arg(long, default_value = "tunecache")]
    producer: String,
    /// Write the bundle even if the cache is damaged: without what could not be read (each
    /// lost block and what it cost is said on stderr). Without it, a damaged cache writes
    /// nothing and exits 3
    #[arg(long)]
    allow_damaged: bool,
    /// Sign it with this secret key file (`tunecache keys generate`), written beside it as
    /// OUT.sig; repeat for more signers
    #[cfg(feature = "s3")]
    #[arg(long, value_name = "KEY")]
    sign: Vec<PathBuf>,
    /// With --sign: how many days the signature is good for
    #[cfg(feature = "s3")]
    #[arg(long, value_name = "DAYS", default_value_t = 365)]
    expires_days: u64,
}

#[derive(Debug, Args)]
struct FileArg {
    /// The bundle
    bundle: PathBuf,
}

#[derive(Debug, Args)]
struct InspectArgs {
    /// The bundle
    bundle: PathBuf,
    /// The scope to match against (a JSON object) [default: this machine's CPU scope]
    #[arg(long)]
    scope: Option<String>,
}

/// What an import takes from the bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Policy {
    /// Only keys the cache does not have.
    Fill,
    /// Every key, merged by the merge rule (the default).
    Join,
}

#[derive(Debug, Args)]
struct ImportArgs {
    /// The bundle
    bundle: PathBuf,
    /// fill: only what is missing here; join: merge everything
    #[arg(long, value_enum, default_value = "join")]
    policy: Policy,
    /// The application's migration file, to migrate a bundle at an older schema (needed unless
    /// the tool has the registry built in)
    #[arg(long, value_name = "FILE")]
    migrations: Option<PathBuf>,
    #[command(flatten)]
    wait: WaitArgs,
}

#[derive(Debug, Serialize)]
struct ScopeMatch {
    fingerprint: String,
    fields: String,
    entries: u64,
    matches: bool,
    /// Fields that differ from the scope matched against: (field, here, in the bundle).
    differing: Vec<(String, Option<String>, Option<String>)>,
}

#[derive(Debug, Serialize)]
struct BundleReport {
    bundle: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    manifest: Option<Manifest>,
    ok: bool,
    problems: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    scopes: Vec<ScopeMatch>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    imported: Option<ImportCounts>,
    /// Entries written, checked or read, and how fast.
    #[serde(skip_serializing_if = "Option::is_none")]
    pace: Option<Pace>,
}

#[derive(Debug, Default, Serialize)]
struct ImportCounts {
    added: usize,
    replaced: usize,
    skipped: usize,
    path: PathBuf,
    policy: Option<Policy>,
    migrated_from: Option<u32>,
}

impl BundleArgs {
    pub(crate) fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        match self.action {
            Action::Create(a) => a.run(ctx, out),
            Action::Inspect(a) => a.run(ctx, out),
            Action::Verify(a) => verify(ctx, &a.bundle, out),
            Action::Import(a) => a.run(ctx, out),
        }
    }
}

fn empty_report(bundle: &Path) -> BundleReport {
    BundleReport {
        bundle: bundle.to_owned(),
        manifest: None,
        ok: true,
        problems: Vec::new(),
        scopes: Vec::new(),
        bytes: None,
        imported: None,
        pace: None,
    }
}

impl CreateArgs {
    fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        let started = Instant::now();
        let path = ctx.path()?;
        let found = ctx.inspect_as_read(&path)?;
        let Some((app, schema)) = ctx.version_as_read(&found) else {
            bail!("{}: no readable snapshot to bundle", path.display());
        };
        let want = scope_filter(self.scope.as_deref())?;
        let created =
            match crate::settings().get("SOURCE_DATE_EPOCH") {
                Some(v) => Some(v.trim().parse::<u64>().with_context(|| {
                    format!("SOURCE_DATE_EPOCH={v:?} is not a number of seconds")
                })?),
                None => None,
            };
        if self.output.file_name().is_none() {
            bail!("the output needs a file name: {}", self.output.display());
        }
        crate::guard::refuse_cache_files(&self.output, &path, "the bundle")?;
        crate::guard::sweep(&self.output);
        let not_written = || format!("the bundle was not written to {}", self.output.display());
        // Streamed: the cache's entries in key order, filtered, into the bundle's table.
        let mut writer = BundleWriter::create(
            &self.output,
            &Migrations::new(app, schema),
            &Limits::default(),
        )
        .with_context(not_written)?;
        let mut walk = found.in_key_order();
        for (_, scope, ns, entry) in walk.by_ref() {
            if want.as_ref().is_none_or(|w| *w == scope)
                && (self.namespaces.is_empty() || self.namespaces.contains(&ns))
            {
                writer.add(&scope, &ns, &entry).with_context(not_written)?;
            }
        }
        let damage = Damage::of([found.problems.as_slice(), walk.problems()]);
        if let Some(code) = damage.refuse("the bundle", self.allow_damaged) {
            return Ok(code);
        }
        let written = writer
            .finish(created, &self.producer)
            .with_context(not_written)?;
        let mut report = empty_report(&self.output);
        #[cfg(feature = "s3")]
        if !self.sign.is_empty() {
            let by = crate::signing::sign_bundle(
                &self.output,
                &written.manifest,
                &self.sign,
                self.expires_days,
            )?;
            say(format_args!(
                "signed by {} in {}",
                by.join(", "),
                crate::signing::sig_path(&self.output).display()
            ));
        }
        report.bytes = Some(written.bytes);
        report.pace = Some(Pace::since(started, written.manifest.entries));
        report.manifest = Some(written.manifest);
        out.report(&report, ctx.json)?;
        Ok(exit::OK)
    }
}

/// The pace of a check: the entries its scopes hold (what the entries say), since `started`.
fn checked_pace(started: Instant, checked: &BundleCheck) -> Pace {
    Pace::since(started, checked.scopes.iter().map(|(_, n)| n).sum())
}

/// Checks a bundle whole (every checksum, the manifest against the entries, every entry
/// decoded), streamed: a bundle of any size is never held in memory.
fn check(path: &Path) -> anyhow::Result<BundleCheck> {
    check_bundle(path, &Limits::default())
        .with_context(|| format!("cannot read {}", path.display()))
}

fn verify(ctx: &Context<'_>, path: &Path, out: &mut Out) -> anyhow::Result<u8> {
    let started = Instant::now();
    let checked = check(path)?;
    let mut report = empty_report(path);
    report.bytes = Some(checked.bytes);
    report.pace = Some(checked_pace(started, &checked));
    report.problems = checked.problems;
    #[cfg(feature = "s3")]
    if let Some(manifest) = &checked.manifest
        && let Some(why) =
            crate::signing::refusal(path, manifest, ctx.path().ok().as_deref(), false)?
    {
        report.problems.push(why);
    }
    report.ok = report.problems.is_empty();
    report.manifest = checked.manifest;
    out.report(&report, ctx.json)?;
    Ok(if report.ok { exit::OK } else { exit::PROBLEMS })
}

impl InspectArgs {
    fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        let here = match &self.scope {
            Some(s) => Scope::new(parse_fields("--scope", s)?),
            None => gpu_tuner::cpu::scope(),
        };
        let started = Instant::now();
        let checked = check(&self.bundle)?;
        let mut report = empty_report(&self.bundle);
        report.bytes = Some(checked.bytes);
        report.pace = Some(checked_pace(started, &checked));
        report.ok = checked.problems.is_empty();
        report.problems = checked.problems;
        if let Some(manifest) = checked.manifest {
            for (scope, entries) in &checked.scopes {
                let differing = here
                    .fields()
                    .iter()
                    .map(|(n, _)| n)
                    .chain(scope.fields().iter().map(|(n, _)| n))
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .filter_map(|n| {
                        let (a, b) = (here.fields().get(n), scope.fields().get(n));
                        (a != b).then(|| {
                            (
                                n.clone(),
                                a.map(ToString::to_string),
                                b.map(ToString::to_string),
                            )
                        })
                    })
                    .collect::<Vec<_>>();
                report.scopes.push(ScopeMatch {
                    fingerprint: scope.fingerprint().to_hex(),
                    fields: scope.to_string(),
                    entries: *entries,
                    matches: differing.is_empty(),
                    differing,
                });
            }
            report.manifest = Some(manifest);
        }
        out.report(&report, ctx.json)?;
        Ok(if report.ok { exit::OK } else { exit::PROBLEMS })
    }
}

impl ImportArgs {
    fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        let started = Instant::now();
        let path = ctx.path()?;
        ctx.check_writable("bundle import")?;
        let checked = check(&self.bundle)?;
        if !checked.problems.is_empty() {
            bail!(
                "{} is damaged ({}); nothing was imported",
                self.bundle.display(),
                checked.problems.join("; ")
            );
        }
        let manifest = checked.manifest.context("an unreadable bundle")?;
        #[cfg(feature = "s3")]
        if let Some(why) = crate::signing::refusal(&self.bundle, &manifest, Some(&path), true)? {
            bail!("{why}; nothing was imported");
        }
        let given = match &self.migrations {
            Some(f) => Some(ctx.migration_file(f)?),
            None => None,
        };
        let new_schema = given.as_ref().map_or(manifest.schema, Migrations::current);
        let (app, schema) = match crate::context::peek_header(&path) {
            Some(h) => (h.app, h.schema),
            None => (manifest.app.clone(), new_schema),
        };
        if manifest.app != app {
            bail!(
                "{} holds application {:?}, the cache is {app:?}; nothing was imported",
                self.bundle.display(),
                manifest.app
            );
        }
        let mut report = empty_report(&self.bundle);
        report.bytes = Some(checked.bytes);
        if manifest.schema > schema {
            say(format_args!(
                "{} is at schema {}, newer than the cache's {schema}: left alone, nothing was imported (upgrade the tool, or migrate the cache)",
                self.bundle.display(),
                manifest.schema
            ));
            report.imported = Some(ImportCounts {
                path,
                ..ImportCounts::default()
            });
            report.manifest = Some(manifest);
            out.report(&report, ctx.json)?;
            return Ok(exit::OK);
        }
        let registry = self.registry(ctx, given, &app, schema, manifest.schema)?;
        let (_, mut incoming) = open_bundle(&self.bundle, &Limits::default(), Some(&registry))
            .with_context(|| format!("cannot read {}", self.bundle.display()))?;
        if manifest.schema != schema {
            incoming
                .migrate_in_memory(&registry, &Limits::default())
                .with_context(|| format!("{}: nothing was imported", self.bundle.display()))?;
        }
        let existing = if path.exists() {
            Some(ctx.inspect_as_read(&path)?)
        } else {
            None
        };
        let mut counts = ImportCounts {
            path: path.clone(),
            policy: Some(self.policy),
            migrated_from: (manifest.schema != schema).then_some(manifest.schema),
            ..ImportCounts::default()
        };
        // Streamed: each of the bundle's entries looked up in the cache, what the policy takes
        // gathered in a spill beside the cache (an index in memory), then one write.
        let spill_dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() && p.is_dir() => p.to_owned(),
            _ => std::env::temp_dir(),
        };
        let mut take = Spill::new(&spill_dir);
        for (_, scope, ns, entry) in incoming.in_key_order() {
            if !self.select(existing.as_ref(), &scope, &ns, &entry, &mut counts) {
                continue;
            }
            take.merge(&scope, &ns, entry)?;
        }
        drop(incoming);
        if !take.is_empty() {
            let options = AppendOptions {
                lock_timeout: self.wait.wait,
                ..AppendOptions::default()
            };
            saving("the bundle's entries", &path, || {
                merge_built_into_file(&path, &registry, take, &options)
            })
            .with_context(|| format!("the bundle was not imported into {}", path.display()))?;
        }
        let read = counts.added + counts.replaced + counts.skipped;
        report.pace = Some(Pace::since(started, read as u64));
        report.imported = Some(counts);
        report.manifest = Some(manifest);
        out.report(&report, ctx.json)?;
        Ok(exit::OK)
    }

    /// The registry that lifts a bundle at `from` to the cache's `schema` (the identity when
    /// they are the same): `--migrations FILE`, or the one the tool has built in.
    fn registry(
        &self,
        ctx: &Context<'_>,
        given: Option<Migrations>,
        app: &str,
        schema: u32,
        from: u32,
    ) -> anyhow::Result<Migrations> {
        if from == schema {
            return Ok(Migrations::new(app, schema));
        }
        let registry = given.or_else(|| ctx.registry(app).cloned()).with_context(|| {
            format!(
                "{} is at schema {from}, the cache at {schema}; pass --migrations FILE to migrate it (nothing was imported)",
                self.bundle.display(),
            )
        })?;
        if registry.app() != app || registry.current() != schema {
            bail!(
                "the migrations lead to {} schema {}, the cache is {app:?} schema {schema}; nothing was imported",
                registry.app(),
                registry.current()
            );
        }
        Ok(registry)
    }

    /// Whether the policy takes `entry` into a cache holding `existing` (`None`: no cache
    /// yet): `fill` only keys it lacks, `join` every entry that adds to what it holds; counted
    /// in `counts`.
    fn select(
        &self,
        existing: Option<&Inspection>,
        scope: &Scope,
        ns: &str,
        entry: &cache_format::Entry,
        counts: &mut ImportCounts,
    ) -> bool {
        let held = existing.and_then(|e| e.get(scope, ns, &entry.fingerprint()));
        match held {
            None => counts.added += 1,
            Some(_) if self.policy == Policy::Fill => {
                counts.skipped += 1;
                return false;
            }
            Some(held) => {
                let mut merged = held.clone();
                merged.merge(entry.clone());
                if merged == held {
                    counts.skipped += 1;
                    return false;
                }
                counts.replaced += 1;
            }
        }
        true
    }
}

impl Report for BundleReport {
    fn text(&self, out: &mut Out) -> anyhow::Result<()> {
        for p in &self.problems {
            out.line(format!("problem: {p}"))?;
        }
        if let Some(m) = &self.manifest {
            out.line(format!(
                "{}: {} entries of {:?} schema {} in {} scopes, made by {} ({}) at {}, sha256 {}",
                self.bundle.display(),
                m.entries,
                m.app,
                m.schema,
                m.scopes.len(),
                m.producer,
                m.tool,
                m.created,
                &m.payload_sha256[..16]
            ))?;
        }
        for s in &self.scopes {
            if s.matches {
                out.line(format!(
                    "  scope {} matches here ({} entries)",
                    s.fields, s.entries
                ))?;
            } else {
                let why: Vec<String> = s
                    .differing
                    .iter()
                    .map(|(f, here, there)| {
                        format!(
                            "{f}: here {}, bundle {}",
                            here.as_deref().unwrap_or("(none)"),
                            there.as_deref().unwrap_or("(none)")
                        )
                    })
                    .collect();
                out.line(format!(
                    "  scope {} does not match here ({} entries): {}",
                    s.fields,
                    s.entries,
                    why.join("; ")
                ))?;
            }
        }
        if let Some(c) = &self.imported {
            out.line(format!(
                "imported into {}: {} added, {} replaced, {} skipped{}",
                c.path.display(),
                c.added,
                c.replaced,
                c.skipped,
                c.migrated_from
                    .map(|s| format!(" (migrated from schema {s})"))
                    .unwrap_or_default()
            ))?;
        } else if self.ok && self.problems.is_empty() && self.scopes.is_empty() {
            out.line("ok")?;
        }
        Ok(())
    }
}
