//! `tunecache import`: merges entries from JSON lines, all lines or none.

use std::io::Read;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use serde::Serialize;

use cache_core::Namespace;
use cache_format::json::{ImportOrigin, parse_lines};
use cache_format::{CacheData, Scope};

use crate::context::{Context, close};
use crate::exit;
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
}

#[derive(Debug, Serialize)]
struct ImportReport {
    imported: usize,
    path: PathBuf,
}

impl ImportArgs {
    fn read(&self) -> anyhow::Result<(String, String)> {
        if self.input.as_os_str() == "-" {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("cannot read stdin")?;
            return Ok((text, "stdin".to_owned()));
        }
        let text = std::fs::read_to_string(&self.input)
            .with_context(|| format!("cannot read {}", self.input.display()))?;
        Ok((text, self.input.display().to_string()))
    }

    pub(crate) fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        let path = ctx.path()?;
        ctx.check_writable("import")?;
        let (text, source) = self.read()?;
        let data: CacheData = parse_lines(&text, &source, ImportOrigin::MarkImported)?;
        // All or nothing: refuse bad namespace names before anything is queued.
        for (_, ns, _) in data.entries() {
            Namespace::new(ns).with_context(|| format!("{source}: nothing was imported"))?;
        }
        let imported = data.len();
        let cache = ctx.open_for_write("import", &path, self.schema, Scope::default())?;
        let refused = cache.import(data);
        debug_assert!(refused.is_empty(), "names were checked above");
        close(cache, &format!("the import of {imported} entries"), &path)?;
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
