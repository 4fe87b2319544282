//! `cargo xtask tidy`: house rules that a compiler does not check.
//!
//! - No `Result<_, String>` at a public boundary: a caller that decides on an error needs its
//!   type, not prose. A public boundary is a `pub fn` (plain `pub`, not `pub(crate)`) or a
//!   method of a `pub trait`, in a crate's `src/` outside `#[cfg(test)]` modules (xtask and
//!   test-support, which nothing ships, are left out).
//!
//! - No I/O in the pure crates, cache-format and cache-migrate: no file, network, process or
//!   environment call in their `src/` (the host name of a measurement's origin is given to
//!   cache-format by cache-core).
//!
//! - The seam stays closed: cache-core's `Tier` trait has its read / offer / health / close
//!   methods and no others, and no public method of `Cache` is named for a shared tier's
//!   feature (fleet, lease, remote, publish, pull): those live behind the tier's own handle.
//!
//! - Every `TUNECACHE_*` name in the sources and documents is in the one table of settings,
//!   `cache_core::settings` (`env_names.rs`), and the environment is read there alone: no
//!   `std::env::var`, `var_os`, `vars` or tracing's `EnvFilter::*from_env` in a crate's `src/`
//!   outside `cache-core/src/settings.rs` and `#[cfg(test)]` modules (whoever opens a cache
//!   takes a `Settings` read once and passes it on).
//!
//! Signatures are read on the code with comments and strings blanked out (`size::blank`),
//! from the line that starts the `fn` to its body's `{` or its `;`.

use std::path::Path;

use anyhow::{Context, bail};

use crate::size::{blank, collect, fn_name};

pub(crate) fn run(root: &Path) -> anyhow::Result<()> {
    let violations = check(root)?;
    if violations.is_empty() {
        println!(
            "tidy ok: no Result<_, String> at a public boundary, no I/O in the pure crates, the seam closed, every TUNECACHE_* name in the settings table, the environment read there alone"
        );
        Ok(())
    } else {
        bail!("tidy found:\n  {}", violations.join("\n  "))
    }
}

/// Every violation in the workspace, one line each.
pub(crate) fn check(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut files = Vec::new();
    collect(root, &mut files)?;
    files.sort();
    let mut out = Vec::new();
    for path in files {
        let rel = path.strip_prefix(root).unwrap_or(&path);
        let mut parts = rel.components().map(|c| c.as_os_str().to_string_lossy());
        let krate = parts.next().unwrap_or_default();
        // `<crate>/src/...` only (`python/src` too); not tests, benches or examples.
        let in_src = parts.next().is_some_and(|p| p == "src");
        if !in_src || krate == "xtask" || krate == "test-support" {
            continue;
        }
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        for (name, line) in string_errors(&text) {
            out.push(format!(
                "{}:{line}: fn {name} returns Result<_, String>",
                rel.display()
            ));
        }
        if rel != Path::new(SETTINGS_MODULE) {
            for (call, line) in env_reads(&text) {
                out.push(format!(
                    "{}:{line}: {call} reads the environment: take it from a Settings \
                     (cache_core::settings) read once",
                    rel.display()
                ));
            }
        }
        if PURE_CRATES.contains(&krate.as_ref()) {
            for (call, line) in io_calls(&text) {
                out.push(format!(
                    "{}:{line}: {call} in a crate that does no I/O",
                    rel.display()
                ));
            }
        }
    }
    out.extend(seam(root)?);
    out.extend(crate::env_names::check(root)?);
    Ok(out)
}

/// The one module that reads the environment.
const SETTINGS_MODULE: &str = "cache-core/src/settings.rs";

/// Calls that read the environment (spaces squeezed out).
const ENV_READS: [&str; 7] = [
    "env::var(",
    "env::var_os(",
    "env::vars(",
    "env::vars_os(",
    "EnvFilter::try_from_env(",
    "EnvFilter::from_env(",
    "from_default_env(",
];

/// The environment reads of `text` outside comments, strings and `#[cfg(test)]` modules, with
/// their line.
pub(crate) fn env_reads(text: &str) -> Vec<(&'static str, usize)> {
    let code = blank(text);
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut test_depth: Option<usize> = None;
    let mut pending_test = false;
    for (i, line) in code.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") {
            pending_test = true;
        } else if pending_test && !trimmed.is_empty() && !trimmed.starts_with("#[") {
            if trimmed.starts_with("mod ") || trimmed.starts_with("pub(crate) mod ") {
                test_depth = Some(depth);
            }
            pending_test = false;
        }
        if test_depth.is_none() {
            let squeezed: String = line.split_whitespace().collect();
            for call in ENV_READS {
                if squeezed.contains(call) {
                    out.push((call, i + 1));
                }
            }
        }
        for c in line.chars() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if test_depth == Some(depth) {
                        test_depth = None;
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// The methods `Tier` may have.
const TIER_METHODS: [&str; 8] = [
    "name", "describe", "budget", "fill", "get_many", "offer", "health", "close",
];

/// Words no public method of `Cache` may contain: a shared tier's features.
const SHARED_TIER_WORDS: [&str; 5] = ["fleet", "lease", "remote", "publish", "pull"];

/// Violations of the closed seam in cache-core.
fn seam(root: &Path) -> anyhow::Result<Vec<String>> {
    let tier = std::fs::read_to_string(root.join("cache-core/src/tier.rs"))?;
    let cache = std::fs::read_to_string(root.join("cache-core/src/cache/mod.rs"))?;
    let mut out = Vec::new();
    for name in trait_methods(&tier, "Tier") {
        if !TIER_METHODS.contains(&name.as_str()) {
            out.push(format!(
                "cache-core/src/tier.rs: Tier::{name} is not a read / offer / health / close \
                 method: put a tier's own feature behind its handle (TierContext::provide)"
            ));
        }
    }
    for name in pub_methods(&cache) {
        if SHARED_TIER_WORDS.iter().any(|w| name.contains(w)) {
            out.push(format!(
                "cache-core/src/cache/mod.rs: Cache::{name} names a shared tier's feature: it \
                 belongs behind that tier's handle"
            ));
        }
    }
    Ok(out)
}

/// The methods declared in `pub trait NAME` of `text`.
pub(crate) fn trait_methods(text: &str, name: &str) -> Vec<String> {
    let code = blank(text);
    let Some(start) = code.find(&format!("pub trait {name}")) else {
        return Vec::new();
    };
    let body = &code[start..];
    let Some(open) = body.find('{') else {
        return Vec::new();
    };
    let mut depth = 0usize;
    let mut out = Vec::new();
    let mut line_start = true;
    for (i, ch) in body[open..].char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            '\n' => line_start = true,
            c if c.is_whitespace() => {}
            _ if line_start && depth == 1 => {
                line_start = false;
                if let Some(name) = fn_name(body[open + i..].lines().next().unwrap_or_default()) {
                    out.push(name.to_owned());
                }
            }
            _ => line_start = false,
        }
    }
    out
}

/// The names of the `pub fn`s of `text` (methods of its impls among them).
fn pub_methods(text: &str) -> Vec<String> {
    blank(text)
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with("pub fn "))
        .filter_map(|l| fn_name(l).map(str::to_owned))
        .collect()
}

/// The crates that promise no I/O (ARCHITECTURE.md).
const PURE_CRATES: [&str; 2] = ["cache-format", "cache-migrate"];

/// What reaches a file, the network, another process or the environment.
const IO_PATHS: [&str; 8] = [
    "std::fs",
    "std::net",
    "std::env",
    "std::process",
    "std::os::unix::net",
    "File::",
    "OpenOptions",
    "TcpStream",
];

/// The I/O calls of `text` outside comments and strings (test modules included: the crate's
/// tests would still pass with a file read hidden there, so none is allowed), with their
/// line.
pub(crate) fn io_calls(text: &str) -> Vec<(&'static str, usize)> {
    let code = blank(text);
    let mut out = Vec::new();
    for (i, line) in code.lines().enumerate() {
        let squeezed: String = line.split_whitespace().collect();
        for path in IO_PATHS {
            if squeezed.contains(path) {
                out.push((path, i + 1));
            }
        }
    }
    out
}

/// The public functions of `text` (see the module docs) whose return type is a `Result` with
/// `String` as its error: name and line (1-based).
pub(crate) fn string_errors(text: &str) -> Vec<(String, usize)> {
    let code = blank(text);
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut test_depth: Option<usize> = None;
    let mut pending_test = false;
    // The depth inside a `pub trait`'s braces, while in one.
    let mut trait_depth: Option<usize> = None;
    let mut pending_trait = false;
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") {
            pending_test = true;
        }
        if trimmed.starts_with("pub trait ") {
            pending_trait = true;
        }
        let public = trimmed.starts_with("pub ")
            || (trait_depth == Some(depth) && !trimmed.starts_with("pub("));
        if test_depth.is_none()
            && public
            && let Some(name) = fn_name(trimmed)
            && returns_string_error(&signature(&lines[i..]))
        {
            out.push((name.to_owned(), i + 1));
        }
        for ch in line.chars() {
            match ch {
                '{' => {
                    depth += 1;
                    if pending_test && test_depth.is_none() {
                        test_depth = Some(depth);
                        pending_test = false;
                    }
                    if pending_trait && trait_depth.is_none() {
                        trait_depth = Some(depth);
                        pending_trait = false;
                    }
                }
                '}' => {
                    if test_depth == Some(depth) {
                        test_depth = None;
                    }
                    if trait_depth == Some(depth) {
                        trait_depth = None;
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

/// The signature starting at `lines[0]`, up to its body's `{` or its `;`, on one line.
fn signature(lines: &[&str]) -> String {
    let mut sig = String::new();
    for line in lines {
        for ch in line.chars() {
            if ch == '{' || ch == ';' {
                return sig;
            }
            sig.push(ch);
        }
        sig.push(' ');
    }
    sig
}

/// The return type of `sig`: after its own `->` (not one of a closure type among its
/// arguments), up to its `where` clause.
fn return_type(sig: &str) -> Option<&str> {
    let b = sig.as_bytes();
    let mut level = 0usize;
    let mut i = 0;
    let mut arrow = None;
    while i < b.len() {
        match b[i] {
            b'-' if b.get(i + 1) == Some(&b'>') => {
                if level == 0 {
                    arrow = Some(i + 2);
                }
                i += 1;
            }
            b'(' | b'<' | b'[' => level += 1,
            b')' | b'>' | b']' => level = level.saturating_sub(1),
            _ => {}
        }
        if arrow.is_some() && level == 0 && sig[i..].starts_with(" where ") {
            return arrow.map(|a| &sig[a..i]);
        }
        i += 1;
    }
    arrow.map(|a| &sig[a..])
}

/// Whether the return type of `sig` is a `Result` whose error is `String`.
fn returns_string_error(sig: &str) -> bool {
    let Some(ret) = return_type(sig) else {
        return false;
    };
    let ret: String = ret.split_whitespace().collect();
    let Some(start) = ret.find("Result<") else {
        return false;
    };
    // The top-level arguments of the `Result<...>` (a trailing comma allowed).
    let inner = &ret[start + "Result<".len()..];
    let mut level = 0usize;
    let mut args = Vec::new();
    let mut from = 0;
    for (i, ch) in inner.char_indices() {
        match ch {
            '<' | '(' | '[' => level += 1,
            '>' | ')' | ']' if level == 0 => {
                args.push(&inner[from..i]);
                break;
            }
            '>' | ')' | ']' => level -= 1,
            ',' if level == 0 => {
                args.push(&inner[from..i]);
                from = i + 1;
            }
            _ => {}
        }
    }
    args.retain(|a| !a.is_empty());
    args.len() == 2 && matches!(args[1], "String" | "std::string::String")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_public_function_returns_a_string_error() {
        let violations = check(&crate::project_root()).expect("the workspace is readable");
        assert!(violations.is_empty(), "{violations:#?}");
    }

    #[test]
    fn a_planted_tier_method_is_found() {
        let text = "\
pub trait Tier: Send {
    fn name(&self) -> &'static str;
    fn get_many(&self) -> Vec<u8> {
        Vec::new()
    }
    fn fleet_claim(&self) -> Option<u8> { None }
}
pub trait Other { fn x(&self); }
";
        assert_eq!(
            trait_methods(text, "Tier"),
            ["name", "get_many", "fleet_claim"]
        );
        assert_eq!(
            pub_methods("impl Cache {\n    pub fn fleet_view(&self) {}\n    fn pull(&self) {}\n}"),
            ["fleet_view"]
        );
    }

    #[test]
    fn a_planted_environment_read_is_found_outside_tests_comments_and_strings() {
        let text = r#"
fn remote() -> Option<String> {
    // std::env::var("X") in a comment is no read
    let _ = "std::env::var(\"Y\")";
    std::env::var("TUNECACHE_REMOTE").ok()
}
fn log() { let _ = EnvFilter::try_from_env("TUNECACHE_LOG"); }
#[cfg(test)]
mod tests {
    fn t() { let _ = std::env::var_os("ANY"); }
}
fn after() { let _ = std::env :: var_os("Z"); }
"#;
        let found: Vec<usize> = env_reads(text).into_iter().map(|(_, l)| l).collect();
        assert_eq!(found, [5, 7, 12], "{:?}", env_reads(text));
    }

    #[test]
    fn a_planted_io_call_is_found_outside_comments_and_strings() {
        let text = "\
use std::fs;
fn host() -> String {
    // std::fs::read is not called here
    let _ = \"std::env::var\";
    std :: env :: var(\"HOSTNAME\").unwrap_or_default()
}
";
        assert_eq!(io_calls(text), [("std::fs", 1), ("std::env", 5)]);
        assert!(io_calls("let x = now_millis();").is_empty());
    }

    #[test]
    fn a_planted_string_error_is_found_and_private_or_typed_ones_are_not() {
        let text = "\
pub fn bad(x: u32) -> Result<u32, String> {
    Ok(x)
}
pub fn spread(
    x: u32,
) -> Result<
    Vec<(u32, String)>,
    String,
> {
    Ok(vec![])
}
pub(crate) fn inner() -> Result<(), String> { Ok(()) }
fn private() -> Result<(), String> { Ok(()) }
pub fn typed() -> Result<Vec<String>, std::io::Error> { Ok(vec![]) }
pub fn anyhow_like() -> anyhow::Result<Vec<String>> { Ok(vec![]) }
pub fn text() -> String { String::new() } // -> Result<(), String>
pub fn coded<F>(run: F) -> Self
where
    F: Fn(&mut View) -> Result<(), String>,
{
    Self
}
pub fn closure(f: impl Fn() -> Result<(), String>) -> Result<(), Error> { Ok(()) }
pub trait Op {
    fn prepare(&self) -> Result<(), String>;
    fn run(&self) -> Result<(), Error> { Ok(()) }
}
trait Private {
    fn hidden(&self) -> Result<(), String>;
}
#[cfg(test)]
mod tests {
    pub fn helper() -> Result<(), String> { Ok(()) }
}
";
        let found: Vec<String> = string_errors(text).into_iter().map(|(n, _)| n).collect();
        assert_eq!(found, ["bad", "spread", "prepare"]);
    }
}
