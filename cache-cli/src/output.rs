//! Writing to stdout without panicking when the reader goes away (`tunecache list | head`).

use std::io::{self, BufWriter, Stdout, Write};

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

    pub(crate) fn json(&mut self, value: &serde_json::Value) -> anyhow::Result<()> {
        serde_json::to_writer(&mut self.inner, value).map_err(|e| map(e.into()))?;
        self.line("")
    }

    pub(crate) fn json_pretty(&mut self, value: &serde_json::Value) -> anyhow::Result<()> {
        serde_json::to_writer_pretty(&mut self.inner, value).map_err(|e| map(e.into()))?;
        self.line("")
    }

    pub(crate) fn finish(mut self) -> anyhow::Result<()> {
        self.inner.flush().map_err(map)
    }
}

fn map(e: io::Error) -> anyhow::Error {
    if e.kind() == io::ErrorKind::BrokenPipe {
        anyhow::Error::new(ClosedPipe)
    } else {
        anyhow::Error::new(e).context("cannot write to stdout")
    }
}
