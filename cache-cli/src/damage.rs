//! What a walk over a whole cache could not read, said the one way every command says it: a
//! line on stderr per damaged block or entry (and what it cost each namespace), then what the
//! command does about it. A command that promises a complete result (`merge`, `bundle create`,
//! `generation snapshot`) writes nothing unless asked with `--allow-damaged`; one that shows
//! what it read (`export`, `list`, `diff`) exits 3 after showing it.

use crate::output::say;

/// The damage a walk found: the inspection's own problems (a damaged journal record, an
/// unreadable file) and the walk's, each said once.
#[derive(Debug, Default)]
pub(crate) struct Damage {
    lines: Vec<String>,
}

impl Damage {
    /// The problems of `lists`, in order, each line once.
    pub(crate) fn of<'a>(lists: impl IntoIterator<Item = &'a [String]>) -> Damage {
        let mut lines: Vec<String> = Vec::new();
        for list in lists {
            for line in list {
                if !lines.contains(line) {
                    lines.push(line.clone());
                }
            }
        }
        Damage { lines }
    }

    /// Whether nothing was lost.
    pub(crate) fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// How many lines.
    pub(crate) fn len(&self) -> usize {
        self.lines.len()
    }

    /// The lines.
    pub(crate) fn lines(&self) -> &[String] {
        &self.lines
    }

    /// Says every line on stderr, then `then` (what the command did about it).
    pub(crate) fn say(&self, then: impl std::fmt::Display) {
        if self.is_empty() {
            return;
        }
        for line in &self.lines {
            say(format_args!("damaged: {line}"));
        }
        say(then);
    }

    /// For a command that writes a complete result (`what`, e.g. "the merge"): with damage
    /// and without `allowed`, says it and that nothing was written, and gives the exit code;
    /// with `allowed`, says what is missing and lets the command go on.
    pub(crate) fn refuse(&self, what: &str, allowed: bool) -> Option<u8> {
        if self.is_empty() {
            return None;
        }
        if allowed {
            self.say(format_args!(
                "{what} was written without what could not be read (--allow-damaged)"
            ));
            return None;
        }
        self.say(format_args!(
            "{what} was not written: it would lack what could not be read (`tunecache verify` \
             lists it; --allow-damaged writes what was read)"
        ));
        Some(crate::exit::PROBLEMS)
    }
}
