//! PyTorch Inductor AutoHeuristic collection files (IMPORTS.md, "PyTorch Inductor
//! AutoHeuristic").
//!
//! What `TORCHINDUCTOR_AUTOHEURISTIC_COLLECT=<op>` writes: line 1 is JSON metadata (`name`,
//! `device_capa`, `shared_memory`, `numerical_features`, `categorical_features`), line 2 a CSV
//! header, then one row per measurement: the problem's features, `choice`, and `feedback` (the
//! time in ms). Rows repeating a (problem, choice) are repeated measurements. Each problem
//! becomes an entry of namespace `inductor/<name>`, key the columns before `choice` (numerical
//! features as integers, the others as text), scope `{"arch": "sm<major><minor>",
//! "shared_memory": <bytes>}`; each choice a candidate: `triton` with its `BLOCK-M`,
//! `BLOCK-K`, `BLOCK-N`, `numstages` and `numwarps` as params for
//! `type=triton_BLOCK-M=.._...`, otherwise the choice's name (`extern_mm`: cuBLAS), measured
//! from its finite times (median, minimum, median absolute deviation, count), or failed when
//! every time is `inf` (Inductor's mark of a benchmark that failed). Blank lines are skipped;
//! any other row that does not fit is an error naming its line.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use cache_core::cache_format::{
    Candidate, CandidateId, Entry, Fields, Fingerprint, Key, Origin, Outcome, Scope, Value,
};

use crate::files::{find, open, relative};
use crate::kernel_tuner::stats_of;
use crate::tree::{Json, parse};
use crate::{ImportOptions, ImportSourceError, ImportSummary, scope_with};

/// The longest line read (a row is a few hundred bytes; the metadata under a kilobyte).
const MAX_LINE: u64 = 1 << 16;

/// The prefix of a Triton choice; the rest is `NAME=VALUE` parts joined by `_`.
const TRITON: &str = "type=triton_";

pub(crate) fn import(
    root: &Path,
    options: &ImportOptions,
    sink: &mut dyn FnMut(&Scope, &str, Entry),
    _summary: &mut ImportSummary,
) -> Result<usize, ImportSourceError> {
    let paths = find(
        root,
        0,
        &|n: &str| n.ends_with(".txt") || n.ends_with(".csv"),
        "AutoHeuristic collection files (.txt or .csv)",
    )?;
    for path in &paths {
        read_file(root, path, options, sink)?;
    }
    Ok(paths.len())
}

/// The problems of one file: key fields to their choices' times in ms, in file order of
/// first appearance per choice.
type Problems = BTreeMap<Vec<(String, Value)>, BTreeMap<String, Vec<f64>>>;

fn read_file(
    root: &Path,
    path: &Path,
    options: &ImportOptions,
    sink: &mut dyn FnMut(&Scope, &str, Entry),
) -> Result<(), ImportSourceError> {
    let (file, mtime) = open(path)?;
    let mut reader = BufReader::with_capacity(1 << 16, file);
    let mut buf = Vec::new();
    let mut number = 0usize;
    let mut meta: Option<(Scope, String, Vec<String>)> = None;
    let mut header: Option<Vec<String>> = None;
    let mut problems = Problems::new();
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
        let bad = |what: String| ImportSourceError::at(path, number, what);
        if n as u64 > MAX_LINE {
            return Err(bad(format!(
                "a line longer than {MAX_LINE} bytes (not an AutoHeuristic row)"
            )));
        }
        let line = std::str::from_utf8(&buf).map_err(|_| bad("is not UTF-8 text".into()))?;
        let line = line.trim_end_matches(['\n', '\r']);
        let Some((_, _, numerical)) = &meta else {
            meta = Some(metadata(line, options).map_err(bad)?);
            continue;
        };
        let Some(columns) = &header else {
            header = Some(header_of(line, numerical).map_err(bad)?);
            continue;
        };
        if line.trim().is_empty() {
            continue;
        }
        let (key, choice, ms) = row(line, columns, numerical).map_err(bad)?;
        problems
            .entry(key)
            .or_default()
            .entry(choice)
            .or_default()
            .push(ms);
    }
    let Some((scope, name, _)) = meta else {
        return Err(ImportSourceError::whole(
            path,
            "is empty (an AutoHeuristic file starts with a line of JSON metadata)",
        ));
    };
    let origin = Origin::Imported(format!("autoheuristic {}", relative(root, path)));
    let ns = options
        .namespace
        .clone()
        .unwrap_or_else(|| format!("inductor/{name}"));
    for (key, choices) in problems {
        let candidates = choices.into_iter().filter_map(|(choice, times)| {
            let finite: Vec<f64> = times.into_iter().filter(|t| t.is_finite()).collect();
            if finite.is_empty() {
                // Inductor records a benchmark that failed as `inf`.
                let failed = Outcome::Failed("AutoHeuristic: an infinite time (failed)".to_owned());
                return Some(Candidate::new(candidate_id(&choice), failed));
            }
            // Every time was checked non-negative, so each choice has its stats.
            let stats = stats_of(&finite)?;
            let policy = Fields::from([
                ("timer".to_owned(), Value::from("autoheuristic")),
                ("samples".to_owned(), Value::Int(i64::from(stats.samples))),
            ]);
            let mut c =
                Candidate::new(candidate_id(&choice), Outcome::Measured(stats)).with_policy(policy);
            c.measured_at = mtime;
            Some(c)
        });
        let entry = Entry::new(
            Key::new(Fields::from_iter(key)),
            Fingerprint::default(),
            origin.clone(),
            mtime,
            candidates,
        );
        sink(&scope, &ns, entry);
    }
    Ok(())
}

/// The scope, op name and numerical feature names of the metadata line.
fn metadata(line: &str, options: &ImportOptions) -> Result<(Scope, String, Vec<String>), String> {
    let not = "the first line is not AutoHeuristic's JSON metadata";
    let doc = parse(line).map_err(|e| format!("{not}: {e}"))?;
    let name = doc
        .get("name")
        .and_then(|n| n.as_str())
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
        .ok_or_else(|| format!("{not}: no op \"name\" (letters, digits, '_')"))?
        .to_owned();
    let capa = match doc.get("device_capa").map(|c| &c.value) {
        Some(Json::Array(items)) if items.len() == 2 => {
            let (major, minor) = (items[0].as_int(), items[1].as_int());
            match (major, minor) {
                (Some(a), Some(b)) if (0..100).contains(&a) && (0..10).contains(&b) => {
                    format!("sm{a}{b}")
                }
                _ => return Err(format!("{not}: \"device_capa\" is not [major, minor]")),
            }
        }
        _ => return Err(format!("{not}: no \"device_capa\" [major, minor]")),
    };
    let mut fields = Fields::from([("arch".to_owned(), Value::from(capa.as_str()))]);
    if let Some(bytes) = doc.get("shared_memory").and_then(|s| s.as_int()) {
        fields.insert("shared_memory".to_owned(), Value::Int(bytes));
    }
    let numerical = match doc.get("numerical_features").map(|n| &n.value) {
        Some(Json::Array(items)) => items
            .iter()
            .map(|i| i.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| format!("{not}: \"numerical_features\" is not a list of names"))?,
        _ => return Err(format!("{not}: no \"numerical_features\"")),
    };
    Ok((scope_with(fields, options), name, numerical))
}

/// The header's columns, checked: unique names, `choice` then `feedback` last.
fn header_of(line: &str, numerical: &[String]) -> Result<Vec<String>, String> {
    let columns: Vec<String> = line.split(',').map(|c| c.trim().to_owned()).collect();
    let n = columns.len();
    if n < 3 || columns[n - 2] != "choice" || columns[n - 1] != "feedback" {
        return Err("the CSV header does not end with choice,feedback".to_owned());
    }
    for (i, c) in columns.iter().enumerate() {
        if c.is_empty() || columns[..i].contains(c) {
            return Err(format!("the CSV header names {c:?} twice or not at all"));
        }
    }
    if let Some(missing) = numerical.iter().find(|f| !columns.contains(f)) {
        return Err(format!(
            "the CSV header lacks the numerical feature {missing:?}"
        ));
    }
    Ok(columns)
}

type Row = (Vec<(String, Value)>, String, f64);

/// One row: its key fields, its choice and its time in ms.
fn row(line: &str, columns: &[String], numerical: &[String]) -> Result<Row, String> {
    let cells: Vec<&str> = line.split(',').map(str::trim).collect();
    if cells.len() != columns.len() {
        return Err(format!(
            "a row of {} fields under a header of {}",
            cells.len(),
            columns.len()
        ));
    }
    let n = cells.len();
    let mut key = Vec::with_capacity(n - 2);
    for (name, cell) in columns[..n - 2].iter().zip(&cells) {
        let value = if numerical.contains(name) {
            Value::Int(
                cell.parse::<i64>()
                    .map_err(|_| format!("{name} is {cell:?}, not an integer"))?,
            )
        } else {
            // A categorical True or False is a flag: a key differing in it is a neighbour one
            // unit away (a layout), not a stranger (gpu_tuner's key distance).
            match *cell {
                "True" => Value::Bool(true),
                "False" => Value::Bool(false),
                other => Value::from(other),
            }
        };
        key.push((name.clone(), value));
    }
    let choice = cells[n - 2];
    if choice.is_empty() {
        return Err("a row with no choice".to_owned());
    }
    let ms: f64 = cells[n - 1]
        .parse()
        .ok()
        .filter(|t: &f64| !t.is_nan() && *t >= 0.0)
        .ok_or_else(|| format!("feedback {:?} is not a time in ms", cells[n - 1]))?;
    Ok((key, choice.to_owned(), ms))
}

/// The candidate a choice names: `triton` with integer params, or the choice itself.
pub(crate) fn candidate_id(choice: &str) -> CandidateId {
    if let Some(rest) = choice.strip_prefix(TRITON) {
        let params: Option<Fields> = rest
            .split('_')
            .map(|part| {
                let (name, value) = part.split_once('=')?;
                Some((name.to_owned(), Value::Int(value.parse().ok()?)))
            })
            .collect::<Option<Vec<_>>>()
            .map(Fields::from_iter);
        if let Some(params) = params.filter(|p| !p.is_empty()) {
            return CandidateId::with_params("triton", params);
        }
    }
    CandidateId::new(choice, &[])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_become_candidates_with_their_parameters() {
        let id =
            candidate_id("type=triton_BLOCK-M=128_BLOCK-K=-1_BLOCK-N=32_numstages=3_numwarps=4");
        assert_eq!(id.algorithm, "triton");
        assert_eq!(id.params.get("BLOCK-K"), Some(&Value::Int(-1)));
        assert_eq!(id.params.get("numwarps"), Some(&Value::Int(4)));
        assert_eq!(id.params.len(), 5);
        for plain in ["extern_mm", "orig", "type=triton_", "type=triton_BLOCK-M=x"] {
            let id = candidate_id(plain);
            assert_eq!(id.algorithm, plain);
            assert!(id.params.is_empty());
        }
    }

    #[test]
    fn metadata_header_and_rows_are_checked() {
        let options = ImportOptions::default();
        let meta = r#"{"shared_memory": 166912, "device_capa": [8, 0], "name": "mm", "numerical_features": ["m", "k"], "categorical_features": ["dtype"]}"#;
        let (scope, name, numerical) = metadata(meta, &options).expect("metadata");
        assert_eq!(name, "mm");
        assert_eq!(scope.fields().get("arch"), Some(&Value::from("sm80")));
        assert_eq!(
            scope.fields().get("shared_memory"),
            Some(&Value::Int(166_912))
        );
        for bad in [
            "m,k,choice,feedback",
            "{}",
            r#"{"name": "mm", "device_capa": [8], "numerical_features": []}"#,
            r#"{"name": "m m", "device_capa": [8, 0], "numerical_features": []}"#,
        ] {
            assert!(metadata(bad, &options).is_err(), "{bad}");
        }
        let columns = header_of("m,k,dtype,choice,feedback", &numerical).expect("header");
        let (key, choice, ms) =
            row("64,128,torch.float16,extern_mm,0.25", &columns, &numerical).expect("row");
        assert_eq!(key[0], ("m".to_owned(), Value::Int(64)));
        assert_eq!(key[2], ("dtype".to_owned(), Value::from("torch.float16")));
        assert_eq!((choice.as_str(), ms), ("extern_mm", 0.25));
        let (_, _, ms) =
            row("64,128,torch.float16,extern_mm,inf", &columns, &numerical).expect("row");
        assert!(ms.is_infinite(), "a failed benchmark");
        // True and False are flags; other text stays text.
        let numerical = vec!["m".to_owned()];
        let columns = header_of("m,contig,tf32,choice,feedback", &numerical).expect("header");
        let (key, ..) =
            row("64,False,not_float_32,extern_mm,1", &columns, &numerical).expect("row");
        assert_eq!(key[1], ("contig".to_owned(), Value::Bool(false)));
        assert_eq!(key[2], ("tf32".to_owned(), Value::from("not_float_32")));
        let (key, ..) = row("64,True,true,extern_mm,1", &columns, &numerical).expect("row");
        assert_eq!(key[1], ("contig".to_owned(), Value::Bool(true)));
        assert_eq!(
            key[2],
            ("tf32".to_owned(), Value::from("true")),
            "only as written"
        );
        for bad in [
            "64,128,torch.float16,extern_mm",
            "64.5,128,torch.float16,extern_mm,0.25",
            "64,128,torch.float16,extern_mm,-1",
            "64,128,torch.float16,extern_mm,-inf",
            "64,128,torch.float16,extern_mm,NaN",
            "64,128,torch.float16,,0.25",
        ] {
            assert!(row(bad, &columns, &numerical).is_err(), "{bad}");
        }
        for bad in [
            "m,k,dtype,feedback,choice",
            "m,m,choice,feedback",
            "k,choice,feedback",
        ] {
            assert!(header_of(bad, &numerical).is_err(), "{bad}");
        }
    }
}
