//! Triton cache directories (IMPORTS.md, "Triton").
//!
//! `<cache dir>/<hash>/<fn>.autotune.json` holds `{"key": [...], "configs_timings":
//! [[<config>, [p50, p20, p80] or ms], ...]}` (Triton's `check_disk_cache`). Each file becomes
//! the entry the Triton adapter records for it (FORMAT.md, "Framework adapters' entries"):
//! namespace `triton/<fn>`, key `{"hash": <hash>}`, one candidate per config named as the
//! adapter names it, the candidate set the adapter's. The tuning key's field names and the
//! device are not in the files: the key has no `tuning` (the adapter falls back to the hash
//! alone) and the scope is what the import is given.

use std::path::Path;

use cache_core::cache_format::{
    Candidate, CandidateId, Entry, Fields, Fingerprint, Key, Origin, Outcome, Scope, Stats, Value,
};

use crate::files::{find, read_text, relative};
use crate::names::params_of;
use crate::tree::{Json, Node, parse};
use crate::{ImportOptions, ImportSourceError, ImportSummary, scope_with};

const SUFFIX: &str = ".autotune.json";

pub(crate) fn import(
    root: &Path,
    options: &ImportOptions,
    sink: &mut dyn FnMut(&Scope, &str, Entry),
    summary: &mut ImportSummary,
) -> Result<usize, ImportSourceError> {
    let paths = find(
        root,
        2,
        &|n: &str| n.ends_with(SUFFIX),
        "Triton autotune files (*.autotune.json)",
    )?;
    if options.scope.is_empty() {
        summary.note(
            "Triton's files do not say the device: the entries have an empty scope (give the scope, e.g. the adapter's default_scope, to serve them)",
        );
    }
    summary.note(
        "Triton's files do not name the tuning key's fields: keys are {\"hash\": <directory>} only",
    );
    let scope = scope_with(Fields::new(), options);
    for path in &paths {
        let (text, mtime) = read_text(path)?;
        let doc = parse(&text).map_err(|e| ImportSourceError::at(path, e.line, e.what))?;
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let function = name.strip_suffix(SUFFIX).unwrap_or(name);
        let hash = path
            .parent()
            .filter(|p| *p != root)
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str())
            .ok_or_else(|| {
                ImportSourceError::whole(
                    path,
                    "is not in a Triton cache directory (<hash>/<fn>.autotune.json)",
                )
            })?;
        let origin = Origin::Imported(format!("triton {}", relative(root, path)));
        let key = Key::new(Fields::from([("hash".to_owned(), Value::from(hash))]));
        let entry = read_doc(path, &doc, key, origin, mtime)?;
        sink(&scope, &format!("triton/{function}"), entry);
    }
    Ok(paths.len())
}

/// The entry the Triton adapter records for one `<fn>.autotune.json` document, `text`, of the
/// key `key` (what Triton wrote, or a file of its cache directory named by `source` in
/// errors): one candidate per config, named as the adapter names it, with Triton's p50, p20
/// and p80, a non-finite or negative time a failure, and the candidate set of every config.
/// The one Triton mapping: the importer above and the Python adapter both use it.
pub fn triton_entry(
    source: &Path,
    text: &str,
    key: Key,
    origin: Origin,
    at: u64,
) -> Result<Entry, ImportSourceError> {
    let doc = parse(text).map_err(|e| ImportSourceError::at(source, e.line, e.what))?;
    read_doc(source, &doc, key, origin, at)
}

fn read_doc(
    path: &Path,
    doc: &Node,
    key: Key,
    origin: Origin,
    at: u64,
) -> Result<Entry, ImportSourceError> {
    let rows = match doc.get("configs_timings").map(|n| &n.value) {
        Some(Json::Array(rows)) if !rows.is_empty() => rows,
        _ => {
            return Err(ImportSourceError::at(
                path,
                doc.line,
                "has no \"configs_timings\" list (not a Triton autotune file)",
            ));
        }
    };
    let mut candidates = Vec::with_capacity(rows.len());
    for row in rows {
        let bad = |what: &str| ImportSourceError::at(path, row.line, what);
        let Json::Array(pair) = &row.value else {
            return Err(bad("a configs_timings row is not [config, timing]"));
        };
        let [config, timing] = &pair[..] else {
            return Err(bad("a configs_timings row is not [config, timing]"));
        };
        let Json::Object(members) = &config.value else {
            return Err(bad("a config is not an object"));
        };
        let plain: Vec<(String, Node)> = members
            .iter()
            .filter(|(_, v)| v.value != Json::Null)
            .cloned()
            .collect();
        let id = CandidateId::with_params(config_name(members), params_of(&plain));
        let (p50, p20, p80) =
            quantiles(timing).ok_or_else(|| bad("a timing is not a number or [p50, p20, p80]"))?;
        let outcome = if !p50.is_finite() || p50 < 0.0 {
            Outcome::Failed(format!("Triton timed it {p50} ms"))
        } else {
            let lo = if p20.is_finite() && p20 >= 0.0 {
                p20.min(p50)
            } else {
                p50
            };
            let hi = if p80.is_finite() && p80 >= lo {
                p80
            } else {
                lo
            };
            Outcome::Measured(Stats {
                median_ns: p50 * 1e6,
                min_ns: lo * 1e6,
                spread_ns: (hi - lo) * 1e6,
                samples: 1,
            })
        };
        let mut c = Candidate::new(id, outcome);
        c.measured_at = at;
        candidates.push(c);
    }
    let set = Fingerprint::of_candidate_set(
        candidates
            .iter()
            .map(|c| (c.id.algorithm.as_str(), &c.id.params)),
        &Fields::new(),
    );
    Ok(Entry::new(key, set, origin, at, candidates))
}

/// The adapter's name of a config: `k=v` of its kwargs by name, then `num_warps`,
/// `num_stages`, `num_ctas`, `maxnreg` where set (Python's `str` of each value).
fn config_name(members: &[(String, Node)]) -> String {
    let mut parts: Vec<String> = Vec::new();
    if let Some((
        _,
        Node {
            value: Json::Object(kwargs),
            ..
        },
    )) = members.iter().find(|(k, _)| k == "kwargs")
    {
        let mut sorted: Vec<&(String, Node)> = kwargs.iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        parts.extend(
            sorted
                .into_iter()
                .map(|(k, v)| format!("{k}={}", python_str(v))),
        );
    }
    for field in ["num_warps", "num_stages", "num_ctas", "maxnreg"] {
        if let Some((_, v)) = members.iter().find(|(k, _)| k == field)
            && v.value != Json::Null
        {
            parts.push(format!("{field}={}", python_str(v)));
        }
    }
    if parts.is_empty() {
        "default".to_owned()
    } else {
        parts.join(",")
    }
}

/// Python's `str()` of a JSON scalar as `json.loads` gives it.
fn python_str(node: &Node) -> String {
    match &node.value {
        Json::Bool(true) => "True".to_owned(),
        Json::Bool(false) => "False".to_owned(),
        Json::Null => "None".to_owned(),
        Json::Number(t) => t.clone(),
        Json::Str(s) => s.clone(),
        Json::Array(_) | Json::Object(_) => {
            let mut out = String::new();
            crate::names::value_json(
                &mut out,
                &crate::names::to_value(node).unwrap_or(Value::from("?")),
            );
            out
        }
    }
}

/// `[p50, p20, p80]` (or a single number) in ms; a non-finite value is kept (a failure).
fn quantiles(node: &Node) -> Option<(f64, f64, f64)> {
    let num = |n: &Node| match &n.value {
        Json::Number(t) => t.parse::<f64>().ok(),
        _ => None,
    };
    match &node.value {
        Json::Array(items) if items.len() >= 3 => {
            Some((num(&items[0])?, num(&items[1])?, num(&items[2])?))
        }
        Json::Array(items) if !items.is_empty() => num(&items[0]).map(|t| (t, t, t)),
        Json::Number(_) => num(node).map(|t| (t, t, t)),
        _ => None,
    }
}
