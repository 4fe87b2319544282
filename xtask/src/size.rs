//! `cargo xtask size`: no Rust source file over 600 lines, and no function over 100 lines
//! outside tests (integration tests under `tests/`, and `#[cfg(test)]` modules). A file or a
//! function past the bound is a sign it has two jobs.
//!
//! Functions are found on the code with comments, strings and character literals blanked
//! out: a line that starts an item `fn` (after `pub`, `const`, `async`, `unsafe`, `extern`),
//! then its body's braces counted to the one that closes it.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// The most lines a source file may have.
pub(crate) const MAX_FILE_LINES: usize = 600;
/// The most lines a function may have, its signature and closing brace included.
pub(crate) const MAX_FN_LINES: usize = 100;

pub(crate) fn run(root: &Path) -> anyhow::Result<()> {
    let violations = check(root)?;
    if violations.is_empty() {
        println!(
            "size ok: no file over {MAX_FILE_LINES} lines, no function over {MAX_FN_LINES} lines outside tests"
        );
        Ok(())
    } else {
        bail!("too large:\n  {}", violations.join("\n  "))
    }
}

/// Every violation in the workspace, one line each.
pub(crate) fn check(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut files = Vec::new();
    collect(root, &mut files)?;
    files.sort();
    let mut out = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let rel = path.strip_prefix(root).unwrap_or(&path);
        let lines = text.lines().count();
        if lines > MAX_FILE_LINES {
            out.push(format!(
                "{}: {lines} lines (at most {MAX_FILE_LINES})",
                rel.display()
            ));
        }
        let in_tests = rel.components().any(|c| c.as_os_str() == "tests");
        if !in_tests {
            for (name, line, len) in long_functions(&text) {
                out.push(format!(
                    "{}:{line}: fn {name} has {len} lines (at most {MAX_FN_LINES})",
                    rel.display()
                ));
            }
        }
    }
    Ok(out)
}

/// The Rust files of the workspace (not `target/`, not hidden folders).
pub(crate) fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            if name != "target" && !name.starts_with('.') {
                collect(&path, out)?;
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// The functions of `text` over the bound, outside `#[cfg(test)]` modules: name, first line
/// (1-based), length in lines.
pub(crate) fn long_functions(text: &str) -> Vec<(String, usize, usize)> {
    let code = blank(text);
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut test_depth: Option<usize> = None;
    let mut pending_test = false;
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") {
            pending_test = true;
        }
        if test_depth.is_none()
            && let Some(name) = fn_name(trimmed)
            && let Some(len) = body_lines(&lines[i..])
            && len > MAX_FN_LINES
        {
            out.push((name.to_owned(), i + 1, len));
        }
        for ch in line.chars() {
            match ch {
                '{' => {
                    depth += 1;
                    if pending_test && test_depth.is_none() {
                        test_depth = Some(depth);
                        pending_test = false;
                    }
                }
                '}' => {
                    if test_depth == Some(depth) {
                        test_depth = None;
                    }
                    depth = depth.saturating_sub(1);
                }
                ';' if pending_test && test_depth.is_none() => pending_test = false,
                _ => {}
            }
        }
    }
    out
}

/// The name of the function a line starts, if it starts one.
pub(crate) fn fn_name(line: &str) -> Option<&str> {
    let mut rest = line;
    loop {
        let word_end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
        let (word, after) = rest.split_at(word_end);
        match word {
            "pub" | "const" | "async" | "unsafe" | "extern" => {
                // `pub(crate)`, `extern "C"`: skip what follows the keyword up to a space.
                rest = after.trim_start_matches(|c: char| c != ' ').trim_start();
            }
            "fn" => {
                let name = after.trim_start();
                let end = name.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
                return (end > 0).then(|| &name[..end]);
            }
            _ => return None,
        }
    }
}

/// How many lines the function starting at `lines[0]` spans, to its closing brace; `None`
/// for a declaration without a body.
fn body_lines(lines: &[&str]) -> Option<usize> {
    let mut depth = 0usize;
    let mut started = false;
    for (i, line) in lines.iter().enumerate() {
        for ch in line.chars() {
            match ch {
                '{' => {
                    depth += 1;
                    started = true;
                }
                '}' => {
                    depth = depth.saturating_sub(1);
                    if started && depth == 0 {
                        return Some(i + 1);
                    }
                }
                ';' if !started => return None,
                _ => {}
            }
        }
    }
    None
}

/// `text` with comments, string literals (raw ones too) and character literals replaced by
/// spaces, newlines kept, so braces in them do not count.
pub(crate) fn blank(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let keep = |out: &mut Vec<u8>, s: &[u8]| {
        out.extend(s.iter().map(|&c| if c == b'\n' { b'\n' } else { b' ' }));
    };
    while i < b.len() {
        let end = if b[i..].starts_with(b"//") {
            b[i..]
                .iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |p| i + p)
        } else if b[i..].starts_with(b"/*") {
            find(b, i + 2, b"*/").map_or(b.len(), |p| p + 2)
        } else if let Some(end) = raw_string(b, i) {
            end
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            (j + 1).min(b.len())
        } else if b[i] == b'\'' {
            char_literal(b, i).unwrap_or(i)
        } else {
            i
        };
        if end > i {
            keep(&mut out, &b[i..end]);
            i = end;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn find(b: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    b.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| from + p)
}

/// The end of a raw string (`r"…"`, `r#"…"#`, `br"…"`) starting at `i`.
fn raw_string(b: &[u8], i: usize) -> Option<usize> {
    if i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_') {
        return None;
    }
    let mut j = i + usize::from(b[i] == b'b');
    if b.get(j) != Some(&b'r') {
        return None;
    }
    j += 1;
    let hashes = b[j..].iter().take_while(|&&c| c == b'#').count();
    j += hashes;
    if b.get(j) != Some(&b'"') {
        return None;
    }
    let mut close = vec![b'"'];
    close.extend(std::iter::repeat_n(b'#', hashes));
    find(b, j + 1, &close).map(|p| p + close.len())
}

/// The end of a character literal (`'x'`, `'\n'`, `'\u{7f}'`) at `i`; `None` for a lifetime.
fn char_literal(b: &[u8], i: usize) -> Option<usize> {
    if b.get(i + 1) == Some(&b'\\') {
        return find(b, i + 2, b"'").filter(|p| p - i <= 12).map(|p| p + 1);
    }
    let len = std::str::from_utf8(b.get(i + 1..(i + 5).min(b.len()))?)
        .ok()
        .or_else(|| std::str::from_utf8(&b[i + 1..(i + 2).min(b.len())]).ok())?
        .chars()
        .next()?
        .len_utf8();
    (b.get(i + 1 + len) == Some(&b'\'')).then_some(i + 2 + len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_code_keeps_its_size_limits() {
        let violations = check(&crate::project_root()).expect("the workspace is readable");
        assert!(violations.is_empty(), "{violations:#?}");
    }

    #[test]
    fn a_long_function_is_found_and_braces_in_strings_comments_and_chars_do_not_count() {
        let mut text = String::from("pub(crate) fn long(x: u32) -> u32 {\n");
        for _ in 0..MAX_FN_LINES {
            text.push_str("    let _ = \"}\"; // }\n");
        }
        text.push_str("    let _ = '}'; let _ = r#\"}\"#; /* } */\n    x\n}\n");
        text.push_str("fn short<'a>(s: &'a str) -> &'a str { s }\n");
        text.push_str("#[cfg(test)]\nmod tests {\n    fn long_test() {\n");
        for _ in 0..MAX_FN_LINES {
            text.push_str("        let _ = 1;\n");
        }
        text.push_str("    }\n}\n");
        let found = long_functions(&text);
        assert_eq!(
            found,
            [("long".to_owned(), 1, MAX_FN_LINES + 4)],
            "{found:?}"
        );
    }

    #[test]
    fn a_declaration_without_a_body_is_not_a_function_to_measure() {
        assert_eq!(body_lines(&["fn f(&self);", "fn g() {}"]), None);
        assert_eq!(fn_name("pub(super) async fn go()"), Some("go"));
        assert_eq!(fn_name("let fn_x = 1;"), None);
    }
}
