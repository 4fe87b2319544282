//! The JSON-lines interchange format (FORMAT.md, "JSON lines"): one entry per line,
//! self-contained, so Python or shell tools can read and feed a cache.

use serde::{Deserialize, Serialize};

use crate::candidate::{Candidate, Outcome, Stats};
use crate::clock::Millis;
use crate::fingerprint::Fingerprint;
use crate::model::{CacheData, Entry, Key, Origin, Scope};
use crate::scan::Limits;
use crate::value::Fields;

/// Why a JSON line was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{source_name}: line {line}: {message}")]
pub struct JsonLineError {
    /// The input's name.
    pub source_name: String,
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// What imported entries say about their origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImportOrigin {
    /// Keep the origin each line gives (golden files, round trips).
    Keep,
    /// Mark every entry `imported` from the source, keeping the original in the text.
    MarkImported,
}

macro_rules! bail {
    ($($arg:tt)*) => {
        return Err(format!($($arg)*))
    };
}

/// One line.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonRecord {
    /// The application whose schema the entry is written in (with `schema`); lines without
    /// them are taken to be at the schema of the cache they are imported into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app: Option<String>,
    /// The schema version the entry is written in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<u32>,
    /// The scope's fields.
    pub scope: Fields,
    /// The namespace.
    pub namespace: String,
    /// The key's fields.
    pub key: Fields,
    /// The key fingerprint (hex); checked against the key when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// The candidate-set checksum (hex).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate_set: Option<String>,
    /// When the entry was recorded (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded_at: Option<Millis>,
    /// Where it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<JsonOrigin>,
    /// The candidates, any order (they are ranked on import).
    pub candidates: Vec<JsonCandidate>,
}

/// Where an entry came from.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonOrigin {
    /// `measured`, `imported` or `remote`.
    pub kind: String,
    /// Free-form detail.
    pub from: String,
}

/// One candidate.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonCandidate {
    /// Algorithm name.
    pub algo: String,
    /// Params.
    #[serde(default)]
    pub params: Fields,
    /// `ok`, `chosen` or `failed`.
    #[serde(default = "ok")]
    pub status: String,
    /// Median, ns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub median_ns: Option<f64>,
    /// Fastest sample, ns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_ns: Option<f64>,
    /// Spread (median absolute deviation), ns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread_ns: Option<f64>,
    /// Sample count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<u32>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Who chose it (status `chosen`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chosen_by: Option<String>,
    /// When it was measured (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_at: Option<Millis>,
    /// Time spent preparing and measuring it, ns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuning_ns: Option<u64>,
    /// How it was measured (absent: unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<Fields>,
}

fn ok() -> String {
    "ok".to_owned()
}

/// A candidate as JSON.
pub fn candidate_json(c: &Candidate) -> JsonCandidate {
    let (status, stats, error, chosen_by) = match &c.outcome {
        Outcome::Measured(s) => ("ok", Some(s), None, None),
        Outcome::Failed(r) => ("failed", None, Some(r.clone()), None),
        Outcome::Chosen(by) => ("chosen", None, None, Some(by.clone())),
    };
    JsonCandidate {
        algo: c.id.algorithm.clone(),
        params: c.id.params.clone(),
        status: status.to_owned(),
        median_ns: stats.map(|s| s.median_ns),
        min_ns: stats.map(|s| s.min_ns),
        spread_ns: stats.map(|s| s.spread_ns),
        samples: stats.map(|s| s.samples),
        error,
        chosen_by,
        measured_at: Some(c.measured_at),
        tuning_ns: c.tuning_ns,
        policy: c.policy.clone(),
    }
}

/// An entry as one JSON line's record.
pub fn record(scope: &Scope, namespace: &str, entry: &Entry) -> JsonRecord {
    let candidates = entry.candidates().iter();
    JsonRecord {
        app: None,
        schema: None,
        scope: scope.fields().clone(),
        namespace: namespace.to_owned(),
        key: entry.key().fields().clone(),
        fingerprint: Some(entry.fingerprint().to_hex()),
        candidate_set: Some(entry.candidate_set().to_hex()),
        recorded_at: Some(entry.recorded_at()),
        origin: Some(JsonOrigin {
            kind: entry.origin().kind().to_owned(),
            from: entry.origin().detail().to_owned(),
        }),
        candidates: candidates.map(|c| candidate_json(c)).collect(),
    }
}

fn nonneg(name: &str, v: Option<f64>, algo: &str) -> Result<f64, String> {
    match v {
        Some(x) if x.is_finite() && x >= 0.0 => Ok(x),
        Some(x) => {
            bail!("candidate {algo:?}: {name} must be a finite non-negative number, got {x}")
        }
        None => bail!("candidate {algo:?} has status \"ok\" but no {name}"),
    }
}

/// A candidate from JSON; missing timestamps become `now`.
pub(crate) fn candidate_from_json(c: JsonCandidate, now: Millis) -> Result<Candidate, String> {
    let outcome = match c.status.as_str() {
        "ok" => {
            let median_ns = nonneg("median_ns", c.median_ns, &c.algo)?;
            Outcome::Measured(Stats {
                median_ns,
                min_ns: nonneg("min_ns", c.min_ns.or(Some(median_ns)), &c.algo)?,
                spread_ns: nonneg("spread_ns", c.spread_ns.or(Some(0.0)), &c.algo)?,
                samples: c.samples.unwrap_or(1),
            })
        }
        "failed" => Outcome::Failed(c.error.unwrap_or_default()),
        "chosen" => {
            if c.median_ns.is_some() || c.min_ns.is_some() || c.samples.is_some() {
                bail!(
                    "candidate {:?} has status \"chosen\" but carries timings (a chosen candidate has none; give status \"ok\")",
                    c.algo
                );
            }
            Outcome::Chosen(c.chosen_by.unwrap_or_default())
        }
        other => bail!(
            "candidate {:?}: unknown status {other:?} (expected \"ok\", \"chosen\" or \"failed\")",
            c.algo
        ),
    };
    // An empty algorithm name is accepted, as the file reader accepts it: whatever a cache
    // holds must come back through its own export (commands that record new results refuse
    // empty names).
    Ok(Candidate {
        id: crate::CandidateId::with_params(c.algo, c.params),
        outcome,
        measured_at: c.measured_at.unwrap_or(now),
        tuning_ns: c.tuning_ns,
        policy: c.policy,
    })
}

/// The application and schema a line says it is written in, if it says.
pub type Version = Option<(String, u32)>;

fn parse_versioned(
    line: &str,
    source: &str,
    origin_policy: ImportOrigin,
    now: Millis,
) -> Result<(Version, Scope, String, Entry), String> {
    let r: JsonRecord = serde_json::from_str(line).map_err(|e| e.to_string())?;
    let version = match (r.app.clone(), r.schema) {
        (Some(app), Some(schema)) => Some((app, schema)),
        (None, None) => None,
        _ => bail!("\"app\" and \"schema\" go together: give both or neither"),
    };
    if r.namespace.is_empty() {
        bail!("empty namespace");
    }
    // The caps every reader applies (FORMAT.md, "Bounds"): what is imported must be readable.
    let limits = Limits::default();
    over_cap("fields of the key", r.key.len(), limits.max_fields)?;
    over_cap("fields of the scope", r.scope.len(), limits.max_fields)?;
    over_cap("candidates", r.candidates.len(), limits.max_candidates)?;
    for c in &r.candidates {
        over_cap(
            "fields of a candidate's params",
            c.params.len(),
            limits.max_fields,
        )?;
    }
    let key = Key::new(r.key);
    if let Some(fp) = &r.fingerprint {
        let stored: Fingerprint = fp.parse().map_err(|e| format!("fingerprint: {e}"))?;
        if stored != key.fingerprint() {
            bail!(
                "the fingerprint {stored} does not match the key {key} (it fingerprints to {})",
                key.fingerprint()
            );
        }
    }
    let candidate_set = match &r.candidate_set {
        Some(hex) => hex.parse().map_err(|e| format!("candidate_set: {e}"))?,
        None => Fingerprint::default(),
    };
    let origin = match (r.origin, origin_policy) {
        (Some(o), policy) => {
            let original = Origin::from_parts(&o.kind, o.from)
                .ok_or_else(|| format!("unknown origin kind {:?}", o.kind))?;
            match policy {
                ImportOrigin::Keep => original,
                ImportOrigin::MarkImported => Origin::Imported(format!(
                    "{source} ({} {})",
                    original.kind(),
                    original.detail()
                )),
            }
        }
        (None, _) => Origin::Imported(source.to_owned()),
    };
    let candidates = r
        .candidates
        .into_iter()
        .map(|c| candidate_from_json(c, now))
        .collect::<Result<Vec<_>, _>>()?;
    let entry = Entry::new(
        key,
        candidate_set,
        origin,
        r.recorded_at.unwrap_or(now),
        candidates,
    );
    Ok((version, Scope::new(r.scope), r.namespace, entry))
}

/// Parses JSON lines; any bad line fails the whole input, naming the line.
pub fn parse_lines(
    text: &str,
    source: &str,
    origin_policy: ImportOrigin,
) -> Result<CacheData, JsonLineError> {
    let mut all = CacheData::new();
    for (_, data) in parse_lines_versioned(text, source, origin_policy)? {
        all.merge(data);
    }
    Ok(all)
}

/// Like [`parse_lines`], keeping apart the entries of each application and schema the lines
/// say they are written in (`None`: lines that do not say), so an importer can pass each
/// group through the version gate.
pub(crate) fn parse_lines_versioned(
    text: &str,
    source: &str,
    origin_policy: ImportOrigin,
) -> Result<std::collections::BTreeMap<Version, CacheData>, JsonLineError> {
    let mut parser = LineParser::new(source, origin_policy);
    let mut groups: std::collections::BTreeMap<Version, CacheData> = Default::default();
    let mut each = |version: &Version, scope: &Scope, ns: &str, entry: Entry| {
        groups
            .entry(version.clone())
            .or_default()
            .insert(scope, ns, entry);
    };
    for (i, line) in text.lines().enumerate() {
        parser.line(i + 1, line, &mut each)?;
    }
    Ok(groups)
}

/// Reads JSON lines from `reader` one at a time (the text is never all in memory), handing
/// each entry to `each` as it is parsed, with the version its line says (`None`: the line
/// does not say), its scope and namespace; any bad line fails the whole input, naming it
/// (a read error, invalid UTF-8 included, too). The input's caps (scopes, namespaces) are
/// checked as for a file.
pub fn read_lines_each(
    mut reader: impl std::io::BufRead,
    source: &str,
    origin_policy: ImportOrigin,
    mut each: impl FnMut(&Version, &Scope, &str, Entry),
) -> Result<(), JsonLineError> {
    let mut parser = LineParser::new(source, origin_policy);
    let mut buf = String::new();
    for number in 1.. {
        buf.clear();
        match reader.read_line(&mut buf) {
            Ok(0) => break,
            Ok(_) => {
                // The line endings `str::lines` splits at: `\n` and `\r\n`.
                let line = match buf.strip_suffix('\n') {
                    Some(l) => l.strip_suffix('\r').unwrap_or(l),
                    None => &buf,
                };
                parser.line(number, line, &mut each)?;
            }
            Err(e) => {
                return Err(JsonLineError {
                    source_name: source.to_owned(),
                    line: number,
                    message: format!("cannot read it: {e}"),
                });
            }
        }
    }
    Ok(())
}

/// The state of a parse: the groups so far and the distinct scopes and (scope, namespace)
/// pairs, for the caps of a whole input.
struct LineParser<'a> {
    source: &'a str,
    origin_policy: ImportOrigin,
    now: Millis,
    limits: Limits,
    scopes: std::collections::HashSet<Fingerprint>,
    namespaces: std::collections::HashSet<(Fingerprint, String)>,
}

impl<'a> LineParser<'a> {
    fn new(source: &'a str, origin_policy: ImportOrigin) -> Self {
        LineParser {
            source,
            origin_policy,
            now: crate::clock::now_millis(),
            limits: Limits::default(),
            scopes: Default::default(),
            namespaces: Default::default(),
        }
    }

    /// Parses line `number` (1-based) and hands its entry to `each`.
    fn line(
        &mut self,
        number: usize,
        line: &str,
        each: &mut impl FnMut(&Version, &Scope, &str, Entry),
    ) -> Result<(), JsonLineError> {
        if line.trim().is_empty() {
            return Ok(());
        }
        let error = |message: String| JsonLineError {
            source_name: self.source.to_owned(),
            line: number,
            message,
        };
        let (version, scope, ns, entry) =
            parse_versioned(line, self.source, self.origin_policy, self.now).map_err(error)?;
        self.scopes.insert(scope.fingerprint());
        self.namespaces.insert((scope.fingerprint(), ns.clone()));
        each(&version, &scope, &ns, entry);
        over_cap(
            "scopes in the import",
            self.scopes.len(),
            self.limits.max_scopes,
        )
        .and_then(|()| {
            over_cap(
                "namespaces in the import",
                self.namespaces.len(),
                self.limits.max_namespaces,
            )
        })
        .map_err(|message| JsonLineError {
            source_name: self.source.to_owned(),
            line: number,
            message,
        })
    }
}

fn over_cap(what: &str, count: usize, limit: u64) -> Result<(), String> {
    if count as u64 > limit {
        Err(format!(
            "{count} {what}, over the limit of {limit} (FORMAT.md, \"Bounds\")"
        ))
    } else {
        Ok(())
    }
}

/// Every entry of `data` as JSON lines (the export format), each line saying the application
/// and schema it is written in, so an import elsewhere can pass it through the version gate.
pub fn to_lines_versioned(data: &CacheData, app: &str, schema: u32) -> String {
    lines_of(data, Some((app, schema)))
}

fn lines_of(data: &CacheData, version: Option<(&str, u32)>) -> String {
    let mut out = String::new();
    for (scope, ns, entry) in data.entries() {
        out.push_str(&line(scope, ns, entry, version));
        out.push('\n');
    }
    out
}

/// One JSON line (without its line break) for an entry, labelled with the application and
/// schema it is written in when `version` is given.
pub fn line(scope: &Scope, namespace: &str, entry: &Entry, version: Option<(&str, u32)>) -> String {
    let mut r = record(scope, namespace, entry);
    if let Some((app, schema)) = version {
        r.app = Some(app.to_owned());
        r.schema = Some(schema);
    }
    terminal_safe(serde_json::to_string(&r).expect("a record always serializes"))
}

/// JSON text with the characters a terminal would act on that JSON writers leave raw (DEL,
/// the C1 controls, the bidirectional overrides and isolates, the line and paragraph
/// separators) written as `\uXXXX` escapes: still the same JSON document, now safe to print.
/// They can only occur inside strings (JSON's own syntax is ASCII), so replacing them
/// anywhere is exact.
pub fn terminal_safe(text: String) -> String {
    let unsafe_char = |c: char| matches!(c, '\u{7f}'..='\u{9f}' | '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    if !text.contains(unsafe_char) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if unsafe_char(c) {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines of `reader` grouped by the version each says.
    fn read_lines_versioned(
        reader: impl std::io::BufRead,
        source: &str,
        origin_policy: ImportOrigin,
    ) -> Result<std::collections::BTreeMap<Version, CacheData>, JsonLineError> {
        let mut groups: std::collections::BTreeMap<Version, CacheData> = Default::default();
        read_lines_each(
            reader,
            source,
            origin_policy,
            |version, scope, ns, entry| {
                groups
                    .entry(version.clone())
                    .or_default()
                    .insert(scope, ns, entry);
            },
        )?;
        Ok(groups)
    }
    use crate::candidate::CandidateId;

    fn lines() -> String {
        let mut data = CacheData::new();
        for m in 0..3 {
            let key = Key::new(Fields::from([("m".to_owned(), crate::Value::Int(m))]));
            let entry = Entry::new(
                key,
                Fingerprint::default(),
                Origin::Measured("t".into()),
                1,
                [Candidate::new(
                    CandidateId::new("a", &[]),
                    Outcome::Failed("x".into()),
                )],
            );
            data.insert(&Scope::default(), "ns", entry);
        }
        to_lines_versioned(&data, "app", 1)
    }

    #[test]
    fn json_lines_are_terminal_safe_and_still_the_same_document() {
        let nasty = "a\u{7f}b\u{9b}[2Jc\u{202e}d\u{2028}e\u{1b}f";
        let text = terminal_safe(serde_json::to_string(nasty).expect("json"));
        assert!(text.is_ascii(), "{text}");
        assert_eq!(
            serde_json::from_str::<String>(&text).expect("valid JSON"),
            nasty
        );
    }

    #[test]
    fn reading_line_by_line_equals_parsing_the_text() {
        let text = lines();
        // Blank lines, CRLF endings and no newline at the end: the same entries either way.
        let mut odd = text.replace('\n', "\r\n");
        odd.insert_str(0, "\n  \n");
        odd.pop();
        odd.pop();
        for t in [text.as_str(), odd.as_str()] {
            let whole = parse_lines_versioned(t, "in", ImportOrigin::Keep).expect("parses");
            let read = read_lines_versioned(t.as_bytes(), "in", ImportOrigin::Keep).expect("reads");
            assert_eq!(whole, read);
            assert_eq!(read.values().map(CacheData::len).sum::<usize>(), 3);
        }
    }

    #[test]
    fn a_bad_line_read_line_by_line_is_named_like_in_the_text() {
        let mut text = lines().into_bytes();
        let second = text.iter().position(|b| *b == b'\n').expect("a newline") + 1;
        text.insert(second + 1, 0xff);
        let e = read_lines_versioned(&text[..], "in", ImportOrigin::Keep).expect_err("bad");
        assert_eq!(e.line, 2, "{e}");
        assert!(e.to_string().contains("UTF-8"), "{e}");
        let bad_json = lines().replace("\"ns\"", "\"ns\",,");
        let whole = parse_lines_versioned(&bad_json, "in", ImportOrigin::Keep).expect_err("bad");
        let read =
            read_lines_versioned(bad_json.as_bytes(), "in", ImportOrigin::Keep).expect_err("bad");
        assert_eq!(whole.to_string(), read.to_string());
    }

    #[test]
    fn a_chosen_candidate_round_trips_and_refuses_timings() {
        let mut data = CacheData::new();
        let key = Key::new(Fields::from([("m".to_owned(), crate::Value::Int(1))]));
        let c = [Candidate::chosen("cfg", Fields::new(), "vllm config")];
        let origin = Origin::Measured("t".into());
        let entry = Entry::new(key, Fingerprint::default(), origin, 1, c);
        data.insert(&Scope::default(), "ns", entry);
        let text = to_lines_versioned(&data, "app", 1);
        assert!(
            text.contains(r#""status":"chosen","chosen_by":"vllm config""#),
            "{text}"
        );
        let back = parse_lines(&text, "t", ImportOrigin::Keep).expect("parses");
        let (_, _, e) = back.entries().next().expect("one entry");
        assert_eq!(
            e.best().map(|c| &c.outcome),
            Some(&Outcome::Chosen("vllm config".into()))
        );
        let bad = text.replace(r#""chosen_by""#, r#""median_ns":5.0,"chosen_by""#);
        let err = parse_lines(&bad, "t.jsonl", ImportOrigin::Keep).expect_err("refused");
        assert!(
            err.to_string().contains("t.jsonl") && err.to_string().contains("carries timings"),
            "{err}"
        );
    }
}
