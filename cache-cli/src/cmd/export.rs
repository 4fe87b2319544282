//! `tunecache export`: every entry as JSON lines, to stdout or a file; or, with `--to vllm`,
//! a namespace's winners as vLLM tuned-config files (cache-import).

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use std::ops::ControlFlow;

use clap::Args;
use serde::Serialize;

use cache_core::file::AtomicFile;

use crate::context::Context;
use crate::damage::Damage;
use crate::exit;
use crate::output::{Out, Report, say};
use crate::progress::{Pace, Progress};

/// The arguments of `tunecache export`.
#[derive(Debug, Args)]
pub(crate) struct ExportArgs {
    /// Output file ("-" for stdout); with --to, the directory to write the files in
    #[arg(long, short = 'o', default_value = "-")]
    output: PathBuf,
    /// Write another tool's files instead of JSON lines: vllm or sglang (tuned-config files;
    /// files imported unchanged come back byte for byte)
    #[arg(long, value_name = "FORMAT")]
    to: Option<String>,
    /// With --to: the namespace to export (default: the format's, e.g. vllm/fused_moe)
    #[arg(long, value_name = "NAME", requires = "to")]
    namespace: Option<String>,
}

#[derive(Debug, Serialize)]
struct ConfigsReport {
    namespace: String,
    directory: PathBuf,
    files: usize,
    verbatim: usize,
    unchanged: usize,
}

impl Report for ConfigsReport {
    fn text(&self, out: &mut Out) -> anyhow::Result<()> {
        out.line(format!(
            "wrote {} files of {} to {} ({} byte for byte as imported, {} already there)",
            self.files,
            self.namespace,
            self.directory.display(),
            self.verbatim,
            self.unchanged
        ))
    }
}

/// What an export to a file reports (an export to stdout is the JSON lines themselves).
#[derive(Debug, Serialize)]
struct ExportReport {
    exported: usize,
    /// Entries written, and how fast.
    pace: Pace,
    path: PathBuf,
    output: PathBuf,
    problems: usize,
}

impl ExportArgs {
    /// `--to vllm|sglang`: the namespace's entries and kept files, written as config files.
    fn configs(&self, to: &str, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        let format = match cache_import::Format::from_name(to) {
            Some(f @ (cache_import::Format::Vllm | cache_import::Format::Sglang)) => f,
            _ => bail!(
                "--to {to:?}: tunecache exports vllm or sglang config files (or JSON lines without --to)"
            ),
        };
        if self.output.as_os_str() == "-" {
            bail!("--to {to} writes a directory of files: give it with -o DIR");
        }
        let ns = self
            .namespace
            .clone()
            .unwrap_or_else(|| cache_import::vllm::default_namespace(format).to_owned());
        let files_ns = cache_import::vllm::files_namespace(&ns);
        let found = ctx.inspect(&ctx.path()?)?;
        let mut data = cache_format::CacheData::new();
        found.for_each_entry(|scope, name, entry| {
            if name == ns || name == files_ns {
                data.insert(scope, name, entry.clone());
            }
            ControlFlow::Continue(())
        });
        let done = cache_import::vllm::export(&data, &ns, &self.output)?;
        let report = ConfigsReport {
            namespace: ns,
            directory: self.output.clone(),
            files: done.files,
            verbatim: done.verbatim,
            unchanged: done.unchanged,
        };
        out.item(&report, ctx.json)?;
        Ok(exit::OK)
    }

    pub(crate) fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        if let Some(to) = &self.to {
            return self.configs(to, ctx, out);
        }
        let found = ctx.inspect(&ctx.path()?)?;
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
        let version = version
            .as_ref()
            .map(|(app, schema)| (app.as_str(), *schema));
        // Written as decoded, one entry at a time: memory does not grow with the cache.
        let mut exported = 0usize;
        let mut failed: anyhow::Result<()> = Ok(());
        if self.output.as_os_str() == "-" {
            let walked = found.for_each_entry(|scope, ns, entry| {
                if out.closed() {
                    return ControlFlow::Break(());
                }
                match out.json_text(&cache_format::json::line(scope, ns, entry, version)) {
                    Ok(()) => ControlFlow::Continue(()),
                    Err(e) => {
                        failed = Err(e);
                        ControlFlow::Break(())
                    }
                }
            });
            failed?;
            if out.closed() {
                return Ok(exit::OK);
            }
            return Ok(said(&found.problems, &walked));
        }
        crate::guard::refuse_cache_files(&self.output, &found.path, "the export")?;
        crate::guard::sweep(&self.output);
        // Written beside its name and put in place whole: a killed export leaves no half file
        // that reads like a complete one, and the file it replaces stays until then.
        let mut writer = AtomicFile::create(&self.output, true)
            .with_context(|| format!("cannot write {}", self.output.display()))?;
        let (counts, _) = found.counts();
        let total = super::total(&counts);
        let mut progress = Progress::new("exporting", Some(total as u64), false, ctx.json);
        let walked = found.for_each_entry(|scope, ns, entry| {
            progress.advance(1);
            let line = cache_format::json::line(scope, ns, entry, version);
            match writer.write_all(format!("{line}\n").as_bytes()) {
                Ok(()) => {
                    exported += 1;
                    ControlFlow::Continue(())
                }
                Err(e) => {
                    failed = Err(e.into());
                    ControlFlow::Break(())
                }
            }
        });
        failed
            .and_then(|()| writer.commit().map_err(Into::into))
            .with_context(|| format!("cannot write {}", self.output.display()))?;
        let pace = progress.finish();
        let damage = Damage::of([found.problems.as_slice(), walked.as_slice()]);
        let report = ExportReport {
            exported,
            pace,
            path: found.path.clone(),
            output: self.output,
            problems: damage.len(),
        };
        out.item(&report, ctx.json)?;
        Ok(said(&found.problems, &walked))
    }
}

/// Says what an export could not read, and its exit code: 3 if anything is missing.
fn said(found: &[String], walked: &[String]) -> u8 {
    let damage = Damage::of([found, walked]);
    if damage.is_empty() {
        return exit::OK;
    }
    damage.say(
        "exported what could be read; what the damage above lost is not in the output (records \
         it says were read are)",
    );
    exit::PROBLEMS
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
