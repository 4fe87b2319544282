//! Module cycles inside a crate: which top-level modules of a crate reach each other through
//! `crate::` paths (and `super::` from a file at the crate root), outside comments, strings and
//! `#[cfg(test)]` code, grouped into strongly connected components. A crate's rooms should
//! form layers as its crates do; `cargo xtask layering` refuses any cycle in a library crate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::size::blank;

/// Every violation in the library crates, one line each.
pub(crate) fn check(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    for krate in crate::api::LIBRARIES {
        for cycle in cycles(&root.join(krate).join("src"))? {
            out.push(format!(
                "{krate}: its modules {} import each other (a cycle: move what they share \
                 into a room below them)",
                cycle.join(", ")
            ));
        }
    }
    Ok(out)
}

/// The cycles among the top-level modules of the crate whose source is `src`, each sorted.
pub(crate) fn cycles(src: &Path) -> anyhow::Result<Vec<Vec<String>>> {
    let mut modules = BTreeSet::new();
    for e in std::fs::read_dir(src)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if e.file_type()?.is_dir() {
            modules.insert(name);
        } else if let Some(stem) = name.strip_suffix(".rs")
            && stem != "lib"
            && stem != "main"
        {
            modules.insert(stem.to_owned());
        }
    }
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for module in &modules {
        let file = src.join(format!("{module}.rs"));
        let files = if file.is_file() {
            vec![file]
        } else {
            rust_files(&src.join(module))?
        };
        for f in files {
            let text = std::fs::read_to_string(&f)?;
            let at_root = f.parent() == Some(src);
            for used in uses(&text, at_root) {
                if used != *module && modules.contains(&used) {
                    edges.entry(module.clone()).or_default().insert(used);
                }
            }
        }
    }
    Ok(components(&modules, &edges))
}

fn rust_files(dir: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            out.extend(rust_files(&p)?);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    Ok(out)
}

/// The module names `text` reaches by `crate::NAME` (and `super::NAME` from a file at the
/// crate root), before its first `#[cfg(test)]`, comments and strings left out.
fn uses(text: &str, at_root: bool) -> BTreeSet<String> {
    let text = blank(text);
    let code = text.split("#[cfg(test)]").next().unwrap_or("");
    let mut out = BTreeSet::new();
    let prefixes: &[&str] = if at_root {
        &["crate::", "super::"]
    } else {
        &["crate::"]
    };
    for prefix in prefixes {
        for (at, _) in code.match_indices(prefix) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let name: String = code[at + prefix.len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

/// The strongly connected components of more than one module (Tarjan's algorithm).
fn components(
    modules: &BTreeSet<String>,
    edges: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<Vec<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            let edges = self.edges;
            for w in edges.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for m in modules {
        if !walk.index.contains_key(m.as_str()) {
            walk.visit(m);
        }
    }
    walk.found.sort();
    walk.found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_library_crate_has_a_module_cycle() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the workspace");
        assert_eq!(check(root).expect("read"), Vec::<String>::new());
    }

    #[test]
    fn a_planted_cycle_is_found_and_a_mention_in_a_comment_or_test_is_not() {
        let dir = tempfile::tempdir().expect("dir");
        let src = dir.path();
        std::fs::write(src.join("lib.rs"), "mod a; mod b; mod c;\n").expect("lib");
        // a reaches c only in a comment, a string and its tests: not an import.
        std::fs::write(
            src.join("a.rs"),
            "use crate::b::X; // crate::c::Y\nconst S: &str = \"crate::c\";\n#[cfg(test)]\nmod t { use crate::c; }\n",
        )
        .expect("a");
        std::fs::create_dir(src.join("b")).expect("b/");
        std::fs::write(src.join("b/mod.rs"), "mod inner;\n").expect("b");
        std::fs::write(src.join("b/inner.rs"), "fn f() { crate::a::g() }\n").expect("inner");
        std::fs::write(
            src.join("c.rs"),
            "use super::b;\nfn f() { crate::a::g() }\n",
        )
        .expect("c");
        assert_eq!(cycles(src).expect("read"), [["a", "b"]]);
        std::fs::write(src.join("a.rs"), "use crate::c::X;\n").expect("a");
        // a -> c -> b (super:: from the root) and a.
        assert_eq!(cycles(src).expect("read"), [["a", "b", "c"]]);
    }
}
