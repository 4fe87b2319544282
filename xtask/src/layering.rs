//! The layering check: the crate map of ARCHITECTURE.md, enforced from `cargo metadata`, and
//! no new cycle among a crate's modules (`module_cycles.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};
use serde_json::Value;

/// The layers, lowest first. A crate may depend (normally, not for tests) only on crates in
/// lower layers.
pub(crate) const LAYERS: [&str; 10] = [
    "cache-format",
    "cache-migrate",
    "cache-core",
    "cache-import",
    "cache-remote",
    "cache-outputs",
    "gpu-tuner",
    "cache-cli",
    "tunecache-python",
    "tunecache-capi",
];

/// The only crate allowed to depend on cudarc; every crate below it must not reach cudarc.
const GPU_CRATE: &str = "gpu-tuner";

/// The network client: only the shared tier's crate and those above it may reach it (the
/// store opens no socket).
const NET_CRATE: &str = "redis";
const NET_LAYER: &str = "cache-remote";

/// Test helpers: a dev-dependency only, never a normal one.
const TEST_CRATE: &str = "test-support";

pub(crate) fn run(root: &Path) -> anyhow::Result<()> {
    let mut violations = check(root)?;
    violations.extend(crate::module_cycles::check(root)?);
    if violations.is_empty() {
        println!(
            "layering ok: {}; no module cycle in any library crate",
            LAYERS.join(" < ")
        );
        Ok(())
    } else {
        bail!("layering violated:\n  {}", violations.join("\n  "))
    }
}

/// Returns every violation found, one line each.
pub(crate) fn check(root: &Path) -> anyhow::Result<Vec<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--locked",
            "--manifest-path",
        ])
        .arg(root.join("Cargo.toml"))
        .output()
        .context("cannot run cargo metadata")?;
    if !output.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let meta: Value =
        serde_json::from_slice(&output.stdout).context("cargo metadata printed invalid JSON")?;
    Ok(violations(&meta))
}

fn violations(meta: &Value) -> Vec<String> {
    let mut names: BTreeMap<&str, &str> = BTreeMap::new(); // package id -> name
    for p in meta["packages"].as_array().into_iter().flatten() {
        if let (Some(id), Some(name)) = (p["id"].as_str(), p["name"].as_str()) {
            names.insert(id, name);
        }
    }
    // Normal (non-dev, non-build) dependency edges by package name.
    let mut edges: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for node in meta["resolve"]["nodes"].as_array().into_iter().flatten() {
        let Some(from) = node["id"].as_str().and_then(|id| names.get(id)) else {
            continue;
        };
        for dep in node["deps"].as_array().into_iter().flatten() {
            let normal = dep["dep_kinds"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|k| k["kind"].is_null());
            if let (true, Some(to)) = (normal, dep["pkg"].as_str().and_then(|id| names.get(id))) {
                edges.entry(from).or_default().insert(to);
            }
        }
    }
    let layer = |name: &str| LAYERS.iter().position(|l| *l == name);
    let mut out = Vec::new();
    for (from, tos) in &edges {
        let from_layer = layer(from);
        for to in tos {
            if let (Some(from_layer), Some(to_layer)) = (from_layer, layer(to))
                && to_layer >= from_layer
            {
                out.push(format!(
                    "{from} depends on {to}, which is not in a lower layer"
                ));
            }
            if *to == TEST_CRATE {
                out.push(format!(
                    "{from} depends on {TEST_CRATE} normally; it may only be a dev-dependency"
                ));
            }
            if *to == "cudarc" && *from != GPU_CRATE {
                out.push(format!(
                    "{from} depends on cudarc directly; only {GPU_CRATE} may"
                ));
            }
        }
    }
    for (leak, owner) in [("cudarc", GPU_CRATE), (NET_CRATE, NET_LAYER)] {
        for below in &LAYERS[..LAYERS.iter().position(|l| *l == owner).unwrap_or(0)] {
            if let Some(path) = path_to(&edges, below, leak) {
                out.push(format!(
                    "{leak} is reachable from {below}: {}",
                    path.join(" -> ")
                ));
            }
        }
    }
    out
}

/// A dependency path from `from` to `to`, if there is one.
fn path_to<'a>(
    edges: &BTreeMap<&'a str, BTreeSet<&'a str>>,
    from: &'a str,
    to: &str,
) -> Option<Vec<&'a str>> {
    let mut stack = vec![vec![from]];
    let mut seen = BTreeSet::new();
    while let Some(path) = stack.pop() {
        let last = *path.last().expect("paths are never empty");
        if last == to {
            return Some(path);
        }
        if !seen.insert(last) {
            continue;
        }
        for next in edges.get(last).into_iter().flatten() {
            let mut longer = path.clone();
            longer.push(next);
            stack.push(longer);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workspace_respects_its_layering() {
        let violations = check(&crate::project_root()).expect("cargo metadata runs");
        assert!(violations.is_empty(), "{violations:#?}");
    }

    fn fake_metadata(edges: &[(&str, &str)]) -> Value {
        let mut pkgs: BTreeSet<&str> = BTreeSet::new();
        for (a, b) in edges {
            pkgs.insert(a);
            pkgs.insert(b);
        }
        let packages: Vec<Value> = pkgs
            .iter()
            .map(|p| serde_json::json!({"id": format!("id-{p}"), "name": p}))
            .collect();
        let nodes: Vec<Value> = pkgs
            .iter()
            .map(|p| {
                let deps: Vec<Value> = edges
                    .iter()
                    .filter(|(a, _)| a == p)
                    .map(|(_, b)| serde_json::json!({"pkg": format!("id-{b}"), "dep_kinds": [{"kind": null}]}))
                    .collect();
                serde_json::json!({"id": format!("id-{p}"), "deps": deps})
            })
            .collect();
        serde_json::json!({"packages": packages, "resolve": {"nodes": nodes}})
    }

    #[test]
    fn an_upward_edge_and_a_gpu_leak_are_caught() {
        let v = violations(&fake_metadata(&[
            ("cache-format", "cache-core"),
            ("cache-core", "helper"),
            ("helper", "cudarc"),
        ]));
        assert!(
            v.iter()
                .any(|l| l.contains("cache-format depends on cache-core")),
            "{v:?}"
        );
        assert!(
            v.iter().any(|l| l
                .contains("cudarc is reachable from cache-core: cache-core -> helper -> cudarc")),
            "{v:?}"
        );
        let ok = violations(&fake_metadata(&[
            ("gpu-tuner", "cudarc"),
            ("gpu-tuner", "cache-core"),
            ("cache-cli", "gpu-tuner"),
        ]));
        assert!(ok.is_empty(), "{ok:?}");
    }

    #[test]
    fn the_store_never_reaches_the_network_client() {
        let v = violations(&fake_metadata(&[
            ("cache-core", "helper"),
            ("helper", "redis"),
            ("cache-remote", "redis"),
        ]));
        assert_eq!(
            v,
            ["redis is reachable from cache-core: cache-core -> helper -> redis"],
            "cache-remote may use it, cache-core may not"
        );
    }

    #[test]
    fn test_support_is_only_ever_a_dev_dependency() {
        let v = violations(&fake_metadata(&[("cache-core", "test-support")]));
        assert!(
            v.iter()
                .any(|l| l.contains("cache-core depends on test-support normally")),
            "{v:?}"
        );
    }
}
