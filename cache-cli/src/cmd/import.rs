//! `tunecache import`: merges entries from JSON lines, all lines or none.

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::Args;
use serde::Serialize;

use cache_core::cache_migrate::Migrations;
use cache_core::{AppendOptions, Namespace, merge_into_file};
use cache_format::json::{ImportOrigin, Version, read_lines_versioned};
use cache_format::{CacheData, FormatVersion, Limits};

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
    /// Passes the lines of one application and schema through the version gate of the cache
    /// they go into: lines of its schema (or that say none) as they are, older ones migrated,
    /// another application's or a newer schema refused (and so the whole import).
    fn gate(
        &self,
        ctx: &Context<'_>,
        source: &str,
        version: Version,
        group: CacheData,
        app: &str,
        schema: u32,
    ) -> anyhow::Result<CacheData> {
        let Some((line_app, line_schema)) = version else {
            return Ok(group);
        };
        if line_app != app {
            bail!(
                "{source}: its lines are entries of application {line_app:?}, the cache is {app:?}; nothing was imported"
            );
        }
        if line_schema == schema {
            return Ok(group);
        }
        if line_schema > schema {
            bail!(
                "{source}: its lines are at schema {line_schema}, newer than the cache's {schema}; nothing was imported (migrate the cache first)"
            );
        }
        let registry = match &self.migrations {
            Some(file) => ctx.migration_file(file)?,
            None => ctx.registry(app).cloned().with_context(|| {
                format!(
                    "{source}: its lines are at schema {line_schema}, the cache at {schema}; pass --migrations FILE to migrate them (nothing was imported)"
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
        let payload = cache_format::encode_payload(&group);
        let up = cache_migrate::upgrade(
            &registry,
            FormatVersion::CURRENT,
            &line_app,
            line_schema,
            &payload,
            &Limits::default(),
        )
        .with_context(|| format!("{source}: nothing was imported"))?;
        Ok(up.data)
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
        // Line by line: the text (larger than the cache it makes) is never all in memory.
        let (input, source) = self.open()?;
        let groups = read_lines_versioned(input, &source, ImportOrigin::MarkImported)?;
        let (app, schema) = ctx.write_target(&path, self.schema)?;
        let mut data = CacheData::new();
        for (version, group) in groups {
            let group = self.gate(ctx, &source, version, group, &app, schema)?;
            if data.is_empty() {
                // The usual case, one group: take it whole rather than entry by entry.
                data = group;
            } else {
                data.merge(group);
            }
        }
        // All or nothing: refuse bad namespace names, and entries no reader would accept,
        // before anything is queued.
        for (scope, ns, entry) in data.entries() {
            Namespace::new(ns).with_context(|| format!("{source}: nothing was imported"))?;
            cache_core::check_entry(scope, ns, entry, &Limits::default()).map_err(|why| {
                anyhow::anyhow!(
                    "{source}: the entry {} of namespace {ns:?} could not be read back ({why}); nothing was imported",
                    entry.key()
                )
            })?;
        }
        // One read of the cache and one write, under the lock: no Cache, no second copy of
        // everything in a memory tier and a save queue.
        let what = format!("the import of {} entries", data.len());
        let options = AppendOptions {
            lock_timeout: self.wait.wait,
            ..AppendOptions::default()
        };
        let registry = Migrations::new(app, schema);
        // Kept for the shared tier only when there is one to publish to.
        let to_publish = (std::env::var_os(cache_remote::ENV_REMOTE).is_some()
            && crate::shared::writable(&registry))
        .then(|| data.clone());
        let imported = saving(&what, &path, || {
            merge_into_file(&path, &registry, data, &options)
        })
        .with_context(|| format!("{what} was not saved to {}", path.display()))?;
        if let Some(data) = to_publish {
            crate::shared::publish(&registry, &data)?;
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
