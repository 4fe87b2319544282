//! Part of `cargo xtask tidy`: every `TUNECACHE_*` name the sources and documents use is one
//! of `cache_core::settings::VARIABLES` (the one table of settings) or of the test harness, so
//! no variable is read, or documented, that the table and `tunecache --help` do not list.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};

/// The files to look in: tracked Rust, Python and Markdown files.
fn tracked(root: &Path) -> anyhow::Result<Vec<String>> {
    let out = Command::new("git")
        .current_dir(root)
        .args(["ls-files", "-z", "--", "*.rs", "*.py", "*.md", "*.pth"])
        .output()
        .context("cannot run git ls-files")?;
    if !out.status.success() {
        bail!("git ls-files failed ({})", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .split('\0')
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect())
}

/// The `TUNECACHE_*` names in `text` with their line numbers (a name cut short by a
/// placeholder, `TUNECACHE_<NAME>_PATH` or an f-string's `TUNECACHE_{...}`, is not a name).
pub(crate) fn names(text: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find("TUNECACHE_") {
            let tail = &rest[at..];
            let len = tail
                .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(tail.len());
            let name = &tail[..len];
            let before = rest[..at].chars().last();
            let part_of_word = before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            if !name.ends_with('_') && !part_of_word {
                out.push((name.to_owned(), i + 1));
            }
            rest = &tail[len.max(1)..];
        }
    }
    out
}

/// Every use of a name the settings table does not hold, one line each.
pub(crate) fn check(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    for rel in tracked(root)? {
        // The C header's include guards and constants are not environment variables.
        let text = std::fs::read_to_string(root.join(&rel))
            .with_context(|| format!("cannot read {rel}"))?;
        for (name, line) in names(&text) {
            if !cache_core::settings::known(&name) {
                out.push(format!(
                    "{rel}:{line}: {name} is not in cache_core::settings::VARIABLES (add it there \
                     and to docs/settings.md, or read a listed one)"
                ));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_found_whole_and_placeholders_are_not_names() {
        let text = "a TUNECACHE_REMOTE=x and `TUNECACHE_<NAME>_PATH`\nf\"TUNECACHE_{app}_PATH\" \
                    MY_TUNECACHE_X \"TUNECACHE_TEST_CHILD\"";
        let found: Vec<String> = names(text).into_iter().map(|(n, _)| n).collect();
        assert_eq!(found, ["TUNECACHE_REMOTE", "TUNECACHE_TEST_CHILD"]);
        // An unknown name, spelt in two pieces so this file does not use it.
        let nope = format!("{}NOPE", "TUNECACHE_");
        assert_eq!(names(&format!("x\n {nope}"))[0], (nope.clone(), 2));
        assert!(!cache_core::settings::known(&nope));
    }
}
