//! Where the CLI writes: stdout through [`Out`], which survives a reader that goes away
//! (`tunecache list | head`) without changing the command's exit code, and stderr through
//! [`say`], which never panics when stderr cannot be written (a full disk, `2>/dev/full`).

use std::io::{self, BufWriter, Stdout, Write};

use serde::Serialize;

/// Buffered stdout. Once the reader has gone away, further output is dropped and
/// [`Out::closed`] says so; the command still finishes and returns its own exit code.
pub(crate) struct Out {
    inner: BufWriter<Stdout>,
    closed: bool,
}

impl Out {
    pub(crate) fn new() -> Self {
        Out {
            inner: BufWriter::new(io::stdout()),
            closed: false,
        }
    }

    /// Whether stdout's reader has gone away (long listings stop early).
    pub(crate) fn closed(&self) -> bool {
        self.closed
    }

    /// One line of text. Control characters in it (escape sequences, carriage returns, line
    /// breaks that would fake another line) are written escaped, as `\u{1b}`: names, keys
    /// and failure reasons come from files anyone may have written.
    pub(crate) fn line(&mut self, text: impl std::fmt::Display) -> anyhow::Result<()> {
        let text = text.to_string();
        self.raw(&escape_controls(&text))
    }

    /// Text of several lines that this program wrote (a migration plan, a report): each line
    /// is written as by [`Out::line`].
    pub(crate) fn lines(&mut self, text: impl std::fmt::Display) -> anyhow::Result<()> {
        for line in text.to_string().lines() {
            self.line(line)?;
        }
        Ok(())
    }

    /// Text this program generated whole (a completion script), written as it is.
    pub(crate) fn generated(&mut self, text: &str) -> anyhow::Result<()> {
        self.raw(text.strip_suffix('\n').unwrap_or(text))
    }

    /// One JSON document on one line (JSON lines), with every character a terminal would act
    /// on written as a JSON escape (`cache_format::json::terminal_safe`): valid JSON, safe to
    /// print.
    pub(crate) fn json_line(&mut self, value: &impl Serialize) -> anyhow::Result<()> {
        let text = serde_json::to_string(value).map_err(json_error)?;
        self.raw(&cache_format::json::terminal_safe(text))
    }

    /// A JSON line already made terminal-safe (`cache_format::json::line`), as it is.
    pub(crate) fn json_text(&mut self, text: &str) -> anyhow::Result<()> {
        self.raw(text)
    }

    /// One JSON document, indented (terminal-safe as [`Out::json_line`]).
    pub(crate) fn json_pretty(&mut self, value: &impl Serialize) -> anyhow::Result<()> {
        let text = serde_json::to_string_pretty(value).map_err(json_error)?;
        self.raw(&cache_format::json::terminal_safe(text))
    }

    fn raw(&mut self, text: &str) -> anyhow::Result<()> {
        if self.closed {
            return Ok(());
        }
        let result = writeln!(self.inner, "{text}");
        self.settle(result)
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

    /// Flushes what is buffered.
    pub(crate) fn finish(mut self) -> anyhow::Result<()> {
        let result = self.inner.flush();
        self.settle(result)
    }

    /// A closed pipe ends the output, not the command; any other error is an error.
    fn settle(&mut self, result: io::Result<()>) -> anyhow::Result<()> {
        match result {
            Ok(()) => Ok(()),
            Err(_) if self.closed => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            Err(e) => Err(anyhow::Error::new(e).context("cannot write to stdout")),
        }
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
    anyhow::Error::new(e).context("cannot encode JSON")
}

/// `text` with every control character, and every character that reorders text on a
/// terminal (bidirectional overrides and isolates), replaced by its `\u{..}` escape.
pub(crate) fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char =
        |c: char| c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Writes one line to stderr, prefixed `tunecache: `, its control characters escaped. A stderr that cannot be written (full
/// disk, closed) loses the line; it never panics or changes the exit code.
pub(crate) fn say(text: impl std::fmt::Display) {
    let text = text.to_string();
    let _ = writeln!(io::stderr().lock(), "tunecache: {}", escape_controls(&text));
}

#[cfg(test)]
mod tests {
    use super::escape_controls;

    #[test]
    fn control_characters_are_escaped_and_the_rest_is_left_alone() {
        assert_eq!(
            escape_controls("tiled {\"tile\":32} █ µs"),
            "tiled {\"tile\":32} █ µs"
        );
        assert_eq!(escape_controls("a\u{1b}[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(escape_controls("x\nproblem: fake"), "x\\u{a}problem: fake");
        assert_eq!(
            escape_controls("\r\t\u{7f}\u{9b}"),
            "\\u{d}\\u{9}\\u{7f}\\u{9b}"
        );
        assert_eq!(escape_controls("evil\u{202e}txt"), "evil\\u{202e}txt");
    }
}
