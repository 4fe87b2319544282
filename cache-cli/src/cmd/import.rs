//! `tunecache import`: merges entries from JSON lines, all lines or none.

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::Args;
use serde::Serialize;

use cache_core::cache_migrate::Migrations;
use std::collections::BTreeMap;

use cache_core::{AppendOptions, Namespace, merge_built_into_file, merge_into_file};
use cache_format::json::{ImportOrigin, Version, read_lines_each};
use cache_format::{CacheData, FormatVersion, Limits, SnapshotBuilder};

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
        // Line by line: the text (larger than the cache it makes) is never all in memory, and
        // each entry is held as its encoded bytes (a builder per version the lines say), not
        // as the model, which is about twice the size.
        let (input, source) = self.open()?;
        let now = cache_format::now_millis();
        let mut groups: BTreeMap<Version, SnapshotBuilder> = BTreeMap::new();
        let mut unreadable = None;
        read_lines_each(
            input,
            &source,
            ImportOrigin::MarkImported,
            |version, scope, ns, mut entry| {
                // Timestamps from the future are set to the present, as every writer does.
                entry.clamp_future(now);
                let group = match groups.get_mut(version) {
                    Some(group) => group,
                    None => groups.entry(version.clone()).or_default(),
                };
                if let Err(e) = group.merge(scope, ns, entry) {
                    unreadable.get_or_insert(e);
                }
            },
        )?;
        if let Some(e) = unreadable {
            bail!("{source}: an entry could not be read back ({e}); nothing was imported");
        }
        let (app, schema) = ctx.write_target(&path, self.schema)?;
        // Lines at the cache's own version (or saying none) are taken as they are; each older
        // group is passed through the version gate, in version order, as a model.
        let mut data: Option<SnapshotBuilder> = None;
        let mut migrated = CacheData::new();
        for (version, group) in groups {
            let current = match &version {
                None => true,
                Some((line_app, line_schema)) => *line_app == app && *line_schema == schema,
            };
            if current {
                data = Some(match data.take() {
                    None => group,
                    Some(mut data) => {
                        group.try_for_each(|scope, ns, entry| data.merge(scope, ns, entry))?;
                        data
                    }
                });
            } else {
                let group = group.into_data()?;
                migrated.merge(self.gate(ctx, &source, version, group, &app, schema)?);
            }
        }
        let mut data = data.unwrap_or_default();
        for (scope, ns, entry) in migrated.entries() {
            data.merge(scope, ns, entry.clone())?;
        }
        // All or nothing: refuse bad namespace names, and entries no reader would accept,
        // before anything is written (the first in the cache's order is named).
        data.try_for_each(|scope, ns, entry| -> anyhow::Result<()> {
            Namespace::new(ns).with_context(|| format!("{source}: nothing was imported"))?;
            cache_core::check_entry(scope, ns, &entry, &Limits::default()).map_err(|why| {
                anyhow::anyhow!(
                    "{source}: the entry {} of namespace {ns:?} could not be read back ({why}); nothing was imported",
                    entry.key()
                )
            })
        })?;
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
