//! The JSON-lines interchange format of `export` and `import` (FORMAT.md, "JSON lines"):
//! one entry per line, self-contained, so Python or shell tools can read and feed a cache.

use anyhow::{Context, bail};
use cache_format::{
    CacheData, Candidate, Entry, Fields, Fingerprint, Key, Millis, Origin, Outcome, Scope, Stats,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Record {
    pub(crate) scope: Fields,
    pub(crate) namespace: String,
    pub(crate) key: Fields,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) fingerprint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) candidate_set: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) recorded_at: Option<Millis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) origin: Option<OriginJson>,
    pub(crate) candidates: Vec<CandidateJson>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct OriginJson {
    pub(crate) kind: String,
    pub(crate) from: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CandidateJson {
    pub(crate) algo: String,
    #[serde(default)]
    pub(crate) params: Fields,
    #[serde(default = "ok")]
    pub(crate) status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) median_ns: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) min_ns: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) spread_ns: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) samples: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) measured_at: Option<Millis>,
}

fn ok() -> String {
    "ok".to_owned()
}

pub(crate) fn candidate_json(c: &Candidate) -> CandidateJson {
    let (status, stats, error) = match &c.outcome {
        Outcome::Measured(s) => ("ok", Some(s), None),
        Outcome::Failed(r) => ("failed", None, Some(r.clone())),
    };
    CandidateJson {
        algo: c.algorithm.clone(),
        params: c.params.clone(),
        status: status.to_owned(),
        median_ns: stats.map(|s| s.median_ns),
        min_ns: stats.map(|s| s.min_ns),
        spread_ns: stats.map(|s| s.spread_ns),
        samples: stats.map(|s| s.samples),
        error,
        measured_at: Some(c.measured_at),
    }
}

pub(crate) fn record(scope: &Scope, namespace: &str, entry: &Entry) -> Record {
    Record {
        scope: scope.fields().clone(),
        namespace: namespace.to_owned(),
        key: entry.key().fields().clone(),
        fingerprint: Some(entry.fingerprint().to_hex()),
        candidate_set: Some(entry.candidate_set().to_hex()),
        recorded_at: Some(entry.recorded_at()),
        origin: Some(OriginJson {
            kind: entry.origin().kind().to_owned(),
            from: entry.origin().detail().to_owned(),
        }),
        candidates: entry.candidates().iter().map(candidate_json).collect(),
    }
}

fn nonneg(name: &str, v: Option<f64>, algo: &str) -> anyhow::Result<f64> {
    match v {
        Some(x) if x.is_finite() && x >= 0.0 => Ok(x),
        Some(x) => {
            bail!("candidate {algo:?}: {name} must be a finite non-negative number, got {x}")
        }
        None => bail!("candidate {algo:?} has status \"ok\" but no {name}"),
    }
}

pub(crate) fn candidate_from_json(c: CandidateJson, now: Millis) -> anyhow::Result<Candidate> {
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
        other => bail!(
            "candidate {:?}: unknown status {other:?} (expected \"ok\" or \"failed\")",
            c.algo
        ),
    };
    if c.algo.is_empty() {
        bail!("a candidate has an empty algorithm name");
    }
    Ok(Candidate {
        algorithm: c.algo,
        params: c.params,
        outcome,
        measured_at: c.measured_at.unwrap_or(now),
    })
}

/// Parses one JSON line into its scope, namespace and entry. `source` names the input for
/// the origin of imported entries.
pub(crate) fn parse_record(
    line: &str,
    source: &str,
    now: Millis,
) -> anyhow::Result<(Scope, String, Entry)> {
    let r: Record = serde_json::from_str(line)?;
    if r.namespace.is_empty() {
        bail!("empty namespace");
    }
    let key = Key::new(r.key);
    if let Some(fp) = &r.fingerprint {
        let stored: Fingerprint = fp.parse()?;
        if stored != key.fingerprint() {
            bail!(
                "the fingerprint {stored} does not match the key {key} (it fingerprints to {})",
                key.fingerprint()
            );
        }
    }
    let candidate_set = match &r.candidate_set {
        Some(hex) => hex.parse().context("candidate_set")?,
        None => Fingerprint::default(),
    };
    let origin = match r.origin {
        Some(o) => {
            Origin::from_parts(&o.kind, String::new())
                .with_context(|| format!("unknown origin kind {:?}", o.kind))?;
            Origin::Imported(format!("{source} ({} {})", o.kind, o.from))
        }
        None => Origin::Imported(source.to_owned()),
    };
    let candidates = r
        .candidates
        .into_iter()
        .map(|c| candidate_from_json(c, now))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let entry = Entry::new(
        key,
        candidate_set,
        origin,
        r.recorded_at.unwrap_or(now),
        candidates,
    );
    Ok((Scope::new(r.scope), r.namespace, entry))
}

/// Parses JSON lines; any bad line fails the whole input, naming the line.
pub(crate) fn parse_all(text: &str, source: &str) -> anyhow::Result<CacheData> {
    let now = cache_format::now_millis();
    let mut data = CacheData::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let (scope, ns, entry) =
            parse_record(line, source, now).with_context(|| format!("{source}: line {}", i + 1))?;
        data.insert(&scope, &ns, entry);
    }
    Ok(data)
}
