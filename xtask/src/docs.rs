//! The docs check: every file or folder that ARCHITECTURE.md names exists, so the code map
//! cannot silently describe code that moved.
//!
//! A name is a backticked token that looks like a path: letters, digits, `._/-`, ending in a
//! known extension or `/` (`::item` after it is ignored). Inside a crate's section
//! (`### \`crate\``) it is looked up in that crate (`crate/`, `crate/src/`, `crate/tests/it/`)
//! and at the root; elsewhere anywhere in the tree, by path suffix.

use std::path::Path;

use anyhow::bail;

const EXTENSIONS: [&str; 7] = [".rs", ".md", ".py", ".json", ".toml", ".tcache", ".jsonl"];

pub(crate) fn run(root: &Path) -> anyhow::Result<()> {
    let missing = check(root)?;
    if missing.is_empty() {
        println!("docs ok: every path ARCHITECTURE.md names exists");
        Ok(())
    } else {
        bail!(
            "ARCHITECTURE.md names paths that do not exist:\n  {}",
            missing.join("\n  ")
        )
    }
}

/// The names in ARCHITECTURE.md that match no file or folder, with their line numbers.
pub(crate) fn check(root: &Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md"))?;
    let mut files = Vec::new();
    list(root, root, &mut files)?;
    Ok(missing(&text, root, &files))
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
