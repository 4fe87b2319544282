//! The docs check: what the documents name exists, so they cannot silently describe code
//! that moved. The documents are ARCHITECTURE.md, TESTING.md, README.md, CONTRIBUTING.md,
//! FORMAT.md, IMPORTS.md and every page of `docs/`.
//!
//! - A file name is a backticked token that looks like a path: letters, digits, `._/-`,
//!   ending in a known extension or `/` (`::item` after it is ignored). Inside a crate's
//!   section (`### \`crate\``) it is looked up in that crate (`crate/`, `crate/src/`,
//!   `crate/tests/it/`) and at the root; elsewhere anywhere in the tree, by path suffix.
//! - A Rust path is a backticked token starting with a library crate's name (`cache_core::`,
//!   `gpu_tuner::fleet::`): its item must be one of that crate's public names (`api/`).
//! - A Markdown link to a local document must reach a file.
//! - A code block right after `<!-- example: PATH ... -->` is quoted from PATH: its lines, in
//!   order, are lines of PATH (leading space aside), so a quoted example cannot drift from the
//!   program a test runs.

use std::path::Path;

use anyhow::bail;

const EXTENSIONS: [&str; 7] = [".rs", ".md", ".py", ".json", ".toml", ".tcache", ".jsonl"];

pub(crate) fn run(root: &Path) -> anyhow::Result<()> {
    let missing = check(root)?;
    if missing.is_empty() {
        println!(
            "docs ok: every path, Rust path, link and quoted example the documents name exists"
        );
        Ok(())
    } else {
        bail!(
            "the documents name what does not exist:\n  {}",
            missing.join("\n  ")
        )
    }
}

/// The documents checked, relative to the root.
fn documents(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut docs: Vec<String> = [
        "ARCHITECTURE.md",
        "TESTING.md",
        "README.md",
        "CONTRIBUTING.md",
        "FORMAT.md",
        "IMPORTS.md",
    ]
    .map(str::to_owned)
    .into();
    for entry in std::fs::read_dir(root.join("docs"))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") {
            docs.push(format!("docs/{name}"));
        }
    }
    docs.sort();
    Ok(docs)
}

/// What the documents name that does not exist, each as `document line N: what`.
pub(crate) fn check(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut files = Vec::new();
    list(root, root, &mut files)?;
    let api = public_api(root)?;
    let mut out = Vec::new();
    for doc in documents(root)? {
        let text =
            std::fs::read_to_string(root.join(&doc)).map_err(|e| anyhow::anyhow!("{doc}: {e}"))?;
        let here = Path::new(&doc).parent().unwrap_or(Path::new(""));
        // ARCHITECTURE.md and TESTING.md name the code; the other documents also name files
        // of a user's own (`triton.tcache`): there, a path is checked when it starts at a
        // folder or file of the repository.
        let code_map = matches!(doc.as_str(), "ARCHITECTURE.md" | "TESTING.md");
        let paths = missing(&text, root, &files)
            .into_iter()
            .filter(|m| code_map || names_repository_path(m, root));
        let found = paths
            .chain(missing_rust_paths(&text, &api))
            .chain(missing_links(&text, root, here))
            .chain(drifted_examples(&text, root));
        out.extend(found.map(|m| format!("{doc} {m}")));
    }
    Ok(out)
}

/// Whether a reported name (`line N: \`path\``) starts at a top-level folder or file of the
/// repository.
fn names_repository_path(report: &str, root: &Path) -> bool {
    let name = report.split('`').nth(1).unwrap_or_default();
    let first = name.split('/').next().unwrap_or_default();
    !first.is_empty() && root.join(first).exists()
}

/// Each library crate's Rust name (`cache_core`) with its public names (`api/<crate>.txt`).
fn public_api(root: &Path) -> anyhow::Result<Vec<(String, Vec<String>)>> {
    crate::api::LIBRARIES
        .iter()
        .map(|krate| {
            let names = crate::api::public_names(root, krate)?;
            Ok((krate.replace('-', "_"), names.into_iter().collect()))
        })
        .collect()
}

/// Backticked Rust paths into a library crate whose item is not one of its public names.
fn missing_rust_paths(text: &str, api: &[(String, Vec<String>)]) -> Vec<String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        for token in line.split('`').skip(1).step_by(2) {
            let path: String = token
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let Some((krate, rest)) = path.split_once("::") else {
                continue;
            };
            let Some((_, names)) = api.iter().find(|(k, _)| k == krate) else {
                continue;
            };
            let rest = rest.trim_end_matches(':');
            // The item, or a member of one (`Type::method`): its longest public prefix.
            let segments: Vec<&str> = rest.split("::").collect();
            let known = (1..=segments.len())
                .any(|k| names.iter().any(|name| *name == segments[..k].join("::")));
            if !rest.is_empty() && !known {
                out.push(format!("line {}: `{path}` is not a public name", n + 1));
            }
        }
    }
    out
}

/// Markdown links to local files that reach nothing (`here`: the document's folder).
fn missing_links(text: &str, root: &Path, here: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        for part in line.split("](").skip(1) {
            let target = part.split(')').next().unwrap_or_default();
            let target = target.split('#').next().unwrap_or_default();
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            if !root.join(here).join(target).exists() {
                out.push(format!(
                    "line {}: link to `{target}` reaches nothing",
                    n + 1
                ));
            }
        }
    }
    out
}

/// Code blocks marked as quoted from a file whose lines are not that file's, in order.
fn drifted_examples(text: &str, root: &Path) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let Some(rest) = line.trim().strip_prefix("<!-- example: ") else {
            continue;
        };
        let source = rest.split_whitespace().next().unwrap_or_default();
        let Ok(program) = std::fs::read_to_string(root.join(source)) else {
            out.push(format!(
                "line {}: example source `{source}` cannot be read",
                n + 1
            ));
            continue;
        };
        let block: Vec<&str> = lines[n + 1..]
            .iter()
            .skip(1)
            .take_while(|l| !l.starts_with("```"))
            .copied()
            .collect();
        if !lines.get(n + 1).is_some_and(|l| l.starts_with("```")) {
            out.push(format!("line {}: no code block follows", n + 1));
        } else if let Some(stray) = not_quoted(&block, &program) {
            out.push(format!(
                "line {}: the block quotes `{source}`, which has no `{stray}` there",
                n + 1
            ));
        }
    }
    out
}

/// The first line of `block` (not blank) that is not the next line of `program` in order
/// (leading space aside), if any.
fn not_quoted<'a>(block: &[&'a str], program: &str) -> Option<&'a str> {
    let mut rest = program.lines().map(str::trim);
    block
        .iter()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
        .find(|wanted| !rest.any(|have| have == *wanted))
}

fn missing(text: &str, root: &Path, files: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut section: Option<String> = None;
    for (n, line) in text.lines().enumerate() {
        if let Some(title) = line.strip_prefix("### `") {
            section = title.strip_suffix('`').map(str::to_owned);
        } else if line.starts_with("## ") {
            section = None;
        }
        for name in names(line) {
            let found = match &section {
                Some(krate) if root.join(krate).is_dir() => {
                    ["", "src/", "tests/it/"]
                        .iter()
                        .any(|sub| exists(files, &format!("{krate}/{sub}{name}")))
                        || exists(files, name)
                }
                _ => exists(files, name) || files.iter().any(|f| ends_with_path(f, name)),
            };
            if !found {
                out.push(format!("line {}: `{name}`", n + 1));
            }
        }
    }
    out
}

/// Whether `path` is a file of the tree, or a folder holding one.
fn exists(files: &[String], path: &str) -> bool {
    if let Some(dir) = path.strip_suffix('/') {
        let prefix = format!("{dir}/");
        files.iter().any(|f| f.starts_with(&prefix))
    } else {
        files.iter().any(|f| f == path)
    }
}

/// Whether the file `f` is `name`, or lies in the folder `name`, below some folder.
fn ends_with_path(f: &str, name: &str) -> bool {
    if name.ends_with('/') {
        f.contains(&format!("/{name}"))
    } else {
        f.ends_with(&format!("/{name}"))
    }
}

/// The path-like backticked tokens of a line.
fn names(line: &str) -> Vec<&str> {
    line.split('`')
        .skip(1)
        .step_by(2)
        .map(|t| t.split("::").next().unwrap_or(t))
        .filter(|t| {
            !t.is_empty()
                && t.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._/-".contains(c))
                && (t.ends_with('/') && t.len() > 1 || EXTENSIONS.iter().any(|e| t.ends_with(e)))
                && !t.contains('<')
        })
        .collect()
}

/// Every file under `dir`, relative to `root`, skipping build output and VCS data.
fn list(root: &Path, dir: &Path, out: &mut Vec<String>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if name == "target" || name == ".git" {
            continue;
        }
        let path = entry.path();
        if path.is_dir() {
            list(root, &path, out)?;
        } else if let Ok(rel) = path.strip_prefix(root) {
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quoted_example_that_drifted_and_a_wrong_rust_path_are_caught() {
        let program = "fn main() {\n    let a = 1;\n    let b = 2;\n}\n";
        assert_eq!(not_quoted(&["let a = 1;", "", "let b = 2;"], program), None);
        assert_eq!(
            not_quoted(&["let b = 2;", "let a = 1;"], program),
            Some("let a = 1;")
        );
        assert_eq!(not_quoted(&["let c = 3;"], program), Some("let c = 3;"));
        let api = vec![(
            "cache_core".to_owned(),
            vec![
                "Cache".to_owned(),
                "inspect".to_owned(),
                "inspect::Inspection".to_owned(),
            ],
        )];
        let text = "`cache_core::Cache::claim`, `cache_core::inspect::Inspection`, `cache_core::Gone`, `std::fs::read`";
        assert_eq!(
            missing_rust_paths(text, &api),
            vec!["line 1: `cache_core::Gone` is not a public name".to_owned()]
        );
        let root = crate::project_root();
        assert_eq!(
            missing_links(
                "[a](README.md) [b](nowhere.md) [c](https://x.org/y.md)",
                &root,
                Path::new("")
            ),
            vec!["line 1: link to `nowhere.md` reaches nothing".to_owned()]
        );
    }

    #[test]
    fn every_path_architecture_md_names_exists() {
        let missing = check(&crate::project_root()).expect("reads the tree");
        assert!(missing.is_empty(), "{missing:#?}");
    }

    #[test]
    fn a_moved_file_is_caught_in_its_crate_section() {
        let files = vec![
            "cache-core/src/cache/mod.rs".to_owned(),
            "cache-core/tests/it/lock.rs".to_owned(),
        ];
        let root = crate::project_root();
        let text = "### `cache-core`\n- `cache/mod.rs` and `cache.rs`, `lock.rs`, `gone/`\n## Invariants\n`lock.rs::a_test`, `nowhere.rs`";
        assert_eq!(
            missing(text, &root, &files),
            vec![
                "line 2: `cache.rs`".to_owned(),
                "line 2: `gone/`".to_owned(),
                "line 4: `nowhere.rs`".to_owned(),
            ]
        );
    }

    #[test]
    fn only_path_like_tokens_are_names() {
        assert_eq!(
            names("`Cache::claim` in `claim.rs`, `<file>.lock`, `P.journal`, `cache/`, `a b.rs`"),
            vec!["claim.rs", "cache/"]
        );
    }
}
