//! Kernel Tuner cache files (IMPORTS.md, "Kernel Tuner").
//!
//! One JSON document per kernel and device: `device_name`, `kernel_name`, `problem_size`,
//! `tune_params_keys`, `tune_params`, `objective`, and `cache`, a map from the comma-joined
//! parameter values to a record of the parameters and the measured `time` (ms) and `times`.
//! A file Kernel Tuner did not close (a session cut short: no final `}` `}`, maybe a trailing
//! comma) is read as Kernel Tuner reads it. The file is one entry of namespace
//! `kernel_tuner/<kernel_name>`, key `{"problem_size": ...}`, scope `{"device": device_name}`;
//! each record is a candidate `@params` with the tunable parameters as params, measured from
//! `times` (median, minimum, median absolute deviation, their count) or `time`; a record
//! whose time is an error (`InvalidConfig`, `CompilationFailedConfig`, `RuntimeFailedConfig`)
//! is failed.

use std::path::Path;

use cache_core::cache_format::{
    Candidate, CandidateId, Entry, Fields, Fingerprint, Key, Origin, Outcome, Scope, Stats, Value,
};

use crate::files::{find, read_text, relative};
use crate::names::{params_of, to_value};
use crate::tree::{Json, Node, parse};
use crate::{ImportOptions, ImportSourceError, ImportSummary, scope_with};

/// The algorithm of every Kernel Tuner candidate: what varies is the parameters.
pub(crate) const ALGORITHM: &str = "@params";

pub(crate) fn import(
    root: &Path,
    options: &ImportOptions,
    sink: &mut dyn FnMut(&Scope, &str, Entry),
    summary: &mut ImportSummary,
) -> Result<usize, ImportSourceError> {
    let paths = find(
        root,
        0,
        &|n: &str| n.ends_with(".json"),
        "Kernel Tuner cache files (.json)",
    )?;
    for path in &paths {
        let (text, mtime) = read_text(path)?;
        // A complete document is read as it is; only one that does not parse is closed as
        // Kernel Tuner closes it (a complete one without "cache" was called "text after the
        // end of the document").
        let doc = match parse(&text) {
            Ok(doc) => doc,
            Err(_) => {
                parse(&closed(&text)).map_err(|e| ImportSourceError::at(path, e.line, e.what))?
            }
        };
        let origin = Origin::Imported(format!("kernel-tuner {}", relative(root, path)));
        let (scope, ns, entry) = read_doc(path, &doc, options, origin, mtime, summary)?;
        sink(&scope, &ns, entry);
    }
    Ok(paths.len())
}

/// The text as Kernel Tuner reads it: a file not closed gets its trailing comma dropped and
/// the two closing braces added (`correct_open_cache`).
fn closed(text: &str) -> String {
    let t = text.trim();
    if t.is_empty() || t.ends_with("}\n}") || t.ends_with("}}}") {
        return text.to_owned();
    }
    let t = t.strip_suffix(',').unwrap_or(t);
    format!("{t}}}\n}}")
}

fn read_doc(
    path: &Path,
    doc: &Node,
    options: &ImportOptions,
    origin: Origin,
    at: u64,
    summary: &mut ImportSummary,
) -> Result<(Scope, String, Entry), ImportSourceError> {
    let need = |name: &str| {
        doc.get(name).ok_or_else(|| {
            ImportSourceError::at(
                path,
                doc.line,
                format!("has no {name:?} (not a Kernel Tuner cache file)"),
            )
        })
    };
    let text = |name: &str| -> Result<String, ImportSourceError> {
        let node = need(name)?;
        node.as_str().map(str::to_owned).ok_or_else(|| {
            ImportSourceError::at(
                path,
                node.line,
                format!("{name:?} is {}, not a string", node.kind()),
            )
        })
    };
    let device = text("device_name")?;
    let kernel = text("kernel_name")?;
    let cache = need("cache")?;
    let Json::Object(records) = &cache.value else {
        return Err(ImportSourceError::at(
            path,
            cache.line,
            "\"cache\" is not an object",
        ));
    };
    let keys = tune_keys(path, doc)?;
    let mut key = Fields::new();
    if let Some(size) = doc.get("problem_size") {
        let value = to_value(size).ok_or_else(|| {
            ImportSourceError::at(path, size.line, "\"problem_size\" is not integers or text")
        })?;
        key.insert("problem_size", value);
    }
    if doc
        .get("objective")
        .and_then(Node::as_str)
        .is_some_and(|o| o != "time")
    {
        summary.note(format!(
            "{}: the objective is not time; candidates are ranked by their measured time",
            path.display()
        ));
    }
    let mut candidates = Vec::with_capacity(records.len());
    for (_, record) in records {
        let mut c = candidate(path, record, &keys)?;
        c.measured_at = at;
        candidates.push(c);
    }
    // An empty device name says nothing (Kernel Tuner writes one for some HIP devices): the
    // scope's device then comes from --scope, if given.
    let said = if device.trim().is_empty() {
        summary.note(format!(
            "{}: device_name is empty; the device comes from --scope, if given",
            path.display()
        ));
        Fields::new()
    } else {
        Fields::from([("device".to_owned(), Value::from(device))])
    };
    let scope = scope_with(said, options);
    let entry = Entry::new(
        Key::new(key),
        Fingerprint::default(),
        origin,
        at,
        candidates,
    );
    Ok((scope, format!("kernel_tuner/{kernel}"), entry))
}

/// The tunable parameters' names (`tune_params_keys`).
fn tune_keys(path: &Path, doc: &Node) -> Result<Vec<String>, ImportSourceError> {
    let node = doc.get("tune_params_keys").ok_or_else(|| {
        ImportSourceError::at(
            path,
            doc.line,
            "has no \"tune_params_keys\" (not a Kernel Tuner cache file)",
        )
    })?;
    match &node.value {
        Json::Array(items) => items
            .iter()
            .map(|i| {
                i.as_str().map(str::to_owned).ok_or_else(|| {
                    ImportSourceError::at(path, i.line, "a tunable parameter name is not a string")
                })
            })
            .collect(),
        _ => Err(ImportSourceError::at(
            path,
            node.line,
            "\"tune_params_keys\" is not a list",
        )),
    }
}

const ERRORS: [&str; 4] = [
    "ErrorConfig",
    "InvalidConfig",
    "CompilationFailedConfig",
    "RuntimeFailedConfig",
];

fn candidate(path: &Path, record: &Node, keys: &[String]) -> Result<Candidate, ImportSourceError> {
    let bad = |what: String| ImportSourceError::at(path, record.line, what);
    let Json::Object(members) = &record.value else {
        return Err(bad(format!(
            "a cache record is {}, not an object",
            record.kind()
        )));
    };
    let mut params = Vec::with_capacity(keys.len());
    for k in keys {
        let (name, value) = members
            .iter()
            .find(|(n, _)| n == k)
            .ok_or_else(|| bad(format!("a cache record lacks the tunable parameter {k:?}")))?;
        params.push((name.clone(), value.clone()));
    }
    let id = CandidateId::with_params(ALGORITHM, params_of(&params));
    let error = members
        .iter()
        .find_map(|(_, v)| v.as_str().filter(|s| ERRORS.contains(s)));
    if let Some(error) = error {
        return Ok(Candidate::new(
            id,
            Outcome::Failed(format!("Kernel Tuner: {error}")),
        ));
    }
    let times: Vec<f64> = match record.get("times").map(|t| &t.value) {
        Some(Json::Array(items)) => items.iter().filter_map(Node::as_f64).collect(),
        _ => Vec::new(),
    };
    let time = record.get("time").and_then(Node::as_f64);
    let stats = match (stats_of(&times), time) {
        (Some(s), _) => s,
        (None, Some(ms)) if ms >= 0.0 => {
            let ns = ms * 1e6;
            Stats {
                median_ns: ns,
                min_ns: ns,
                spread_ns: 0.0,
                samples: 1,
            }
        }
        _ => {
            return Err(bad(
                "a cache record has no time (a non-negative number of ms) and no error".into(),
            ));
        }
    };
    let policy = Fields::from([
        ("timer".to_owned(), Value::from("kernel-tuner")),
        ("samples".to_owned(), Value::Int(i64::from(stats.samples))),
    ]);
    Ok(Candidate::new(id, Outcome::Measured(stats)).with_policy(policy))
}

/// Median, minimum, median absolute deviation and count of times in ms, as ns; `None` if
/// there are none or one is negative.
pub(crate) fn stats_of(times: &[f64]) -> Option<Stats> {
    if times.is_empty() || times.iter().any(|t| *t < 0.0) {
        return None;
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    };
    let mut sorted = times.to_vec();
    let m = median(&mut sorted);
    let mut dev: Vec<f64> = times.iter().map(|t| (t - m).abs()).collect();
    let mad = median(&mut dev);
    Some(Stats {
        median_ns: m * 1e6,
        min_ns: sorted[0] * 1e6,
        spread_ns: mad * 1e6,
        samples: u32::try_from(times.len()).unwrap_or(u32::MAX),
    })
}
