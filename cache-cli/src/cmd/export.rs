//! `tunecache export`: every entry as JSON lines, to stdout or a file.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use serde::Serialize;

use crate::context::Context;
use crate::exit;
use crate::output::{Out, Report, say};

/// The arguments of `tunecache export`.
#[derive(Debug, Args)]
pub(crate) struct ExportArgs {
    /// Output file ("-" for stdout)
    #[arg(long, short = 'o', default_value = "-")]
    output: PathBuf,
}

/// What an export to a file reports (an export to stdout is the JSON lines themselves).
#[derive(Debug, Serialize)]
struct ExportReport {
    exported: usize,
    path: PathBuf,
    output: PathBuf,
    problems: usize,
}

impl ExportArgs {
    pub(crate) fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        let found = ctx.inspect(&ctx.path()?)?;
        if !found.problems.is_empty() {
            say(format_args!(
                "warning: exporting what is readable; `tunecache verify` lists {} problems",
                found.problems.len()
            ));
        }
        // Each line says the application and schema it is written in (as stored), so an
        // import elsewhere can pass it through the version gate.
        let version = found
            .snapshot
            .header
            .as_ref()
            .map(|h| (h.app.clone(), h.schema))
            .or_else(|| {
                found
                    .journal
                    .header
                    .as_ref()
                    .map(|h| (h.app.clone(), h.schema))
            });
        let lines = match &version {
            Some((app, schema)) => {
                cache_format::json::to_lines_versioned(&found.data, app, *schema)
            }
            None => cache_format::json::to_lines(&found.data),
        };
        if self.output.as_os_str() == "-" {
            for line in lines.lines() {
                if out.closed() {
                    break;
                }
                out.line(line)?;
            }
            return Ok(exit::OK);
        }
        std::fs::write(&self.output, lines)
            .with_context(|| format!("cannot write {}", self.output.display()))?;
        let report = ExportReport {
            exported: found.data.len(),
            path: found.path,
            output: self.output,
            problems: found.problems.len(),
        };
        out.item(&report, ctx.json)?;
        Ok(exit::OK)
    }
}

impl Report for ExportReport {
    fn text(&self, _out: &mut Out) -> anyhow::Result<()> {
        // The data went to the file; the summary goes to stderr, as before, so stdout stays
        // empty for scripts.
        say(format_args!(
            "exported {} entries to {}",
            self.exported,
            self.output.display()
        ));
        Ok(())
    }
}
