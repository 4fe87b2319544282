//! `tunecache import`: merges entries from JSON lines, all lines or none.

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::Args;
use serde::Serialize;

use cache_core::cache_migrate::Migrations;

use cache_core::{AppendOptions, ImportLines, merge_built_into_file, merge_into_file};
use cache_format::Limits;
use cache_format::json::ImportOrigin;

use crate::context::{Context, saving};
use crate::exit;
use crate::options::WaitArgs;
use crate::output::{Out, Report};

/// The arguments of `tunecache import`.
#[derive(Debug, Args)]
pub(crate) struct ImportArgs {
    /// Input file ("-" for stdin)
    #[arg(default_value = "-")]
    input: PathBuf,
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
    path: PathBuf,
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

    /// The input, read a line at a time, and its name for messages.
    fn open(&self) -> anyhow::Result<(Box<dyn std::io::BufRead>, String)> {
        if self.input.as_os_str() == "-" {
            return Ok((Box::new(std::io::stdin().lock()), "stdin".to_owned()));
        }
        let file = std::fs::File::open(&self.input)
            .with_context(|| format!("cannot read {}", self.input.display()))?;
        Ok((
            Box::new(std::io::BufReader::with_capacity(1 << 16, file)),
            self.input.display().to_string(),
        ))
    }

    pub(crate) fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        let path = ctx.path()?;
        ctx.check_writable("import")?;
        // Line by line: the text (larger than the cache it makes) is never all in memory, and
        // each entry is held as its encoded bytes (a builder per version the lines say), not
        // as the model, which is about twice the size.
        let (input, source) = self.open()?;
        let lines = ImportLines::read(input, &source, ImportOrigin::MarkImported)?;
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
        let to_publish =
            std::env::var_os(cache_remote::ENV_REMOTE).is_some() && crate::shared::writable();
        let (imported, published) = if to_publish {
            let model = data.into_data()?;
            let imported = saving(&what, &path, || {
                merge_into_file(&path, &registry, model.clone(), &options)
            });
            (imported, Some(model))
        } else {
            let imported = saving(&what, &path, || {
                merge_built_into_file(&path, &registry, data, &options)
            });
            (imported, None)
        };
        let imported =
            imported.with_context(|| format!("{what} was not saved to {}", path.display()))?;
        if let Some(model) = published {
            crate::shared::publish(&registry, &model)?;
        }
        let report = ImportReport { imported, path };
        out.item(&report, ctx.json)?;
        Ok(exit::OK)
    }
}

impl Report for ImportReport {
    fn text(&self, out: &mut Out) -> anyhow::Result<()> {
        out.line(format!(
            "imported {} entries into {}",
            self.imported,
            self.path.display()
        ))
    }
}
