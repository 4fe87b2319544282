//! Golden files: for every historical schema of every application under `golden/`, a
//! committed input (history: created once, never regenerated) and the expected output of
//! migrating it to the current schema, compared byte for byte.
//!
//! Layout, per application `golden/<app>/`:
//! - `migrations.json`: the application's registry (the migration file the CLI takes);
//! - `source/v<N>.jsonl`: the readable source an input was made from;
//! - `inputs/v<N>.tcache`: the input, a cache file at schema N;
//! - `expected/v<N>.tcache`: `inputs/v<N>.tcache` migrated to the current schema.
//!
//! `--check` (the default, also run by `cargo test`) migrates every input through
//! `cache_core::migrate_file` (the library's own path) and compares; it also checks that
//! every committed file decodes and re-encodes to the same bytes. `--bless` rewrites the
//! expected outputs only. `--new-input APP N` makes `inputs/vN.tcache` from its source and
//! refuses to replace an existing input.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use cache_core::{MigrateOptions, MigrateOutcome, migrate_file};
use cache_format::json::{ImportOrigin, parse_lines};
use cache_format::{FormatVersion, Limits, encode_snapshot, read_snapshot};
use cache_migrate::Migrations;

pub(crate) const USAGE: &str = "cargo xtask golden [--check | --bless | --new-input APP VERSION]";

/// One application's golden directory.
pub(crate) struct AppDir {
    pub(crate) name: String,
    pub(crate) dir: PathBuf,
    pub(crate) registry: Migrations,
}

impl AppDir {
    pub(crate) fn input(&self, version: u32) -> PathBuf {
        self.dir.join("inputs").join(format!("v{version}.tcache"))
    }

    fn expected(&self, version: u32) -> PathBuf {
        self.dir.join("expected").join(format!("v{version}.tcache"))
    }

    /// The versions that have a committed input, ascending.
    pub(crate) fn input_versions(&self) -> anyhow::Result<Vec<u32>> {
        versions_in(&self.dir.join("inputs"))
    }
}

fn versions_in(dir: &Path) -> anyhow::Result<Vec<u32>> {
    let mut out = Vec::new();
    if !dir.exists() {
        return Ok(out);
    }
    for entry in fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if let Some(v) = name
            .strip_prefix('v')
            .and_then(|r| r.strip_suffix(".tcache"))
        {
            out.push(
                v.parse()
                    .with_context(|| format!("{}: {name} is not v<N>.tcache", dir.display()))?,
            );
        } else if !name.starts_with('.') {
            bail!(
                "{}: unexpected file {name} (expected v<N>.tcache)",
                dir.display()
            );
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// Every application directory under `golden/` (the `format` directory holds container-format
/// files and has no registry).
pub(crate) fn apps(root: &Path) -> anyhow::Result<Vec<AppDir>> {
    let golden = root.join("golden");
    let mut out = Vec::new();
    for entry in
        fs::read_dir(&golden).with_context(|| format!("cannot list {}", golden.display()))?
    {
        let dir = entry?.path();
        let file = dir.join("migrations.json");
        if !file.exists() {
            continue;
        }
        let text =
            fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
        let registry = Migrations::from_json(&text).with_context(|| file.display().to_string())?;
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if registry.app() != name {
            bail!(
                "{}: the directory is named {name:?} but the file's app is {:?}",
                file.display(),
                registry.app()
            );
        }
        out.push(AppDir {
            name,
            dir,
            registry,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Migrates `input` with the library's own path (in a scratch copy) and returns the bytes
/// the library would leave on disk.
pub(crate) fn migrated_bytes(input: &Path, registry: &Migrations) -> anyhow::Result<Vec<u8>> {
    let scratch = tempfile::tempdir().context("cannot create a scratch directory")?;
    let copy = scratch.path().join("cache.tcache");
    fs::copy(input, &copy).with_context(|| format!("cannot copy {}", input.display()))?;
    let outcome = migrate_file(&copy, registry, &MigrateOptions::default())
        .with_context(|| format!("migrating {}", input.display()))?;
    if let MigrateOutcome::Missing = outcome {
        bail!("{}: vanished during the migration", input.display());
    }
    fs::read(&copy).with_context(|| format!("cannot read the migrated copy of {}", input.display()))
}

/// Where a snapshot's format number is: after the array header (1 byte) and the marker
/// `"tunecache"` (10 bytes).
const FORMAT_BYTE: usize = 11;

/// Checks that `path` decodes and re-encodes to exactly its own bytes.
fn round_trips(path: &Path) -> anyhow::Result<()> {
    let bytes = fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    if cache_format::table::is_table(&bytes) {
        // A table built afresh (its lineage the digest of its entries) is its entries' table.
        let t = cache_format::table::Table::open(bytes.clone(), &Limits::default())
            .with_context(|| path.display().to_string())?;
        let mut data = cache_format::CacheData::new();
        let report = cache_format::table::check_table(&t, |scope, ns, e| {
            data.insert(scope, ns, e);
            std::ops::ControlFlow::Continue(())
        });
        if !report.problems.is_empty() {
            bail!("{}: {}", path.display(), report.problems.join("; "));
        }
        let again = cache_format::table::table_bytes(&t.head().app, t.head().schema, None, &data);
        if again != bytes {
            bail!(
                "{}: reading and writing the table again does not give the same bytes",
                path.display()
            );
        }
        return Ok(());
    }
    let snap =
        read_snapshot(&bytes, &Limits::default()).with_context(|| path.display().to_string())?;
    let data =
        cache_format::raw::decode_snapshot(&snap).with_context(|| path.display().to_string())?;
    let mut again = encode_snapshot(&snap.header.app, snap.header.schema, &data);
    // An older format's file (whose payload has nothing the newer formats added) comes back
    // the same but for the format number, a positive fixint right after the marker
    // (FORMAT.md, "Snapshot file").
    if snap.format != FormatVersion::CURRENT && again.len() > FORMAT_BYTE {
        again[FORMAT_BYTE] = u8::try_from(snap.format.number()).unwrap_or(0);
    }
    if again != bytes {
        bail!(
            "{}: decoding and re-encoding does not give the same bytes",
            path.display()
        );
    }
    Ok(())
}

/// Every problem found, one line each.
pub(crate) fn check(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut problems = Vec::new();
    for app in apps(root)? {
        let inputs = app.input_versions()?;
        if inputs.is_empty() {
            problems.push(format!("{}: no golden inputs", app.name));
        }
        for v in &inputs {
            let input = app.input(*v);
            let expected = app.expected(*v);
            if let Err(e) = round_trips(&input) {
                problems.push(format!("{e:#}"));
            }
            match (migrated_bytes(&input, &app.registry), fs::read(&expected)) {
                (Ok(got), Ok(want)) if got == want => {
                    if let Err(e) = round_trips(&expected) {
                        problems.push(format!("{e:#}"));
                    }
                }
                (Ok(_), Ok(_)) => problems.push(format!(
                    "{}: migrating {} no longer gives these bytes (run `cargo xtask golden --bless` if the change is intended)",
                    expected.display(),
                    input.display()
                )),
                (Ok(_), Err(_)) => problems.push(format!("{}: missing (run `cargo xtask golden --bless`)", expected.display())),
                (Err(e), _) => problems.push(format!("{e:#}")),
            }
        }
        for v in versions_in(&app.dir.join("expected"))? {
            if !inputs.contains(&v) {
                problems.push(format!(
                    "{}: no input for this expected output",
                    app.expected(v).display()
                ));
            }
        }
    }
    // Container-format samples: every committed file of the current format round-trips.
    let format_inputs = root.join("golden").join("format").join("inputs");
    for v in versions_in(&format_inputs)? {
        if let Err(e) = round_trips(&format_inputs.join(format!("v{v}.tcache"))) {
            problems.push(format!("{e:#}"));
        }
    }
    Ok(problems)
}

fn bless(root: &Path) -> anyhow::Result<()> {
    for app in apps(root)? {
        fs::create_dir_all(app.dir.join("expected"))?;
        for v in app.input_versions()? {
            let bytes = migrated_bytes(&app.input(v), &app.registry)?;
            let target = app.expected(v);
            let changed = fs::read(&target).map_or(true, |old| old != bytes);
            fs::write(&target, &bytes)
                .with_context(|| format!("cannot write {}", target.display()))?;
            println!(
                "{} {}",
                if changed { "blessed" } else { "unchanged" },
                target.display()
            );
        }
    }
    Ok(())
}

fn new_input(root: &Path, app: &str, version: &str) -> anyhow::Result<()> {
    let version: u32 = version
        .parse()
        .with_context(|| format!("{version:?} is not a version number"))?;
    let dir = root.join("golden").join(app);
    let source = dir.join("source").join(format!("v{version}.jsonl"));
    let target = dir.join("inputs").join(format!("v{version}.tcache"));
    if target.exists() {
        bail!(
            "{} exists: golden inputs are history and are never regenerated",
            target.display()
        );
    }
    let text =
        fs::read_to_string(&source).with_context(|| format!("cannot read {}", source.display()))?;
    let data = parse_lines(&text, &source.display().to_string(), ImportOrigin::Keep)?;
    fs::create_dir_all(target.parent().expect("inputs/ has a parent"))?;
    // An input is a file as this build writes it: a table (format 4).
    fs::write(
        &target,
        cache_format::table::table_bytes(app, version, None, &data),
    )
    .with_context(|| format!("cannot write {}", target.display()))?;
    println!("created {} ({} entries)", target.display(), data.len());
    Ok(())
}

pub(crate) fn run(root: &Path, args: &[String]) -> anyhow::Result<()> {
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] | ["--check"] => {
            let problems = check(root)?;
            if problems.is_empty() {
                println!("golden files ok");
                Ok(())
            } else {
                bail!("golden files:\n  {}", problems.join("\n  "))
            }
        }
        ["--bless"] => bless(root),
        ["--new-input", app, version] => new_input(root, app, version),
        _ => bail!("usage: {USAGE}"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn golden_files_match() {
        let problems = super::check(&crate::project_root()).expect("golden files readable");
        assert!(problems.is_empty(), "{problems:#?}");
    }
}
