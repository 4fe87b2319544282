//! `cargo xtask api [--bless]`: the public names of each library crate, checked against a
//! snapshot in `api/<crate>.txt`, so the public surface changes only on purpose (a new name
//! fails `cargo test` until the snapshot is blessed and the change reviewed).
//!
//! A public name is a path reachable from the crate root through `pub mod` and `pub use`: an
//! item the root or a public module declares `pub` (fn, struct, enum, trait, type, const,
//! static, union, mod, an exported macro) or re-exports. Read from the source on stable Rust
//! (rustdoc's JSON needs a nightly toolchain), with comments and strings blanked out and
//! `#[cfg(test)]` modules left out; items under `#[cfg(feature = ...)]` count (a feature's
//! names are public too). Methods are not listed: they follow their type.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::size::blank;

/// The library crates whose surface is snapshotted (what a downstream crate builds on).
pub(crate) const LIBRARIES: [&str; 8] = [
    "cache-format",
    "cache-migrate",
    "cache-core",
    "cache-import",
    "cache-remote",
    "cache-outputs",
    "gpu-tuner",
    "cache-cli",
];

pub(crate) fn run(root: &Path, args: &[String]) -> anyhow::Result<()> {
    let bless = args.iter().any(|a| a == "--bless");
    let mut stale = Vec::new();
    for krate in LIBRARIES {
        let names = public_names(root, krate)?;
        let snapshot = snapshot_path(root, krate);
        let text = render(&names);
        if bless {
            std::fs::create_dir_all(snapshot.parent().expect("api/"))?;
            std::fs::write(&snapshot, &text)
                .with_context(|| format!("cannot write {}", snapshot.display()))?;
            println!("{krate}: {} public names", names.len());
        } else if let Some(diff) = compare(&snapshot, &text)? {
            stale.push(format!("{krate}:\n{diff}"));
        }
    }
    if stale.is_empty() {
        if !bless {
            println!("api ok: every library crate's public names match api/<crate>.txt");
        }
        Ok(())
    } else {
        bail!(
            "the public names changed (review, then `cargo xtask api --bless`):\n{}",
            stale.join("\n")
        )
    }
}

fn snapshot_path(root: &Path, krate: &str) -> PathBuf {
    root.join("api").join(format!("{krate}.txt"))
}

fn render(names: &BTreeSet<String>) -> String {
    let mut text = String::new();
    for name in names {
        text.push_str(name);
        text.push('\n');
    }
    text
}

/// The lines added to and removed from the snapshot at `path` (`+ name`, `- name`), or
/// `None` if it holds exactly `text`.
pub(crate) fn compare(path: &Path, text: &str) -> anyhow::Result<Option<String>> {
    let old = std::fs::read_to_string(path).unwrap_or_default();
    if old == text {
        return Ok(None);
    }
    let before: BTreeSet<&str> = old.lines().collect();
    let after: BTreeSet<&str> = text.lines().collect();
    let mut out = Vec::new();
    out.extend(after.difference(&before).map(|n| format!("  + {n}")));
    out.extend(before.difference(&after).map(|n| format!("  - {n}")));
    if out.is_empty() {
        out.push(format!("  {} is not in the expected form", path.display()));
    }
    Ok(Some(out.join("\n")))
}

/// The public names of `krate` (a folder of the workspace).
pub(crate) fn public_names(root: &Path, krate: &str) -> anyhow::Result<BTreeSet<String>> {
    let src = root.join(krate).join("src");
    let mut names = BTreeSet::new();
    walk(&src.join("lib.rs"), &src, "", &mut names)?;
    Ok(names)
}

/// Adds the names module file `file` (whose submodules live in `dir`) makes public, under
/// `prefix`.
fn walk(file: &Path, dir: &Path, prefix: &str, out: &mut BTreeSet<String>) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    for item in top_level_items(&text) {
        match item {
            Item::Name(name) => {
                out.insert(format!("{prefix}{name}"));
            }
            Item::Module(name) => {
                out.insert(format!("{prefix}{name}"));
                let (sub_file, sub_dir) = module_file(dir, &name)
                    .with_context(|| format!("{}: pub mod {name}", file.display()))?;
                walk(&sub_file, &sub_dir, &format!("{prefix}{name}::"), out)?;
            }
            Item::Inline(name) => {
                out.insert(format!("{prefix}{name}"));
            }
        }
    }
    Ok(())
}

/// The file of module `name` declared in a module whose submodules live in `dir`.
fn module_file(dir: &Path, name: &str) -> Option<(PathBuf, PathBuf)> {
    let flat = dir.join(format!("{name}.rs"));
    if flat.is_file() {
        return Some((flat, dir.join(name)));
    }
    let nested = dir.join(name).join("mod.rs");
    nested.is_file().then(|| (nested, dir.join(name)))
}

/// What one top-level `pub` item of a module adds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Item {
    /// A name (an item, or one re-exported).
    Name(String),
    /// A public module in a file of its own.
    Module(String),
    /// A public module written inline (its contents are not listed).
    Inline(String),
}

/// The public items at the top level of a module's source, outside `#[cfg(test)]` modules.
pub(crate) fn top_level_items(text: &str) -> Vec<Item> {
    let code = blank(text);
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut pending_export = false;
    let mut statement = String::new();
    for line in code.lines() {
        let trimmed = line.trim();
        if !statement.is_empty() {
            statement.push_str(trimmed);
            statement.push(' ');
        } else if depth == 0 {
            if trimmed.starts_with("#[macro_export]") {
                pending_export = true;
            }
            let exported_macro = pending_export && trimmed.starts_with("macro_rules!");
            if trimmed.starts_with("pub ") || exported_macro {
                statement.push_str(trimmed);
                statement.push(' ');
                pending_export = false;
            }
        }
        // A `use` tree may span lines and hold braces: it ends at its `;`.
        let complete = if statement.starts_with("pub use ") {
            statement.contains(';')
        } else {
            statement.contains(';') || statement.contains('{')
        };
        if !statement.is_empty() && complete {
            out.extend(items_of(&statement));
            statement.clear();
        }
        for ch in line.chars() {
            match ch {
                '{' => depth += 1,
                '}' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
    }
    out
}

/// The items one `pub` statement adds.
fn items_of(statement: &str) -> Vec<Item> {
    let words: Vec<&str> = statement
        .split(|c: char| c.is_whitespace() || c == '(' || c == '<')
        .filter(|w| !w.is_empty())
        .collect();
    if words.first() == Some(&"macro_rules!") {
        return ident(words.get(1).copied())
            .map(Item::Name)
            .into_iter()
            .collect();
    }
    // `pub`, then the kind, after any qualifiers (`const unsafe fn`, `extern "C" fn`: the
    // literal is blanked out).
    let qualifier =
        |w: Option<&&str>| matches!(w, Some(&("const" | "unsafe" | "async" | "extern")));
    let mut i = 1;
    while qualifier(words.get(i))
        && matches!(
            words.get(i + 1),
            Some(&("fn" | "unsafe" | "async" | "extern" | "trait" | "const"))
        )
    {
        i += 1;
    }
    match words.get(i).copied() {
        Some("use") => use_names(&statement[statement.find("use ").map_or(0, |p| p + 4)..]),
        Some("mod") => {
            let Some(name) = ident(words.get(i + 1).copied()) else {
                return Vec::new();
            };
            if statement.trim_end().ends_with(';') && !statement.contains('{') {
                vec![Item::Module(name)]
            } else {
                vec![Item::Inline(name)]
            }
        }
        Some("fn" | "struct" | "enum" | "trait" | "type" | "const" | "static" | "union") => {
            ident(words.get(i + 1).copied())
                .map(Item::Name)
                .into_iter()
                .collect()
        }
        _ => Vec::new(),
    }
}

/// The leading identifier of `word` (`Foo<T>` → `Foo`, `f(` → `f`).
fn ident(word: Option<&str>) -> Option<String> {
    let word = word?;
    let word = word.strip_prefix("r#").unwrap_or(word);
    let end = word
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(word.len());
    (end > 0).then(|| word[..end].to_owned())
}

/// The names a `use` tree (after `use `) brings in: each leaf, or its `as` name; a glob is
/// listed as `path::*`.
fn use_names(tree: &str) -> Vec<Item> {
    let tree = tree.split(';').next().unwrap_or_default();
    let squeezed: String = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = Vec::new();
    leaves(&squeezed, "", &mut out);
    out.into_iter().map(Item::Name).collect()
}

fn leaves(tree: &str, prefix: &str, out: &mut Vec<String>) {
    let tree = tree.trim().trim_end_matches(',');
    if let Some(open) = tree.find('{') {
        let head = tree[..open].trim().trim_end_matches("::");
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let path = format!("{prefix}{head}::");
        for part in split_top(inner) {
            leaves(part, &path, out);
        }
        return;
    }
    if tree.is_empty() {
        return;
    }
    if let Some((_, alias)) = tree.split_once(" as ") {
        out.push(alias.trim().to_owned());
    } else if tree.ends_with('*') {
        out.push(format!("{prefix}{tree}"));
    } else {
        let last = tree.rsplit("::").next().unwrap_or(tree).trim();
        if last == "self" {
            let path = prefix.trim_end_matches("::");
            out.push(path.rsplit("::").next().unwrap_or(path).to_owned());
        } else {
            out.push(last.to_owned());
        }
    }
}

/// `a, b::{c, d}, e` split at its top-level commas.
fn split_top(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut level, mut from) = (0usize, 0);
    for (i, ch) in s.char_indices() {
        match ch {
            '{' => level += 1,
            '}' => level = level.saturating_sub(1),
            ',' if level == 0 => {
                parts.push(&s[from..i]);
                from = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[from..]);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_library_crates_public_names_match_its_snapshot() {
        let root = crate::project_root();
        let mut stale = Vec::new();
        for krate in LIBRARIES {
            let names = public_names(&root, krate).expect("readable");
            if let Some(diff) =
                compare(&snapshot_path(&root, krate), &render(&names)).expect("readable")
            {
                stale.push(format!("{krate}:\n{diff}"));
            }
        }
        assert!(
            stale.is_empty(),
            "public names changed; review, then `cargo xtask api --bless`:\n{}",
            stale.join("\n")
        );
    }

    #[test]
    fn a_planted_public_name_is_found_in_each_form() {
        let text = "\
//! pub fn in_a_comment() {}
pub use inner::{Alpha, beta as Gamma, deep::{Delta, self}};
pub use other::*;
pub(crate) use hidden::Hidden;
mod private;
pub mod open;
pub mod inline { pub fn not_listed() {} }
pub fn planted(x: u32) -> u32 { x }
pub(crate) fn internal() {}
pub struct Shape<T> { pub field: T }
pub const unsafe fn tricky() {}
pub const LIMIT: usize = 3;
#[macro_export]
macro_rules! shout { () => {} }
#[cfg(test)]
mod tests {
    pub fn helper() {}
}
";
        let items = top_level_items(text);
        let names: Vec<String> = items
            .iter()
            .map(|i| match i {
                Item::Name(n) | Item::Module(n) | Item::Inline(n) => n.clone(),
            })
            .collect();
        assert_eq!(
            names,
            [
                "Alpha", "Gamma", "Delta", "deep", "other::*", "open", "inline", "planted",
                "Shape", "tricky", "LIMIT", "shout"
            ]
        );
        assert!(items.contains(&Item::Module("open".into())));
        assert!(items.contains(&Item::Inline("inline".into())));
    }
}
