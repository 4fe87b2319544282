//! XLA autotune results in protobuf text format (IMPORTS.md, "XLA").
//!
//! `--xla_gpu_dump_autotune_results_to=<file>.txt|.textproto` writes an `AutotuneResults`:
//! `version`, then entries (`results` from version 3, `dots` and `convs` before) of `device`,
//! `hlo` (the fusion's text) and `result` (`run_time`, `scratch_bytes`, `failure`, and the
//! chosen backend's key: `triton`, `gemm`, `conv`, `cuda_conv_plan`, `algorithm`,
//! `custom_kernel_fusion`). Each entry becomes an entry of namespace `xla/<list>` (`xla/results`,
//! `xla/dots`, `xla/convs`), key `{"hlo": <text>}`, scope `{"device": <device>,
//! "xla.autotune_version": <version>}`, one candidate named by the backend with its key's
//! fields as params: measured by `run_time` (one sample, policy `{"timer": "xla"}`), failed
//! with `failure`, chosen without either. The binary form (`.pb`) needs the schema compiled
//! in and is refused: dump to a `.textproto` name instead.

use std::path::Path;

use cache_core::cache_format::{
    Candidate, CandidateId, Entry, Fields, Fingerprint, Key, Origin, Outcome, Scope, Stats, Value,
};

use crate::files::{find, read_text, relative};
use crate::textproto::{Field, Message, parse};
use crate::{ImportOptions, ImportSourceError, ImportSummary, scope_with};

/// The backends an `AutotuneResult` names its choice by (its `key` oneof).
const BACKENDS: [&str; 6] = [
    "triton",
    "gemm",
    "conv",
    "cuda_conv_plan",
    "algorithm",
    "custom_kernel_fusion",
];

fn is_results_file(name: &str) -> bool {
    [".txt", ".textproto", ".pbtxt", ".pb"]
        .iter()
        .any(|s| name.ends_with(s))
}

pub(crate) fn import(
    root: &Path,
    options: &ImportOptions,
    sink: &mut dyn FnMut(&Scope, &str, Entry),
    summary: &mut ImportSummary,
) -> Result<usize, ImportSourceError> {
    let paths = find(
        root,
        0,
        &is_results_file,
        "XLA autotune results (.textproto, .txt, .pbtxt)",
    )?;
    for path in &paths {
        if path.extension().is_some_and(|e| e == "pb") {
            return Err(ImportSourceError::whole(
                path,
                "is binary protobuf, which needs XLA's schema compiled in; dump the results to a .textproto name (--xla_gpu_dump_autotune_results_to=results.textproto)",
            ));
        }
        let (text, mtime) = read_text(path)?;
        let doc = parse(&text).map_err(|e| ImportSourceError::at(path, e.line, e.what))?;
        let version = doc.int("version").ok_or_else(|| {
            ImportSourceError::at(path, 1, "has no version (not XLA autotune results)")
        })?;
        // The versions whose layout is known (IMPORTS.md): another is not read as if it were
        // one of them.
        if !(1..=3).contains(&version) {
            return Err(ImportSourceError::at(
                path,
                doc.line,
                format!(
                    "has version {version}; versions 1 to 3 of XLA's autotune results are read"
                ),
            ));
        }
        let origin = Origin::Imported(format!("xla {}", relative(root, path)));
        let mut entries = 0;
        for list in ["results", "dots", "convs"] {
            for item in doc.all(list) {
                let Field::Message(item) = item else {
                    return Err(ImportSourceError::at(
                        path,
                        doc.line,
                        format!("{list} is not a message"),
                    ));
                };
                let (scope, entry) = read_entry(path, item, version, &origin, mtime, options)?;
                sink(&scope, &format!("xla/{list}"), entry);
                entries += 1;
            }
        }
        if entries == 0 {
            summary.note(format!("{}: no results", path.display()));
        }
    }
    Ok(paths.len())
}

fn read_entry(
    path: &Path,
    item: &Message,
    version: i64,
    origin: &Origin,
    at: u64,
    options: &ImportOptions,
) -> Result<(Scope, Entry), ImportSourceError> {
    let bad = |what: &str| ImportSourceError::at(path, item.line, what);
    let device = item
        .string("device")
        .ok_or_else(|| bad("an entry has no device"))?;
    let hlo = item
        .string("hlo")
        .ok_or_else(|| bad("an entry has no hlo"))?;
    let result = item
        .message("result")
        .ok_or_else(|| bad("an entry has no result"))?;
    let (backend, params) = BACKENDS
        .iter()
        .find_map(|b| result.message(b).map(|m| (*b, message_fields(m))))
        .unwrap_or(("unknown", Fields::new()));
    let id = CandidateId::with_params(backend, params);
    let outcome = if let Some(failure) = result.message("failure") {
        let kind = match failure.get("kind") {
            Some(Field::Token(t)) => t.clone(),
            _ => "failure".to_owned(),
        };
        let msg = failure.string("msg").unwrap_or_default();
        Outcome::Failed(format!("XLA: {kind} {msg}").trim_end().to_owned())
    } else if let Some(time) = result.message("run_time") {
        let ns =
            time.int("seconds").unwrap_or(0) as f64 * 1e9 + time.int("nanos").unwrap_or(0) as f64;
        if ns < 0.0 {
            return Err(ImportSourceError::at(
                path,
                time.line,
                "a negative run_time",
            ));
        }
        Outcome::Measured(Stats {
            median_ns: ns,
            min_ns: ns,
            spread_ns: 0.0,
            samples: 1,
        })
    } else {
        Outcome::Chosen("xla".into())
    };
    let mut candidate = Candidate::new(id, outcome);
    if candidate.stats().is_some() {
        candidate = candidate.with_policy(Fields::from([("timer".to_owned(), Value::from("xla"))]));
    }
    candidate.measured_at = at;
    let scope = scope_with(
        Fields::from([
            ("device".to_owned(), Value::from(device)),
            ("xla.autotune_version".to_owned(), Value::Int(version)),
        ]),
        options,
    );
    let key = Key::new(Fields::from([("hlo".to_owned(), Value::from(hlo))]));
    Ok((
        scope,
        Entry::new(key, Fingerprint::default(), origin.clone(), at, [candidate]),
    ))
}

/// A message's fields as params: integers, booleans and enum names as they are, strings as
/// text, nested messages as maps; a repeated field a list.
fn message_fields(m: &Message) -> Fields {
    let mut out = Fields::new();
    for (k, v) in &m.fields {
        let value = match v {
            Field::Token(t) => match t.parse::<i64>() {
                Ok(i) => Value::Int(i),
                Err(_) if t == "true" || t == "false" => Value::Bool(t == "true"),
                Err(_) => Value::from(t.as_str()),
            },
            Field::Str(bytes) => Value::from(String::from_utf8_lossy(bytes).as_ref()),
            Field::Message(inner) => Value::Map(message_fields(inner)),
        };
        match out.get_mut(k) {
            Some(Value::List(items)) => items.push(value),
            Some(first) => {
                let first = std::mem::replace(first, Value::Bool(false));
                out.insert(k.clone(), Value::List(vec![first, value]));
            }
            None => {
                out.insert(k.clone(), value);
            }
        }
    }
    out
}
