//! `tunecache import`: merges entries from JSON lines, or from another tool's cache files
//! (`--from FORMAT`, cache-import), all entries or none.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;

use anyhow::{Context as _, bail};
use clap::Args;
use serde::Serialize;

use cache_core::cache_migrate::Migrations;

use cache_core::{AppendOptions, ImportLines, merge_built_into_file, merge_into_file};
use cache_format::Limits;
use cache_format::json::ImportOrigin;
use cache_import::{Format, ImportOptions};

use crate::context::{Context, saving};
use crate::exit;
use crate::options::WaitArgs;
use crate::output::{Out, Report};
use crate::progress::{self, Counting, Pace, Progress};

/// The input's progress, shared with the reader that counts into it.
type Shared = Rc<RefCell<Progress>>;

/// The arguments of `tunecache import`.
#[derive(Debug, Args)]
pub(crate) struct ImportArgs {
    /// Input file ("-" for stdin); with --from, the tool's file or directory
    #[arg(default_value = "-")]
    input: PathBuf,
    /// Read another tool's cache: vllm, sglang, triton, tunableop, kernel-tuner, xla, autoheuristic
    /// (IMPORTS.md has each mapping)
    #[arg(long, value_name = "FORMAT")]
    from: Option<String>,
    /// With --from: scope fields (a JSON object) added to every entry where the source says
    /// none (Triton's files say nothing of the device)
    #[arg(long, value_name = "JSON", requires = "from")]
    scope: Option<String>,
    /// With --from: the namespace of the entries, where the format's default does not fit
    #[arg(long, value_name = "NAME", requires = "from")]
    namespace: Option<String>,
    /// Schema version of a new file (an existing file keeps its own)
    #[arg(long, default_value_t = 1)]
    schema: u32,
    /// The application's migration file, to migrate lines written at an older schema
    /// (needed unless the tool has the registry built in)
    #[arg(long, value_name = "FILE")]
    migrations: Option<PathBuf>,
    #[command(flatten)]
    wait: WaitArgs,
}

#[derive(Debug, Serialize)]
struct ImportReport {
    imported: usize,
    /// Entries imported, over the whole command's time.
    pace: Pace,
    path: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    files: Option<usize>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    notes: Vec<String>,
}

/// What was read, before the version gate.
struct Read {
    lines: ImportLines,
    source: String,
    files: Option<usize>,
    notes: Vec<String>,
}

impl ImportArgs {
    /// The registry that migrates older lines into a cache of `app` at `schema`: needed only
    /// when some lines are older (`--migrations FILE`, or the one the tool has built in).
    fn registry(
        &self,
        ctx: &Context<'_>,
        lines: &ImportLines,
        source: &str,
        app: &str,
        schema: u32,
    ) -> anyhow::Result<Migrations> {
        if !lines.has_older(app, schema) {
            return Ok(Migrations::new(app, schema));
        }
        let registry = match &self.migrations {
            Some(file) => ctx.migration_file(file)?,
            None => ctx.registry(app).cloned().with_context(|| {
                format!(
                    "{source}: some of its lines are at an older schema than the cache's {schema}; pass --migrations FILE to migrate them (nothing was imported)"
                )
            })?,
        };
        if registry.app() != app || registry.current() != schema {
            bail!(
                "the migrations lead to {} schema {}, but the cache is {app:?} schema {schema}; nothing was imported",
                registry.app(),
                registry.current()
            );
        }
        Ok(registry)
    }

    /// The input, read a line at a time and counted into `progress` (which stops it at
    /// Ctrl-C), and its name for messages.
    fn open(&self, progress: &Shared) -> anyhow::Result<(Box<dyn std::io::BufRead>, String)> {
        if self.input.as_os_str() == "-" {
            let stdin = Counting::new(std::io::stdin().lock(), Rc::clone(progress));
            return Ok((Box::new(stdin), "stdin".to_owned()));
        }
        let file = std::fs::File::open(&self.input)
            .with_context(|| format!("cannot read {}", self.input.display()))?;
        let reader = std::io::BufReader::with_capacity(1 << 16, file);
        Ok((
            Box::new(Counting::new(reader, Rc::clone(progress))),
            self.input.display().to_string(),
        ))
    }

    /// Progress of reading the input: a bar over its bytes when it is a regular file.
    fn progress(&self, json: bool) -> Shared {
        let total = (self.from.is_none() && self.input.as_os_str() != "-")
            .then(|| std::fs::metadata(&self.input).ok())
            .flatten()
            .filter(std::fs::Metadata::is_file)
            .map(|m| m.len());
        Rc::new(RefCell::new(Progress::new("importing", total, true, json)))
    }

    /// JSON lines, line by line: the text (larger than the cache it makes) is never all in
    /// memory, and each entry is held as its encoded bytes (a builder per version the lines
    /// say), not as the model, which is about twice the size. Another tool's files are read
    /// the same way, each entry encoded as the importer hands it over.
    fn read(
        &self,
        spill_dir: &std::path::Path,
        progress: &Shared,
        json: bool,
    ) -> anyhow::Result<Read> {
        let Some(name) = &self.from else {
            let (input, source) = self.open(progress)?;
            let lines =
                ImportLines::read_in(input, &source, ImportOrigin::MarkImported, spill_dir)?;
            return Ok(Read {
                lines,
                source,
                files: None,
                notes: Vec::new(),
            });
        };
        if name.to_ascii_lowercase().replace('_', "-") == "warpconvnet" {
            bail!(
                "--from warpconvnet: WarpConvNet's files are taken in through WarpConvNet's own registered migrations, in Python: `python -m tunecache.integrations.warpconvnet FILE [--cache-file PATH]` or `Cache.import_from(\"warpconvnet\", path)`; nothing was imported"
            );
        }
        let format = Format::from_name(name).with_context(|| {
            let known: Vec<&str> = Format::ALL.iter().map(|f| f.name()).collect();
            format!(
                "--from {name:?}: not a format tunecache imports ({})",
                known.join(", ")
            )
        })?;
        let mut options = ImportOptions {
            namespace: self.namespace.clone(),
            spill_dir: Some(spill_dir.to_owned()),
            ..Default::default()
        };
        if let Some(text) = &self.scope {
            options.scope = crate::render::parse_fields("--scope", text)?;
        }
        let (lines, summary) = progress::during(&format!("reading {name} files"), json, || {
            cache_import::read_entries(format, &self.input, &options)
        })?;
        Ok(Read {
            lines,
            source: self.input.display().to_string(),
            files: Some(summary.files),
            notes: summary.notes,
        })
    }

    pub(crate) fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        let started = std::time::Instant::now();
        let path = ctx.path()?;
        ctx.check_writable("import")?;
        crate::shared::check_publishable()?;
        // Entries past the memory bound spill to a file beside the cache (its disk).
        let spill_dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() && p.is_dir() => p.to_owned(),
            _ => std::env::temp_dir(),
        };
        // Ctrl-C while the input is read stops the import before anything is written.
        crate::interrupt::catch();
        let progress = self.progress(ctx.json);
        let Read {
            lines,
            source,
            files,
            notes,
        } = self.read(&spill_dir, &progress, ctx.json)?;
        drop(progress);
        if crate::interrupt::requested() {
            return Err(crate::interrupt::Interrupted.into());
        }
        for note in &notes {
            crate::output::say(format_args!("note: {note}"));
        }
        let (app, schema) = ctx.write_target(&path, self.schema)?;
        // The one import policy (cache_core::ImportLines): lines at the cache's version as
        // they are, older ones migrated, others refused; all entries checked, or none taken.
        let registry = self.registry(ctx, &lines, &source, &app, schema)?;
        let data = lines.into_entries(&registry, &Limits::default())?;
        // One read of the cache and one write, under the lock: no Cache, no second copy of
        // everything in a memory tier and a save queue.
        let what = format!("the import of {} entries", data.len());
        let options = AppendOptions {
            lock_timeout: self.wait.wait,
            ..AppendOptions::default()
        };
        let registry = Migrations::new(app, schema);
        // The shared tier takes the model: kept only when there is one to publish to.
        let to_publish = crate::settings().get_os(cache_remote::ENV_REMOTE).is_some()
            && crate::shared::writable();
        let writing = format!("writing {}", what.trim_start_matches("the "));
        let (imported, published) = if to_publish {
            let model = data.into_data()?;
            let imported = progress::during(&writing, ctx.json, || {
                saving(&what, &path, || {
                    merge_into_file(&path, &registry, model.clone(), &options)
                })
            });
            (imported, Some(model))
        } else {
            let imported = progress::during(&writing, ctx.json, || {
                saving(&what, &path, || {
                    merge_built_into_file(&path, &registry, data, &options)
                })
            });
            (imported, None)
        };
        let imported =
            imported.with_context(|| format!("{what} was not saved to {}", path.display()))?;
        if let Some(model) = published {
            crate::shared::publish(&registry, &model)?;
        }
        let seconds = started.elapsed().as_secs_f64();
        let report = ImportReport {
            imported,
            pace: Pace {
                done: imported as u64,
                seconds,
                per_second: imported as f64 / seconds.max(1e-9),
            },
            path,
            from: self.from.clone(),
            files,
            notes,
        };
        out.item(&report, ctx.json)?;
        Ok(exit::OK)
    }
}

impl Report for ImportReport {
    fn text(&self, out: &mut Out) -> anyhow::Result<()> {
        match (&self.from, self.files) {
            (Some(from), Some(files)) => out.line(format!(
                "imported {} entries from {files} {from} files into {}",
                self.imported,
                self.path.display()
            )),
            _ => out.line(format!(
                "imported {} entries into {}",
                self.imported,
                self.path.display()
            )),
        }
    }
}
