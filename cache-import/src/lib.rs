//! Importers of other tools' tuning caches into tunecache entries, and the vLLM exporter.
//!
//! Each importer reads one format (IMPORTS.md has every mapping: namespace, key fields,
//! candidates, timings, scope) and hands each entry to a sink as it reads, so the caller
//! holds entries the way it wants (the CLI: encoded, as `tunecache import` does). An import
//! is all or nothing: the first problem is an [`ImportSourceError`] naming the file and the
//! line, and the caller keeps nothing of what the sink saw. Entries are deterministic: a
//! result's time is the source file's modification time, so importing the same files twice
//! gives the same entries and changes nothing.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::fmt;
use std::path::{Path, PathBuf};

use cache_core::ImportLines;
use cache_core::Spill;
use cache_core::cache_format::{Entry, Fields, Scope};

mod autoheuristic;
mod files;
mod kernel_tuner;
mod names;
mod textproto;
mod tree;
mod triton;
mod tunableop;
pub mod vllm;
mod xla;

pub use files::MAX_SOURCE_BYTES;
pub use triton::triton_entry;

/// A format tunecache imports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// vLLM's tuned-config directories (`E=8,N=14336,device_name=....json`).
    Vllm,
    /// SGLang's tuned-config directories (the same files, in `triton_<version>` folders).
    Sglang,
    /// Triton's cache directories (`<hash>/<fn>.autotune.json`).
    Triton,
    /// PyTorch TunableOp's result files (`tunableop_results*.csv`).
    TunableOp,
    /// Kernel Tuner's cache files (JSON).
    KernelTuner,
    /// XLA's autotune results (text protos, `--xla_gpu_dump_autotune_results_to`).
    Xla,
    /// PyTorch Inductor's AutoHeuristic collection files (every candidate's time per problem).
    AutoHeuristic,
}

impl Format {
    /// Every format, in the order the CLI lists them.
    pub const ALL: [Format; 7] = [
        Format::Vllm,
        Format::Sglang,
        Format::Triton,
        Format::TunableOp,
        Format::KernelTuner,
        Format::Xla,
        Format::AutoHeuristic,
    ];

    /// The name the CLI and Python take (`vllm`, `sglang`, `triton`, `tunableop`,
    /// `kernel-tuner`, `xla`, `autoheuristic`).
    pub fn name(self) -> &'static str {
        match self {
            Format::Vllm => "vllm",
            Format::Sglang => "sglang",
            Format::Triton => "triton",
            Format::TunableOp => "tunableop",
            Format::KernelTuner => "kernel-tuner",
            Format::Xla => "xla",
            Format::AutoHeuristic => "autoheuristic",
        }
    }

    /// The format of a name (also `kernel_tuner`).
    pub fn from_name(name: &str) -> Option<Format> {
        let name = name.to_ascii_lowercase().replace('_', "-");
        Format::ALL.into_iter().find(|f| f.name() == name)
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How an import maps what its source does not say.
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// Fields added to every entry's scope (a field the source gives keeps the source's
    /// value). Formats whose files say nothing of the device (Triton) need this to be found
    /// by a cache of a given scope.
    pub scope: Fields,
    /// The namespace, where the format's default does not fit (vLLM: `vllm/fused_moe`).
    pub namespace: Option<String>,
    /// Where entries past the memory bound spill to a file (the folder of the cache they go
    /// into); `None`: the system's temporary folder.
    pub spill_dir: Option<std::path::PathBuf>,
}

/// Why an import took nothing: the file, the line when one is to blame, and what is wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}{}: {what}; nothing was imported", .file.display(), .line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct ImportSourceError {
    /// The file (or directory) at fault.
    pub file: PathBuf,
    /// Its line, 1-based.
    pub line: Option<usize>,
    /// What is wrong.
    pub what: String,
}

impl ImportSourceError {
    pub(crate) fn at(file: &Path, line: usize, what: impl Into<String>) -> Self {
        ImportSourceError {
            file: file.to_owned(),
            line: Some(line),
            what: what.into(),
        }
    }

    pub(crate) fn whole(file: &Path, what: impl Into<String>) -> Self {
        ImportSourceError {
            file: file.to_owned(),
            line: None,
            what: what.into(),
        }
    }
}

/// What an import read, besides its entries.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ImportSummary {
    /// Files read.
    pub files: usize,
    /// Entries handed to the sink.
    pub entries: usize,
    /// What the source could not say and how it was filled (said once each).
    pub notes: Vec<String>,
}

impl ImportSummary {
    pub(crate) fn note(&mut self, note: impl Into<String>) {
        let note = note.into();
        if !self.notes.contains(&note) {
            self.notes.push(note);
        }
    }
}

/// Where entries go as they are read.
pub type Sink<'a> = dyn FnMut(&Scope, &str, Entry) + 'a;

/// Reads `path` (a file or a directory, as the format has them) as `format`, handing every
/// entry to `sink`. On an error the sink may have seen some entries: the caller drops them.
pub fn import(
    format: Format,
    path: &Path,
    options: &ImportOptions,
    sink: &mut Sink<'_>,
) -> Result<ImportSummary, ImportSourceError> {
    let mut summary = ImportSummary::default();
    let mut counted = |scope: &Scope, ns: &str, entry: Entry| {
        summary.entries += 1;
        sink(scope, ns, entry);
    };
    let mut notes = ImportSummary::default();
    let files = match format {
        Format::Vllm | Format::Sglang => {
            vllm::import(format, path, options, &mut counted, &mut notes)?
        }
        Format::Triton => triton::import(path, options, &mut counted, &mut notes)?,
        Format::TunableOp => tunableop::import(path, options, &mut counted, &mut notes)?,
        Format::KernelTuner => kernel_tuner::import(path, options, &mut counted, &mut notes)?,
        Format::Xla => xla::import(path, options, &mut counted, &mut notes)?,
        Format::AutoHeuristic => autoheuristic::import(path, options, &mut counted, &mut notes)?,
    };
    summary.files = files;
    summary.notes = notes.notes;
    Ok(summary)
}

/// Reads `path` as `format` into entries held encoded (a [`Spill`]: in memory while small, in
/// an unnamed file beside the cache past that, as JSON lines are held), timestamps from the future set to the present, ready for the
/// same version gate and checks as JSON lines ([`ImportLines::into_entries`]).
pub fn read_entries(
    format: Format,
    path: &Path,
    options: &ImportOptions,
) -> Result<(ImportLines, ImportSummary), ImportSourceError> {
    let now = cache_core::cache_format::now_millis();
    let mut entries = match &options.spill_dir {
        Some(dir) => Spill::new(dir),
        None => Spill::in_temp(),
    };
    let mut unreadable = None;
    let mut refused: Option<ImportSourceError> = None;
    let limits = cache_core::cache_format::Limits::default();
    let summary = import(format, path, options, &mut |scope, ns, mut entry| {
        if refused.is_some() {
            return;
        }
        // Checked here, where the file it came from is known, so a refusal names it (the
        // cache's own checks after the version gate would name only what was imported).
        if let Some(why) = refusal(scope, ns, &entry, &limits) {
            refused = Some(ImportSourceError::whole(
                &source_file(path, &entry),
                format!(
                    "the entry {} of namespace {ns:?} is refused: {why}",
                    entry.key()
                ),
            ));
            return;
        }
        entry.clamp_future(now);
        if let Err(e) = entries.merge(scope, ns, entry) {
            unreadable.get_or_insert(e);
        }
    })?;
    if let Some(e) = refused {
        return Err(e);
    }
    if let Some(e) = unreadable {
        return Err(ImportSourceError::whole(
            path,
            format!("an entry could not be held ({e})"),
        ));
    }
    let source = path.display().to_string();
    Ok((ImportLines::from_entries(&source, entries), summary))
}

/// Why a reader would not take `entry` of namespace `ns` in `scope` (the namespace's name, or
/// the entry's checks), if it would not.
fn refusal(
    scope: &Scope,
    ns: &str,
    entry: &cache_core::cache_format::Entry,
    limits: &cache_core::cache_format::Limits,
) -> Option<String> {
    if let Err(e) = cache_core::Namespace::new(ns) {
        return Some(e.to_string());
    }
    cache_core::check_entry(scope, ns, entry, limits)
        .err()
        .map(|r| r.to_string())
}

/// The file an imported entry came from: its origin says `<format> <path under the source>`
/// (every importer writes it so); the source itself where it does not.
fn source_file(root: &Path, entry: &cache_core::cache_format::Entry) -> PathBuf {
    match entry.origin() {
        cache_core::cache_format::Origin::Imported(text) => match text.split_once(' ') {
            Some((_, rel)) if !rel.is_empty() && root.is_dir() => root.join(rel),
            _ => root.to_owned(),
        },
        _ => root.to_owned(),
    }
}

/// `scope` with the options' fields added where the source gave none.
pub(crate) fn scope_with(mut fields: Fields, options: &ImportOptions) -> Scope {
    for (k, v) in options.scope.iter() {
        if fields.get(k).is_none() {
            fields.insert(k.clone(), v.clone());
        }
    }
    Scope::new(fields)
}
