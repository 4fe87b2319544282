//! `tunecache explain -n NS -k KEY`: for one key, which tiers (the file, the system files, the
//! shared tier) and scopes have it, and why each entry would or would not be used here:
//! another scope (and which of its fields differ), a changed candidate set, a winner that is
//! not a current candidate, every candidate failed. Exit 4 when nothing would be used; then
//! also what a tuner would predict for it from the tuned keys of its namespace here, and which
//! of them voted (`gpu_tuner::predict`).

use clap::Args;
use serde::Serialize;

use std::ops::ControlFlow;

use cache_format::{CandidateId, Entry, Fingerprint, Key, Scope, Value};
use gpu_tuner::predict::{Predictor, Query, TunedKeys, Voters};

use crate::cmd::get::Lookup;
use crate::context::Context;
use crate::exit;
use crate::options::{KeyArgs, ScopeFilter};
use crate::output::{Out, Report};
use crate::render::{fmt_ns, parse_fields};

/// The arguments of `tunecache explain`.
#[derive(Debug, Args)]
pub(crate) struct ExplainArgs {
    #[command(flatten)]
    key: KeyArgs,
    /// The scope a lookup here would use (a JSON object) [default: this machine's CPU scope,
    /// as `tunecache tune --backend cpu` uses]
    #[arg(long)]
    scope: Option<String>,
    /// The checksum of the current candidate set (32 hex digits), to say whether it changed
    #[arg(long)]
    candidate_set: Option<String>,
    /// A current candidate's algorithm name (repeatable), to say whether the winner is one
    #[arg(long = "candidate", value_name = "ALGO")]
    candidates: Vec<String>,
}

#[derive(Debug, Serialize)]
struct FieldDiff {
    field: String,
    here: Option<Value>,
    there: Option<Value>,
}

#[derive(Debug, Serialize)]
struct Found {
    tier: String,
    scope: String,
    scope_fingerprint: String,
    used: bool,
    reasons: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    differing_fields: Vec<FieldDiff>,
    #[serde(skip_serializing_if = "Option::is_none")]
    winner: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    median_ns: Option<f64>,
}

/// What a tuner would predict for a key no tier can serve.
#[derive(Debug, Serialize)]
struct PredictionOut {
    winner: String,
    /// The best few predicted, with their predicted slowdown against the first.
    ranking: Vec<(String, Option<f64>)>,
    /// What a miss would measure first: the best [`MEASURE_FIRST`] of the ranking, the first
    /// three unlike each other (`Prediction::top`, what `TopK` measures).
    measure_first: Vec<String>,
    neighbours: Vec<NeighbourOut>,
    /// The scopes (other devices) whose results for this key it was transferred from, when
    /// no key of this scope could predict it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    transferred_from: Vec<TransferredOut>,
    /// The scopes (other devices) whose results for this key voted beside this scope's
    /// tuned keys.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    beside: Vec<TransferredOut>,
}

/// A scope a prediction was transferred from, and its winner for the key.
#[derive(Debug, Serialize)]
struct TransferredOut {
    scope: String,
    winner: Option<String>,
}

#[derive(Debug, Serialize)]
struct NeighbourOut {
    key: String,
    distance: f64,
    winner: Option<String>,
    /// Another device's result for this very key (see `beside`).
    elsewhere: bool,
}

#[derive(Debug, Serialize)]
struct ExplainReport {
    namespace: String,
    key: String,
    fingerprint: String,
    scope: String,
    found: Vec<Found>,
    verdict: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    prediction: Option<PredictionOut>,
}

impl ExplainArgs {
    pub(crate) fn run(self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        let here = match &self.scope {
            Some(s) => Scope::new(parse_fields("--scope", s)?),
            None => gpu_tuner::cpu::scope(),
        };
        let set: Option<Fingerprint> = self
            .candidate_set
            .as_deref()
            .map(str::parse)
            .transpose()
            .map_err(|e| anyhow::anyhow!("--candidate-set: {e}"))?;
        // Every scope of the file, then (on a local miss in this scope) the shared tier.
        let lookup = Lookup::new(ctx, &self.key, &ScopeFilter { scope: None })?;
        let key = Key::new(parse_fields("--key", &self.key.key)?);
        let mut found = Vec::new();
        let local = lookup.local_entries();
        for (scope, entry) in &local {
            found.push(self.judge("file", &here, set, scope, entry));
        }
        // A cache asks its system files, then the shared tier, only when its own scope misses
        // in the tiers above.
        let mut missed = !local.iter().any(|(s, _)| *s == here);
        if missed {
            // Read by the lookup only if the file had nothing in any scope.
            let system = if local.is_empty() {
                lookup.system.clone()
            } else {
                lookup.read_system(ctx)
            };
            for (path, scope, entry) in &system {
                let tier = format!("system file {}", path.display());
                found.push(self.judge(&tier, &here, set, scope, entry));
                missed &= *scope != here;
            }
        }
        if missed {
            for (scope, entry) in lookup.remote_entries(ctx)? {
                found.push(self.judge("shared tier", &here, set, &scope, &entry));
            }
        }
        let used = found.iter().find(|f| f.used);
        let code = if used.is_some() {
            exit::OK
        } else {
            exit::NOT_FOUND
        };
        let verdict = match used {
            Some(f) => format!(
                "a lookup here uses the {} entry: {}",
                f.tier,
                f.winner.as_deref().unwrap_or("?")
            ),
            None if found.is_empty() => "no tier has this key: a lookup here misses".to_owned(),
            None => "no entry is usable here: a lookup misses (or re-measures)".to_owned(),
        };
        let prediction = match used {
            Some(_) => None,
            None => self.predict(&lookup, &here, &key),
        };
        let report = ExplainReport {
            namespace: self.key.namespace.clone(),
            fingerprint: key.fingerprint().to_hex(),
            key: key.to_string(),
            scope: here.to_string(),
            found,
            verdict,
            prediction,
        };
        out.report(&report, ctx.json)?;
        Ok(code)
    }

    /// The prediction for `key` from the file's tuned keys of its namespace in `here`; the
    /// candidates are those `--candidate` names, or every one those keys recorded.
    fn predict(&self, lookup: &Lookup, here: &Scope, key: &Key) -> Option<PredictionOut> {
        let mut tuned: Vec<Entry> = Vec::new();
        let mut elsewhere: Vec<(Scope, Entry)> = Vec::new();
        let fp = key.fingerprint();
        lookup.found.for_each_entry(|scope, ns, entry| {
            if ns == self.key.namespace && scope == here {
                tuned.push(entry.clone());
            } else if ns == self.key.namespace && entry.fingerprint() == fp {
                elsewhere.push((scope.clone(), entry.clone()));
            }
            ControlFlow::Continue(())
        });
        let others: Vec<&Entry> = elsewhere.iter().map(|(_, e)| e).collect();
        if tuned.is_empty() && !elsewhere.is_empty() {
            // A device never tuned: as the tuner does, from the key's results elsewhere.
            let entries: Vec<Entry> = others.iter().map(|e| (*e).clone()).collect();
            let current = self.current_of(&entries);
            let voters = Predictor {
                neighbours: entries.len(),
            };
            let p = voters.predict(&Query {
                target: key.fields(),
                current: &current,
                voters: Voters::Devices {
                    tuned: &others,
                    measured: &[],
                },
            })?;
            let mut out = prediction_out(&p);
            out.transferred_from = scopes_out(&elsewhere);
            return Some(out);
        }
        // As the tuner does: this scope's nearest keys, and beside them the key's results
        // on other devices.
        let current = self.current_of(&tuned);
        let tuned: Vec<&Entry> = tuned.iter().collect();
        let p = Predictor::default().predict(&Query {
            target: key.fields(),
            current: &current,
            voters: Voters::Scope {
                tuned: TunedKeys::Entries(&tuned),
                elsewhere: &others,
            },
        })?;
        let mut out = prediction_out(&p);
        if p.neighbours.iter().any(|n| n.elsewhere) {
            out.beside = scopes_out(&elsewhere);
        }
        Some(out)
    }

    /// The candidates `entries` recorded (those `--candidate` names, if any), once each.
    fn current_of(&self, entries: &[Entry]) -> Vec<CandidateId> {
        let mut current: Vec<CandidateId> = entries
            .iter()
            .flat_map(|e| e.candidates().iter().map(|c| c.id.clone()))
            .filter(|c| self.candidates.is_empty() || self.candidates.contains(&c.algorithm))
            .collect();
        current.sort_by_key(CandidateId::identity_bytes);
        current.dedup();
        current
    }

    fn judge(
        &self,
        tier: &str,
        here: &Scope,
        set: Option<Fingerprint>,
        scope: &Scope,
        entry: &Entry,
    ) -> Found {
        let mut reasons = Vec::new();
        let differing_fields = scope_diff(here, scope);
        if !differing_fields.is_empty() {
            let names: Vec<&str> = differing_fields.iter().map(|d| d.field.as_str()).collect();
            let volatile = names.iter().all(|n| {
                gpu_tuner::DEFAULT_VOLATILE_SCOPE_FIELDS.contains(n)
                    || n.starts_with(cache_format::FAMILY_VERSION_PREFIX)
            });
            let loose = entry
                .best()
                .is_some_and(|b| cache_format::loose_match(here, scope, &b.id));
            reasons.push(format!(
                "another scope: it differs in {}{}",
                names.join(", "),
                if loose {
                    " only, other families' versions (loose: a tuner uses its winner, whose family's \
                     version is unchanged, provisionally once it passes a check here, and re-times \
                     it in the background)"
                } else if volatile {
                    " only (software versions: a tuner re-times its best few instead of tuning from scratch)"
                } else {
                    ""
                }
            ));
        }
        let best = entry.best();
        if best.is_none() {
            reasons.push("every candidate failed".to_owned());
        }

        if let Some(set) = set
            && set != entry.candidate_set()
        {
            reasons.push(format!(
                "the candidate set changed (stored {}, current {set}): the tuner measures what is new and the leader",
                entry.candidate_set()
            ));
        }
        if let Some(b) = best
            && !self.candidates.is_empty()
            && !self.candidates.contains(&b.id.algorithm)
        {
            reasons.push(format!(
                "its winner {} is not a current candidate: the best current one is used, or measured",
                b.id.label()
            ));
        }
        let used = reasons.is_empty();
        if used {
            reasons.push(match best.map(|b| &b.outcome) {
                Some(cache_format::Outcome::Chosen(by)) => format!(
                    "same scope, a winner chosen by {by}, not measured: a lookup serves it; a tuner measures the key (serving it meanwhile under NearestThenTune)"
                ),
                _ => "same scope, a measured winner".to_owned(),
            });
        }
        Found {
            tier: tier.to_owned(),
            scope: scope.to_string(),
            scope_fingerprint: scope.fingerprint().to_hex(),
            used,
            reasons,
            differing_fields,
            winner: best.map(|b| b.id.label()),
            median_ns: best.and_then(|b| b.stats()).map(|s| s.median_ns),
        }
    }
}

/// The fields whose values differ between two scopes (missing on one side: `None`).
fn scope_diff(here: &Scope, there: &Scope) -> Vec<FieldDiff> {
    let mut names: Vec<&String> = here
        .fields()
        .iter()
        .chain(there.fields().iter())
        .map(|(n, _)| n)
        .collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter_map(|n| {
            let (a, b) = (here.fields().get(n), there.fields().get(n));
            (a != b).then(|| FieldDiff {
                field: n.clone(),
                here: a.cloned(),
                there: b.cloned(),
            })
        })
        .collect()
}

/// Each scope with its winner for the key.
fn scopes_out(elsewhere: &[(Scope, Entry)]) -> Vec<TransferredOut> {
    elsewhere
        .iter()
        .map(|(s, e)| TransferredOut {
            scope: s.to_string(),
            winner: e.best().map(|c| c.id.label()),
        })
        .collect()
}

/// How many candidates `explain` says a miss measures first: on Inductor's published mm
/// timings, the best five of an A100's ranking reach 99.2% (TIMM) and 98.4% (HF) of an H100's
/// optimum (docs/rust.md).
const MEASURE_FIRST: usize = 5;

fn prediction_out(p: &gpu_tuner::predict::Prediction) -> PredictionOut {
    PredictionOut {
        measure_first: p
            .top(MEASURE_FIRST)
            .iter()
            .map(CandidateId::label)
            .collect(),
        winner: p.winner().label(),
        ranking: p
            .ranking
            .iter()
            .take(5)
            .map(|(c, slow)| (c.label(), *slow))
            .collect(),
        neighbours: p
            .neighbours
            .iter()
            .map(|n| NeighbourOut {
                key: n.key.to_string(),
                distance: n.distance,
                winner: n.winner.as_ref().map(CandidateId::label),
                elsewhere: n.elsewhere,
            })
            .collect(),
        transferred_from: Vec::new(),
        beside: Vec::new(),
    }
}

impl Report for ExplainReport {
    fn text(&self, out: &mut Out) -> anyhow::Result<()> {
        out.line(format!(
            "{} {} ({}) for scope {}",
            self.namespace, self.key, self.fingerprint, self.scope
        ))?;
        for f in &self.found {
            out.line(format!(
                "  {}: scope {} ({}): {} — {}",
                f.tier,
                f.scope,
                &f.scope_fingerprint[..8],
                if f.used { "USED" } else { "not used" },
                f.reasons.join("; ")
            ))?;
            for d in &f.differing_fields {
                let show =
                    |v: &Option<Value>| v.as_ref().map_or("(none)".to_owned(), ToString::to_string);
                out.line(format!(
                    "      {}: here {}, there {}",
                    d.field,
                    show(&d.here),
                    show(&d.there)
                ))?;
            }
            if let (Some(w), Some(m)) = (&f.winner, f.median_ns) {
                out.line(format!("      winner {w} ({})", fmt_ns(m)))?;
            }
        }
        out.line(&self.verdict)?;
        if let Some(p) = self
            .prediction
            .as_ref()
            .filter(|p| !p.transferred_from.is_empty())
        {
            out.line(format!(
                "transferred here: {} (what a tuner serves at once under NearestThenTune, never \
                 counted as measured here), from this key's results on other devices:",
                p.winner
            ))?;
            for t in &p.transferred_from {
                out.line(format!(
                    "      {}: winner {}",
                    t.scope,
                    t.winner.as_deref().unwrap_or("-")
                ))?;
            }
            out.line(format!(
                "    measure first here (a TuneNow miss measures the best {MEASURE_FIRST} of their \
                 ranking, the first three unlike each other, and the rest only if these measure \
                 here nearly the other way round): {}",
                p.measure_first.join(", ")
            ))?;
        } else if let Some(p) = &self.prediction {
            out.line(format!(
                "predicted here: {} (what a tuner serves at once under NearestThenTune; TopK \
                 measures the best few of the prediction, one at a time, until those left are \
                 predicted over 15% slower than the best measured), from the tuned keys:",
                p.winner
            ))?;
            for n in &p.neighbours {
                let whose = if n.elsewhere {
                    "this key on another device, "
                } else {
                    ""
                };
                out.line(format!(
                    "      {} ({whose}distance {:.2}): winner {}",
                    n.key,
                    n.distance,
                    n.winner.as_deref().unwrap_or("-")
                ))?;
            }
            if !p.beside.is_empty() {
                out.line("    beside them, this key's results on other devices:")?;
                for t in &p.beside {
                    out.line(format!(
                        "      {}: winner {}",
                        t.scope,
                        t.winner.as_deref().unwrap_or("-")
                    ))?;
                }
            }
            out.line(format!(
                "    measure first (TopK {{ k: {MEASURE_FIRST} }}: the best predicted, the first \
                 three unlike each other): {}",
                p.measure_first.join(", ")
            ))?;
        }
        Ok(())
    }
}
