//! PyTorch TunableOp result files (IMPORTS.md, "PyTorch TunableOp").
//!
//! `tunableop_results*.csv`: `Validator,<NAME>,<value>` lines (the software the results hold
//! for), then one line per tuned operation: `<op>,<params>,<solution>[,<average ms>]`. Each
//! operation line becomes an entry of namespace `tunableop/<op>`, key `{"params": <params>}`,
//! scope the validators, one candidate named by the solution: measured (median the average,
//! one sample, policy `{"timer": "tunableop"}`) when the time is given, else chosen. Read a
//! line at a time: the file is never all in memory.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use cache_core::cache_format::{
    Candidate, CandidateId, Entry, Fields, Fingerprint, Key, Origin, Outcome, Scope, Stats, Value,
};

use crate::files::{find, open, relative};
use crate::{ImportOptions, ImportSourceError, ImportSummary, scope_with};

/// The longest line read: a result line is an op, a params signature, a solution and a time.
const MAX_LINE: u64 = 1 << 20;

/// The policy of TunableOp's times: an average over its tuning iterations.
pub(crate) const TIMER: &str = "tunableop";

fn is_results_file(name: &str) -> bool {
    name.starts_with("tunableop_results") && name.ends_with(".csv")
}

pub(crate) fn import(
    root: &Path,
    options: &ImportOptions,
    sink: &mut dyn FnMut(&Scope, &str, Entry),
    _summary: &mut ImportSummary,
) -> Result<usize, ImportSourceError> {
    let paths = find(
        root,
        0,
        &is_results_file,
        "TunableOp result files (tunableop_results*.csv)",
    )?;
    for path in &paths {
        read_file(root, path, options, sink)?;
    }
    Ok(paths.len())
}

fn read_file(
    root: &Path,
    path: &Path,
    options: &ImportOptions,
    sink: &mut dyn FnMut(&Scope, &str, Entry),
) -> Result<(), ImportSourceError> {
    let (file, mtime) = open(path)?;
    let origin = Origin::Imported(format!("tunableop {}", relative(root, path)));
    let policy = Fields::from([("timer".to_owned(), Value::from(TIMER))]);
    let mut validators = Fields::new();
    let mut scope: Option<Scope> = None;
    let mut reader = BufReader::with_capacity(1 << 16, file);
    let mut buf = Vec::new();
    let mut number = 0usize;
    loop {
        buf.clear();
        let n = (&mut reader)
            .take(MAX_LINE + 1)
            .read_until(b'\n', &mut buf)
            .map_err(|e| ImportSourceError::whole(path, format!("cannot be read: {e}")))?;
        if n == 0 {
            break;
        }
        number += 1;
        if n as u64 > MAX_LINE {
            return Err(ImportSourceError::at(
                path,
                number,
                format!("a line longer than {MAX_LINE} bytes (not a TunableOp result line)"),
            ));
        }
        let bad = |what: String| ImportSourceError::at(path, number, what);
        let line = std::str::from_utf8(&buf).map_err(|_| bad("is not UTF-8 text".into()))?;
        let line = line.trim_end_matches(['\n', '\r']);
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').collect();
        if fields[0] == "Validator" {
            let [_, name, value] = fields[..] else {
                return Err(bad(format!(
                    "a Validator line has {} fields, not 3",
                    fields.len()
                )));
            };
            if scope.is_some() {
                return Err(bad(
                    "a Validator line after the results (validators come first)".into(),
                ));
            }
            if name.is_empty() || validators.insert(name, Value::from(value)).is_some() {
                return Err(bad(format!(
                    "the validator {name:?} is empty or given twice"
                )));
            }
            continue;
        }
        let (op, params, solution, ms) = match fields[..] {
            [op, params, solution] => (op, params, solution, None),
            [op, params, solution, ms] => (op, params, solution, Some(ms)),
            _ => {
                return Err(bad(format!(
                    "{} fields; a result is op,params,solution[,ms]",
                    fields.len()
                )));
            }
        };
        if op.is_empty() || params.is_empty() || solution.is_empty() {
            return Err(bad("an empty op, params or solution".into()));
        }
        let scope = scope.get_or_insert_with(|| scope_with(validators.clone(), options));
        let mut candidate = candidate(solution, ms, &policy).map_err(bad)?;
        candidate.measured_at = mtime;
        let key = Key::new(Fields::from([("params".to_owned(), Value::from(params))]));
        let entry = Entry::new(
            key,
            Fingerprint::default(),
            origin.clone(),
            mtime,
            [candidate],
        );
        sink(scope, &format!("tunableop/{op}"), entry);
    }
    Ok(())
}

/// A result line's candidate: measured when the time is given, chosen when not.
fn candidate(solution: &str, ms: Option<&str>, policy: &Fields) -> Result<Candidate, String> {
    let id = CandidateId::with_params(solution, Fields::new());
    let Some(ms) = ms else {
        return Ok(Candidate::new(id, Outcome::Chosen("tunableop".into())));
    };
    let ms: f64 = ms
        .trim()
        .parse()
        .ok()
        .filter(|m: &f64| m.is_finite() && *m >= 0.0)
        .ok_or_else(|| format!("the time {ms:?} is not a non-negative number of milliseconds"))?;
    let ns = ms * 1e6;
    let stats = Stats {
        median_ns: ns,
        min_ns: ns,
        spread_ns: 0.0,
        samples: 1,
    };
    Ok(Candidate::new(id, Outcome::Measured(stats)).with_policy(policy.clone()))
}
