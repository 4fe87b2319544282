//! Writing to stdout without panicking when the reader goes away (`tunecache list | head`).

use std::io::{self, BufWriter, Stdout, Write};

use serde::Serialize;

/// Raised when stdout is closed: the command stops quietly with success.
#[derive(Debug)]
pub(crate) struct ClosedPipe;

impl std::fmt::Display for ClosedPipe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stdout was closed")
    }
}

impl std::error::Error for ClosedPipe {}

/// Buffered stdout whose errors are mapped: a closed pipe becomes [`ClosedPipe`].
pub(crate) struct Out {
    inner: BufWriter<Stdout>,
}

impl Out {
    pub(crate) fn new() -> Self {
        Out {
            inner: BufWriter::new(io::stdout()),
        }
    }

    pub(crate) fn line(&mut self, text: impl std::fmt::Display) -> anyhow::Result<()> {
        writeln!(self.inner, "{text}").map_err(map)
    }

    /// One JSON document on one line (JSON lines).
    pub(crate) fn json_line(&mut self, value: &impl Serialize) -> anyhow::Result<()> {
        serde_json::to_writer(&mut self.inner, value).map_err(json_error)?;
        self.line("")
    }

    /// One JSON document, indented.
    pub(crate) fn json_pretty(&mut self, value: &impl Serialize) -> anyhow::Result<()> {
        serde_json::to_writer_pretty(&mut self.inner, value).map_err(json_error)?;
        self.line("")
    }

    /// A command's report: as one indented JSON document with `--json`, else as text.
    pub(crate) fn report(&mut self, report: &impl Report, json: bool) -> anyhow::Result<()> {
        if json {
            self.json_pretty(report)
        } else {
            report.text(self)
        }
    }

    /// One item of a stream of reports (an entry of a listing, an outcome): one JSON line
    /// with `--json`, else its text.
    pub(crate) fn item(&mut self, report: &impl Report, json: bool) -> anyhow::Result<()> {
        if json {
            self.json_line(report)
        } else {
            report.text(self)
        }
    }

    pub(crate) fn finish(mut self) -> anyhow::Result<()> {
        self.inner.flush().map_err(map)
    }
}

/// What a command found or did, as a value: rendered as JSON with `--json` (its `Serialize`
/// shape) or as text for a person. Every command's output goes through one, so `--json` works
/// for every verb.
pub(crate) trait Report: Serialize {
    /// Writes the text form.
    fn text(&self, out: &mut Out) -> anyhow::Result<()>;
}

fn json_error(e: serde_json::Error) -> anyhow::Error {
    match e.io_error_kind() {
        Some(_) => map(e.into()),
        None => anyhow::Error::new(e).context("cannot encode JSON"),
    }
}

fn map(e: io::Error) -> anyhow::Error {
    if e.kind() == io::ErrorKind::BrokenPipe {
        anyhow::Error::new(ClosedPipe)
    } else {
        anyhow::Error::new(e).context("cannot write to stdout")
    }
}
