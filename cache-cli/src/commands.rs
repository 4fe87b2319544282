//! The commands.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use cache_core::{Cache, CacheBuilder, Inspection, Location, Mode, Store, inspect};
use cache_format::{
    CacheData, Candidate, Entry, Fields, Fingerprint, Key, Limits, Origin, Outcome, Scope, Stats,
    Value,
};
use cache_migrate::Migrations;
use serde_json::json;

use crate::Config;
use crate::args::{Cli, Command};
use crate::exit;
use crate::output::Out;

pub(crate) fn dispatch(cli: &Cli, config: &Config) -> anyhow::Result<u8> {
    let mut out = Out::new();
    if let Command::Migrate {
        migrations,
        backup,
        dry_run,
        lock_timeout,
    } = &cli.command
    {
        // The application (and so the default file) may come from the migration file.
        let code = migrate(
            cli,
            config,
            migrations.as_deref(),
            *backup,
            *dry_run,
            *lock_timeout,
            &mut out,
        )?;
        out.finish()?;
        return Ok(code);
    }
    let app = cli
        .app
        .clone()
        .unwrap_or_else(|| config.default_app.clone());
    let path = cache_path(cli, &app)?;
    let code = match &cli.command {
        Command::Migrate { .. } => exit::OK, // handled above
        Command::Tune {
            backend,
            device,
            repeat,
            steps,
            no_progress,
            flush_l2,
        } => {
            let calls = gpu_tuner::workload::builtin_steps(steps.unwrap_or(usize::MAX));
            let options = crate::tune::TuneOptions {
                backend: *backend,
                device: *device,
                repeat: *repeat,
                progress: !no_progress,
                flush_l2: *flush_l2,
            };
            crate::tune::tune(&path, &options, &calls, cli.json, &mut out)?
        }
        Command::Show {
            namespace,
            key,
            scope,
        } => crate::tune::show(&path, namespace, key, scope.as_deref(), &mut out)?,
        Command::Stats => stats(&path, cli.json, &mut out)?,
        Command::List {
            namespace,
            scope,
            limit,
        } => list(
            &path,
            namespace.as_deref(),
            scope.as_deref(),
            *limit,
            cli.json,
            &mut out,
        )?,
        Command::Get {
            namespace,
            key,
            scope,
        } => get(&path, namespace, key, scope.as_deref(), cli.json, &mut out)?,
        Command::Put {
            namespace,
            key,
            algo,
            params,
            median_ns,
            min_ns,
            spread_ns,
            samples,
            failed,
            scope,
            candidate_set,
            schema,
        } => {
            let params = parse_fields("--params", params)?;
            let outcome = match (failed, median_ns) {
                (Some(reason), _) => Outcome::Failed(reason.clone()),
                (None, Some(median)) => Outcome::Measured(Stats {
                    median_ns: *median,
                    min_ns: min_ns.unwrap_or(*median),
                    spread_ns: spread_ns.unwrap_or(0.0),
                    samples: *samples,
                }),
                (None, None) => bail!("--median-ns is required unless --failed is given"),
            };
            let candidate = Candidate {
                algorithm: algo.clone(),
                params,
                outcome,
                measured_at: cache_format::now_millis(),
                tuning_ns: None,
            };
            let set = match candidate_set {
                Some(hex) => hex.parse().context("--candidate-set")?,
                None => Fingerprint::default(),
            };
            put(
                &path, &app, *schema, namespace, key, scope, set, candidate, cli.json, &mut out,
            )?
        }
        Command::Verify => verify(&path, cli.json, &mut out)?,
        Command::Export { output } => export(&path, output, &mut out)?,
        Command::Import { input, schema } => {
            import(&path, &app, *schema, input, cli.json, &mut out)?
        }
    };
    out.finish()?;
    Ok(code)
}

/// `--cache-file`, else the library's own resolution (environment, then default directory).
fn cache_path(cli: &Cli, app: &str) -> anyhow::Result<PathBuf> {
    if let Some(p) = &cli.cache_file {
        return Ok(p.clone());
    }
    match CacheBuilder::new(Migrations::new(app, 1)).resolve().0 {
        Location::File { path, .. } => Ok(path),
        Location::Memory(reason) => bail!("no cache file ({reason}); pass --cache-file PATH"),
    }
}

pub(crate) fn parse_fields(what: &str, text: &str) -> anyhow::Result<Fields> {
    match serde_json::from_str::<Value>(text)
        .with_context(|| format!("{what} is not valid JSON for a key: {text}"))?
    {
        Value::Map(fields) => Ok(fields),
        other => bail!("{what} must be a JSON object, got {other}"),
    }
}

pub(crate) fn read_inspection(path: &Path) -> anyhow::Result<Inspection> {
    let found = inspect(path, &Limits::default())?;
    if found.snapshot.bytes.is_none() && found.journal.bytes.is_none() {
        bail!("{}: no such cache file", path.display());
    }
    Ok(found)
}

pub(crate) fn fmt_ns(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{:.3} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.3} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.3} µs", ns / 1e3)
    } else {
        format!("{ns:.1} ns")
    }
}

/// `YYYY-MM-DD HH:MM:SSZ` for Unix milliseconds (UTC; proleptic Gregorian calendar).
pub(crate) fn fmt_time(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn short(fp: Fingerprint) -> String {
    fp.to_hex()[..8].to_owned()
}

fn stats(path: &Path, as_json: bool, out: &mut Out) -> anyhow::Result<u8> {
    let found = read_inspection(path)?;
    let mut per_scope: Vec<(Scope, BTreeMap<String, usize>)> = Vec::new();
    for (scope, data) in found.data.scopes() {
        per_scope.push((
            scope.clone(),
            data.namespaces
                .iter()
                .map(|(n, e)| (n.clone(), e.len()))
                .collect(),
        ));
    }
    let header = found.snapshot.header.as_ref();
    if as_json {
        out.json_pretty(&json!({
            "path": found.path,
            "snapshot_bytes": found.snapshot.bytes,
            "format": found.snapshot.format.map(|f| f.number()),
            "app": header.map(|h| h.app.clone()),
            "schema": header.map(|h| h.schema),
            "generation": header.map(|h| format!("{:016x}", h.generation)),
            "entries": found.data.len(),
            "journal": {
                "bytes": found.journal.bytes,
                "records": found.journal.records,
                "stale": found.journal.stale,
                "damaged": found.journal.damaged,
                "torn_bytes": found.journal.torn_bytes,
            },
            "scopes": per_scope.iter().map(|(s, n)| json!({
                "scope": s.fields(),
                "fingerprint": s.fingerprint().to_hex(),
                "namespaces": n,
            })).collect::<Vec<_>>(),
            "problems": found.problems,
            "notes": found.notes,
        }))?;
    } else {
        out.line(format!("file       {}", found.path.display()))?;
        match (header, found.snapshot.bytes) {
            (Some(h), Some(bytes)) => out.line(format!(
                "snapshot   {bytes} bytes, format {}, app {:?} schema {}, generation {:016x}",
                found.snapshot.format.map_or(0, |f| f.number()),
                h.app,
                h.schema,
                h.generation
            ))?,
            (None, Some(bytes)) => out.line(format!("snapshot   {bytes} bytes, unreadable"))?,
            _ => out.line("snapshot   none")?,
        }
        match found.journal.bytes {
            Some(bytes) => out.line(format!(
                "journal    {bytes} bytes, {} records{}{}",
                found.journal.records,
                if found.journal.stale { ", stale" } else { "" },
                if found.journal.torn_bytes > 0 {
                    format!(", {} torn bytes", found.journal.torn_bytes)
                } else {
                    String::new()
                }
            ))?,
            None => out.line("journal    none")?,
        }
        out.line(format!(
            "entries    {} in {} scopes",
            found.data.len(),
            per_scope.len()
        ))?;
        for (scope, namespaces) in &per_scope {
            out.line(format!("scope {} {scope}", short(scope.fingerprint())))?;
            for (ns, n) in namespaces {
                out.line(format!("  {ns:<24} {n} entries"))?;
            }
        }
        for p in &found.problems {
            out.line(format!("problem: {p}"))?;
        }
        for n in &found.notes {
            out.line(format!("note: {n}"))?;
        }
    }
    Ok(exit::OK)
}

pub(crate) fn scope_filter(scope: Option<&str>) -> anyhow::Result<Option<Scope>> {
    scope
        .map(|s| parse_fields("--scope", s).map(Scope::new))
        .transpose()
}

fn best_summary(entry: &Entry) -> (String, String) {
    match entry.candidates().first() {
        Some(c) => {
            let name = if c.params.is_empty() {
                c.algorithm.clone()
            } else {
                format!("{} {}", c.algorithm, Value::Map(c.params.clone()))
            };
            let time = match &c.outcome {
                Outcome::Measured(s) => fmt_ns(s.median_ns),
                Outcome::Failed(_) => "failed".to_owned(),
            };
            (name, time)
        }
        None => ("-".to_owned(), "-".to_owned()),
    }
}

fn list(
    path: &Path,
    namespace: Option<&str>,
    scope: Option<&str>,
    limit: Option<usize>,
    as_json: bool,
    out: &mut Out,
) -> anyhow::Result<u8> {
    let found = read_inspection(path)?;
    let scope = scope_filter(scope)?;
    let entries = found
        .data
        .entries()
        .filter(|(s, n, _)| {
            namespace.is_none_or(|want| *n == want) && scope.as_ref().is_none_or(|want| *s == want)
        })
        .take(limit.unwrap_or(usize::MAX));
    for (s, n, e) in entries {
        if as_json {
            let best = e
                .candidates()
                .first()
                .map(cache_format::json::candidate_json);
            out.json(&json!({
                "scope": short(s.fingerprint()),
                "namespace": n,
                "key": e.key().fields(),
                "fingerprint": e.fingerprint().to_hex(),
                "candidates": e.candidates().len(),
                "best": best.map(|b| serde_json::to_value(b).unwrap_or_default()),
            }))?;
        } else {
            let (best, time) = best_summary(e);
            out.line(format!(
                "{} {n:<16} {:<40} {best} {time}",
                short(s.fingerprint()),
                e.key().to_string()
            ))?;
        }
    }
    Ok(exit::OK)
}

fn get(
    path: &Path,
    namespace: &str,
    key: &str,
    scope: Option<&str>,
    as_json: bool,
    out: &mut Out,
) -> anyhow::Result<u8> {
    let found = read_inspection(path)?;
    let key = Key::new(parse_fields("--key", key)?);
    let scope = scope_filter(scope)?;
    let mut hits = 0;
    for (s, entry) in entries_for(&found, namespace, &key, scope.as_ref()) {
        hits += 1;
        if as_json {
            out.json(&serde_json::to_value(cache_format::json::record(
                s, namespace, entry,
            ))?)?;
            continue;
        }
        out.line(format!("scope {} {s}", short(s.fingerprint())))?;
        out.line(format!(
            "{namespace} {key} (fingerprint {}), recorded {} by {}",
            key.fingerprint(),
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
            };
            out.line(format!(
                "  {:>2}. {:<20} {:<28} {detail}",
                rank + 1,
                c.algorithm,
                Value::Map(c.params.clone()).to_string()
            ))?;
        }
    }
    if hits == 0 {
        eprintln!(
            "tunecache: no entry for {key} in namespace {namespace:?} of {}",
            path.display()
        );
        return Ok(exit::NOT_FOUND);
    }
    Ok(exit::OK)
}

/// The entries recorded for `key` in `namespace`, in every scope or only `scope`.
pub(crate) fn entries_for<'a>(
    found: &'a Inspection,
    namespace: &str,
    key: &Key,
    scope: Option<&Scope>,
) -> Vec<(&'a Scope, &'a Entry)> {
    found
        .data
        .scopes()
        .filter(|(s, _)| scope.is_none_or(|want| want == *s))
        .filter_map(|(s, data)| {
            data.namespaces
                .get(namespace)
                .and_then(|e| e.get(&key.fingerprint()))
                .map(|e| (s, e))
        })
        .collect()
}

/// Opens `path` for writing at its own application and schema (or `app`/`schema` if new).
fn open_for_write(path: &Path, app: &str, schema: u32, scope: Scope) -> anyhow::Result<Cache> {
    let found = inspect(path, &Limits::default())?;
    let (app, schema) = match &found.snapshot.header {
        Some(h) => (h.app.clone(), h.schema),
        None => (app.to_owned(), schema),
    };
    let cache = Cache::builder(Migrations::new(app, schema))
        .file(path)
        .ignore_env()
        .scope(scope)
        .refresh_interval(None)
        .save_delay(Duration::ZERO)
        .open();
    if cache.health().mode != Mode::Persistent {
        let reason = cache
            .health()
            .reason
            .unwrap_or_else(|| "unknown reason".into());
        bail!("cannot write {}: {reason}", path.display());
    }
    Ok(cache)
}

#[allow(
    clippy::too_many_arguments,
    reason = "one call site, mirroring the command's flags"
)]
fn put(
    path: &Path,
    app: &str,
    schema: u32,
    namespace: &str,
    key: &str,
    scope: &str,
    candidate_set: Fingerprint,
    candidate: Candidate,
    as_json: bool,
    out: &mut Out,
) -> anyhow::Result<u8> {
    let key = Key::new(parse_fields("--key", key)?);
    let scope = Scope::new(parse_fields("--scope", scope)?);
    let ns = cache_core::Namespace::new(namespace)?;
    let origin = match Origin::here() {
        Origin::Measured(who) => Origin::Measured(format!("{who} via tunecache put")),
        other => other,
    };
    let cache = open_for_write(path, app, schema, scope)?;
    let fp = key.fingerprint();
    cache.put(
        ns,
        Entry::new(
            key.clone(),
            candidate_set,
            origin,
            cache_format::now_millis(),
            [candidate],
        ),
    );
    cache
        .close()
        .with_context(|| format!("the result was not saved to {}", path.display()))?;
    if as_json {
        out.json(&json!({"recorded": true, "namespace": namespace, "fingerprint": fp.to_hex(), "path": path}))?;
    } else {
        out.line(format!(
            "recorded {namespace} {key} ({fp}) in {}",
            path.display()
        ))?;
    }
    Ok(exit::OK)
}

fn verify(path: &Path, as_json: bool, out: &mut Out) -> anyhow::Result<u8> {
    let found = read_inspection(path)?;
    let ok = found.problems.is_empty();
    if as_json {
        out.json_pretty(&json!({
            "path": found.path,
            "ok": ok,
            "entries": found.data.len(),
            "journal_records": found.journal.records,
            "problems": found.problems,
            "notes": found.notes,
        }))?;
    } else {
        for p in &found.problems {
            out.line(format!("problem: {p}"))?;
        }
        for n in &found.notes {
            out.line(format!("note: {n}"))?;
        }
        if ok {
            out.line(format!(
                "ok: {} entries, {} journal records, checksums and fingerprints verified",
                found.data.len(),
                found.journal.records
            ))?;
        } else {
            out.line(format!(
                "{} problems in {}",
                found.problems.len(),
                found.path.display()
            ))?;
        }
    }
    Ok(if ok { exit::OK } else { exit::PROBLEMS })
}

fn export(path: &Path, output: &Path, out: &mut Out) -> anyhow::Result<u8> {
    let found = read_inspection(path)?;
    if !found.problems.is_empty() {
        eprintln!(
            "tunecache: warning: exporting what is readable; `tunecache verify` lists {} problems",
            found.problems.len()
        );
    }
    let lines = cache_format::json::to_lines(&found.data);
    if output == Path::new("-") {
        for line in lines.lines() {
            out.line(line)?;
        }
    } else {
        std::fs::write(output, lines)
            .with_context(|| format!("cannot write {}", output.display()))?;
        eprintln!(
            "tunecache: exported {} entries to {}",
            found.data.len(),
            output.display()
        );
    }
    Ok(exit::OK)
}

fn import(
    path: &Path,
    app: &str,
    schema: u32,
    input: &Path,
    as_json: bool,
    out: &mut Out,
) -> anyhow::Result<u8> {
    let (text, source) = if input == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("cannot read stdin")?;
        (text, "stdin".to_owned())
    } else {
        let text = std::fs::read_to_string(input)
            .with_context(|| format!("cannot read {}", input.display()))?;
        (text, input.display().to_string())
    };
    let data: CacheData = cache_format::json::parse_lines(
        &text,
        &source,
        cache_format::json::ImportOrigin::MarkImported,
    )?;
    // All or nothing: refuse bad namespace names before anything is queued.
    for (_, ns, _) in data.entries() {
        cache_core::Namespace::new(ns)
            .with_context(|| format!("{source}: nothing was imported"))?;
    }
    let count = data.len();
    let cache = open_for_write(path, app, schema, Scope::default())?;
    let refused = cache.import(data);
    debug_assert!(refused.is_empty(), "names were checked above");
    cache
        .close()
        .with_context(|| format!("the import was not saved to {}", path.display()))?;
    if as_json {
        out.json(&json!({"imported": count, "path": path}))?;
    } else {
        out.line(format!("imported {count} entries into {}", path.display()))?;
    }
    Ok(exit::OK)
}

fn migrate(
    cli: &Cli,
    config: &Config,
    migrations: Option<&Path>,
    backup: bool,
    dry_run: bool,
    lock_timeout: f64,
    out: &mut Out,
) -> anyhow::Result<u8> {
    let from_file = migrations
        .map(|f| -> anyhow::Result<Migrations> {
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("cannot read {}", f.display()))?;
            Migrations::from_json(&text).with_context(|| format!("{}", f.display()))
        })
        .transpose()?;
    let app = cli
        .app
        .clone()
        .or_else(|| from_file.as_ref().map(|r| r.app().to_owned()))
        .unwrap_or_else(|| config.default_app.clone());
    let path = cache_path(cli, &app)?;
    let file_app = peek_app(&path).unwrap_or(app);
    let registry = match from_file {
        Some(r) => r,
        None => config
            .registries
            .iter()
            .find(|r| r.app() == file_app)
            .cloned()
            .with_context(|| {
                format!(
                    "no migration registry for application {file_app:?}: pass --migrations FILE"
                )
            })?,
    };
    let options = cache_core::MigrateOptions {
        backup,
        dry_run,
        lock_timeout: Duration::from_secs_f64(lock_timeout),
        limits: Limits::default(),
    };
    let started = std::time::Instant::now();
    let outcome = cache_core::migrate_file(&path, &registry, &options)?;
    let took = started.elapsed();
    match outcome {
        cache_core::MigrateOutcome::Missing => {
            emit(
                out,
                cli.json,
                json!({"path": path, "outcome": "missing"}),
                &format!("no cache file at {}; nothing to migrate", path.display()),
            )?;
        }
        cache_core::MigrateOutcome::Current { entries } => {
            emit(
                out,
                cli.json,
                json!({"path": path, "outcome": "current", "schema": registry.current(), "entries": entries}),
                &format!(
                    "{} is already at schema {} ({entries} entries); nothing to do",
                    path.display(),
                    registry.current()
                ),
            )?;
        }
        cache_core::MigrateOutcome::Migrated {
            report,
            written,
            backups,
            entries,
        } => {
            if cli.json {
                out.json(&json!({
                    "path": path,
                    "outcome": if written { "migrated" } else { "dry-run" },
                    "app": report.app,
                    "from": report.from,
                    "to": report.to,
                    "entries": entries,
                    "steps": report.steps.iter().map(|s| json!({"from": s.from, "to": s.to, "description": s.description, "lines": s.lines()})).collect::<Vec<_>>(),
                    "collisions": report.collisions.iter().map(ToString::to_string).collect::<Vec<_>>(),
                    "backups": backups,
                    "seconds": took.as_secs_f64(),
                }))?;
            } else {
                if !written {
                    out.line(format!(
                        "plan for {} (schema {} → {}):",
                        path.display(),
                        report.from,
                        report.to
                    ))?;
                    for step in registry.path(report.from).unwrap_or_default() {
                        out.line(step)?;
                    }
                }
                out.line(report.to_string())?;
                if written {
                    out.line(format!(
                        "wrote {} ({entries} entries) in {:.3} s",
                        path.display(),
                        took.as_secs_f64()
                    ))?;
                    for b in &backups {
                        out.line(format!("backup: {}", b.display()))?;
                    }
                } else {
                    out.line("dry run: nothing was written")?;
                }
            }
        }
    }
    Ok(exit::OK)
}

/// The application named in a cache file's header, read from its first bytes only.
fn peek_app(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut prefix = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(128 << 10)
        .read_to_end(&mut prefix)
        .ok()?;
    cache_format::peek_header(&prefix, &Limits::default())
        .ok()
        .map(|(_, h)| h.app)
}

fn emit(out: &mut Out, as_json: bool, value: serde_json::Value, text: &str) -> anyhow::Result<()> {
    if as_json {
        out.json(&value)
    } else {
        out.line(text)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn timestamps_render_as_utc_dates() {
        assert_eq!(super::fmt_time(0), "1970-01-01 00:00:00Z");
        assert_eq!(super::fmt_time(951_782_400_000), "2000-02-29 00:00:00Z");
        assert_eq!(super::fmt_time(1_795_331_542_894), "2026-11-22 07:12:22Z");
    }
}
