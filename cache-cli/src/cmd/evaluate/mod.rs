//! `tunecache evaluate`: how well prediction would serve keys never tuned, measured on a cache
//! whose keys have every candidate recorded (an AutoHeuristic or Kernel Tuner import, or a
//! cache tuned in full). Per scope and namespace, a k-fold cross-validation by key fingerprint
//! (`gpu_tuner::predict::cross_validate`: each fold predicted from the other folds alone)
//! scores the declared default, the nearest key's winner, the prediction and top-k tuning:
//! share of the optimum (geometric mean and 10th percentile), exact winners, candidates
//! measured per key and the tuning time spent.

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use clap::Args;
use serde::Serialize;

use cache_format::{CandidateId, Entry, Scope, Value};
use gpu_tuner::predict::{
    Evaluation, MethodScore, Methods, Predictor, cross_validate, few_tuned, few_tuned_with,
    transfer,
};

use crate::context::Context;
use crate::exit;
use crate::options::usage;
use crate::output::{Out, Report};
use crate::render::scope_filter;

mod tuned_in;

/// The arguments of `tunecache evaluate`.
#[derive(Debug, Args)]
pub(crate) struct EvaluateArgs {
    /// Only this namespace
    #[arg(long, short = 'n')]
    namespace: Option<String>,
    /// Only this scope (JSON object of its fields)
    #[arg(long)]
    scope: Option<String>,
    /// Folds of the cross-validation (keys split by fingerprint)
    #[arg(long, default_value_t = 5)]
    folds: usize,
    /// Few tuned instead: each fold in turn is the only one tuned and predicts all the others
    /// (--folds 10 --few-tuned: 10% of the keys tuned, as on a device just started)
    #[arg(long)]
    few_tuned: bool,
    /// Key fields, comma-separated: keys that agree on them share a fold, so they are held out
    /// together (m,k,n,mat1_dtype: every memory layout of a shape); default: each key by its
    /// fingerprint
    #[arg(long, value_delimiter = ',', value_name = "FIELDS")]
    fold_by: Vec<String>,
    /// The k of each top-k method and static list, comma-separated (the cost curve: the share
    /// of the optimum against candidates measured a key)
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,5,8")]
    top: Vec<usize>,
    /// The declared default candidate's algorithm (e.g. extern_mm), the first baseline
    #[arg(long)]
    default: Option<String>,
    /// Tuned keys that vote in a prediction
    #[arg(long, default_value_t = gpu_tuner::predict::DEFAULT_NEIGHBOURS)]
    neighbours: usize,
    /// Transfer instead: predict every key of the other scopes (or of --scope) from this
    /// scope's keys alone (JSON object of its fields), as for a device never tuned; `others`:
    /// each scope from all the other scopes of its namespace together. With --tuned-in: this
    /// scope's result for the same key votes beside the other workloads' keys
    #[arg(long, value_name = "SCOPE|others")]
    transfer_from: Option<String>,
    /// A workload never tuned: predict every key from the keys of the same namespace and scope
    /// in this other cache file (another workload tuned on the same device); repeat it for
    /// more files
    #[arg(long, value_name = "FILE")]
    tuned_in: Vec<std::path::PathBuf>,
}

/// Entries by (scope fingerprint, namespace), with their scope.
type Groups = BTreeMap<(String, String), (Scope, Vec<Entry>)>;

#[derive(Debug, Serialize)]
struct MethodRow {
    method: String,
    share_of_optimum: f64,
    p10_share: f64,
    /// The share of keys below 90% of the optimum.
    below_90_share: f64,
    exact_share: f64,
    measured_per_key: f64,
    tuning_share: f64,
    /// The lowest share of the optimum of any fold (none for a transfer: one split).
    worst_fold_share: Option<f64>,
    /// Each fold's share of the optimum, in fold order (empty for a transfer).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    fold_shares: Vec<f64>,
}

#[derive(Debug, Serialize)]
struct Group {
    scope: String,
    namespace: String,
    /// The scope predicted from, for a transfer.
    #[serde(skip_serializing_if = "Option::is_none")]
    from: Option<String>,
    keys: usize,
    evaluated: usize,
    methods: Vec<MethodRow>,
    /// Why the baseline is not the `--default` asked for (no key of the group has it).
    #[serde(skip_serializing_if = "Option::is_none")]
    baseline: Option<String>,
}

#[derive(Debug, Serialize)]
struct EvaluateReport {
    folds: usize,
    few_tuned: bool,
    /// The key fields keys share a fold by (empty: each key's fingerprint).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    fold_by: Vec<String>,
    /// The other workloads' files every key was predicted from (`--tuned-in`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tuned_in: Vec<String>,
    groups: Vec<Group>,
    /// Groups left out: too few keys with every candidate recorded.
    skipped: Vec<String>,
}

impl Report for EvaluateReport {
    fn text(&self, out: &mut Out) -> anyhow::Result<()> {
        let by = if self.fold_by.is_empty() {
            "key fingerprint".to_owned()
        } else {
            format!(
                "{} (keys that agree on them held out together)",
                self.fold_by.join(", ")
            )
        };
        for g in &self.groups {
            let how = match &g.from {
                Some(from) if self.few_tuned => format!(
                    "each of {} folds by {by} the only one tuned, with {from}'s \
                     results for the same key voting beside it",
                    self.folds
                ),
                Some(from) if !self.tuned_in.is_empty() => format!("predicted from {from}"),
                Some(from) => format!("predicted from {from} alone"),
                None if self.few_tuned => {
                    format!("each of {} folds by {by} the only one tuned", self.folds)
                }
                None => format!("{}-fold by {by}", self.folds),
            };
            out.line(format!(
                "{} in {}: {} keys, {} evaluated, {how}",
                g.namespace, g.scope, g.keys, g.evaluated
            ))?;
            out.line(format!(
                "  {:<34} {:>9} {:>7} {:>6} {:>7} {:>9} {:>8} {:>11}",
                "method",
                "% optimum",
                "p10 %",
                "< 90%",
                "exact",
                "measured",
                "tuning",
                "worst fold"
            ))?;
            for m in &g.methods {
                out.line(format!(
                    "  {:<34} {:>9.1} {:>7.1} {:>5.1}% {:>6.0}% {:>9.1} {:>7.0}% {:>11}",
                    m.method,
                    m.share_of_optimum * 100.0,
                    m.p10_share * 100.0,
                    m.below_90_share * 100.0,
                    m.exact_share * 100.0,
                    m.measured_per_key,
                    m.tuning_share * 100.0,
                    m.worst_fold_share
                        .map_or("-".to_owned(), |w| format!("{:.1}", w * 100.0))
                ))?;
            }
            if let Some(b) = &g.baseline {
                out.line(format!("  note: {b}"))?;
            }
        }
        for s in &self.skipped {
            out.line(format!("skipped {s}"))?;
        }
        if self.groups.is_empty() && self.skipped.is_empty() {
            out.line("nothing to evaluate: no key matches the namespace and scope asked for")?;
        }
        Ok(())
    }
}

impl EvaluateArgs {
    /// A usage error for options out of range or that do not go together.
    fn check(&self) -> anyhow::Result<()> {
        if self.folds < 2 || self.folds > 100 {
            return Err(usage(format!("--folds is 2 to 100, not {}", self.folds)));
        }
        if self.top.contains(&0) {
            return Err(usage("--top takes k of 1 or more".to_owned()));
        }
        if self.neighbours == 0 {
            return Err(usage("--neighbours takes 1 or more".to_owned()));
        }
        if !self.tuned_in.is_empty() && (self.few_tuned || !self.fold_by.is_empty()) {
            return Err(usage(
                "--tuned-in predicts every key from the other files' keys: it takes no \
                 --few-tuned or --fold-by"
                    .to_owned(),
            ));
        }
        Ok(())
    }

    pub(crate) fn run(mut self, ctx: &Context<'_>, out: &mut Out) -> anyhow::Result<u8> {
        self.check()?;
        // A k asked twice is one row.
        let mut seen = std::collections::HashSet::new();
        self.top.retain(|k| seen.insert(*k));
        let found = ctx.inspect_as_read(&ctx.path()?)?;
        let scope = scope_filter(self.scope.as_deref())?;
        let from = match self.transfer_from.as_deref() {
            None => None,
            Some("others") => Some(Source::Others),
            Some(text) => Some(Source::Scope(Scope::new(
                crate::render::parse_fields("--transfer-from", text)
                    .map_err(|e| usage(format!("{e:#}")))?,
            ))),
        };
        let groups = self.groups(&found, scope.as_ref(), from.as_ref());
        refuse_unknown_fold_fields(&self.fold_by, &groups)?;
        let default = self.default.as_deref().map(default_id).transpose()?;
        if let Some(d) = &default {
            refuse_unknown_default(d, &groups)?;
        }
        if let Some(Source::Scope(f)) = &from
            && !groups.values().any(|(s, _)| s == f)
        {
            return Err(usage(format!(
                "--transfer-from {}: no key has that scope",
                Value::Map(f.fields().clone())
            )));
        }
        let predictor = Predictor {
            neighbours: self.neighbours,
        };
        let mut report = EvaluateReport {
            folds: self.folds,
            few_tuned: self.few_tuned,
            fold_by: self.fold_by.clone(),
            tuned_in: self
                .tuned_in
                .iter()
                .map(|p| p.display().to_string())
                .collect(),
            groups: Vec::new(),
            skipped: Vec::new(),
        };
        if !self.tuned_in.is_empty() {
            let cache = ctx.path()?;
            let how = tuned_in::TunedIn {
                paths: &self.tuned_in,
                cache: &cache,
                app: found.snapshot.header.as_ref().map(|h| h.app.as_str()),
                beside: from.as_ref(),
                target: scope.as_ref(),
                top: &self.top,
                default: default.as_ref(),
                predictor: &predictor,
            };
            tuned_in::evaluate(ctx, &how, &groups, &mut report)?;
            return finish(report, default.as_ref(), ctx, out);
        }
        if let Some(from) = from {
            let how = Transfer {
                from: &from,
                target: scope.as_ref(),
                top: &self.top,
                default: default.as_ref(),
                predictor: &predictor,
                few_tuned: self.few_tuned.then_some(self.folds),
                fold_by: &self.fold_by,
            };
            transfers(&groups, &how, &mut report);
            return finish(report, default.as_ref(), ctx, out);
        }
        self.cross_validations(groups, default.as_ref(), &predictor, &mut report);
        finish(report, default.as_ref(), ctx, out)
    }
}

impl EvaluateArgs {
    /// Each group's keys cross-validated (or, with --few-tuned, each fold alone tuned); a
    /// group with too few keys scored for the folds is listed as skipped.
    fn cross_validations(
        &self,
        groups: Groups,
        default: Option<&CandidateId>,
        predictor: &Predictor,
        report: &mut EvaluateReport,
    ) {
        for ((_, ns), (scope, entries)) in groups {
            let scope_text = Value::Map(scope.fields().clone()).to_string();
            // A default no key of the group has is no baseline: the first candidate is.
            let mut methods = methods_for(&self.top, default, &entries);
            methods.fold_by = &self.fold_by;
            let cv = if self.few_tuned {
                few_tuned(&entries, &current, predictor, self.folds, &methods)
            } else {
                cross_validate(&entries, &current, predictor, self.folds, &methods)
            };
            if cv.overall.held_out < self.folds * 2 {
                report.skipped.push(format!(
                    "{ns} in {scope_text}: {} keys, {} of them scored (a key is scored when \
                     every candidate it has is recorded ok and another key shares candidates \
                     with it), fewer than the {} that {} folds need",
                    entries.len(),
                    cv.overall.held_out,
                    self.folds * 2,
                    self.folds
                ));
                continue;
            }
            let shares = |i: usize| -> Vec<f64> {
                cv.folds
                    .iter()
                    .filter(|f| f.held_out > 0)
                    .map(|f| f.methods[i].share_of_optimum())
                    .collect()
            };
            let mut g = group(ns, scope_text, entries.len(), &cv.overall);
            g.baseline = baseline_note(default, &methods);
            for (i, m) in g.methods.iter_mut().enumerate() {
                m.fold_shares = shares(i);
                m.worst_fold_share = m.fold_shares.iter().copied().reduce(f64::min);
            }
            report.groups.push(g);
        }
    }
    /// The entries the evaluation reads, by scope and namespace (with --transfer-from,
    /// --scope picks the target and the source's keys are kept too); damage said on stderr.
    fn groups(
        &self,
        found: &cache_core::Inspection,
        scope: Option<&Scope>,
        from: Option<&Source>,
    ) -> Groups {
        let mut groups = Groups::new();
        for problem in found.for_each_entry(|s, n, e| {
            let in_scope = scope.is_none_or(|want| s == want)
                || match from {
                    Some(Source::Scope(f)) => s == f,
                    Some(Source::Others) => true,
                    None => false,
                };
            if self.namespace.as_deref().is_none_or(|want| n == want) && in_scope {
                let group = (s.fingerprint().to_hex(), n.to_owned());
                groups
                    .entry(group)
                    .or_insert_with(|| (s.clone(), Vec::new()))
                    .1
                    .push(e.clone());
            }
            ControlFlow::Continue(())
        }) {
            crate::output::say(format_args!("damaged: {problem}"));
        }
        groups
    }
}

/// Shows the report; a usage error instead when `--default` was asked for and no group
/// evaluated has it (every group that has it was skipped): no baseline of it was measured.
fn finish(
    report: EvaluateReport,
    default: Option<&CandidateId>,
    ctx: &Context<'_>,
    out: &mut Out,
) -> anyhow::Result<u8> {
    if let Some(d) = default
        && report.groups.iter().all(|g| g.baseline.is_some())
    {
        let skipped = if report.skipped.is_empty() {
            String::new()
        } else {
            format!("; skipped: {}", report.skipped.join("; "))
        };
        return Err(usage(format!(
            "--default {d}: no key evaluated has that candidate{skipped}"
        )));
    }
    out.report(&report, ctx.json)?;
    Ok(exit::OK)
}

/// What a group's baseline row is when `--default` names a candidate none of its keys has.
fn baseline_note(default: Option<&CandidateId>, methods: &Methods<'_>) -> Option<String> {
    let d = default?;
    methods.default.is_none().then(|| {
        format!("no key here has --default {d}: the baseline row is each key's first candidate")
    })
}

/// A key's current candidates: every one recorded, in canonical order (never best first, so
/// the "first candidate" baseline knows nothing of the results).
fn current(entry: &Entry) -> Vec<CandidateId> {
    let mut ids: Vec<CandidateId> = entry.candidates().iter().map(|c| c.id.clone()).collect();
    ids.sort_by_cached_key(ToString::to_string);
    ids
}

/// The methods of a default the entries have (else the first candidate).
fn methods_for<'a>(
    top: &'a [usize],
    default: Option<&'a CandidateId>,
    entries: &[Entry],
) -> Methods<'a> {
    Methods {
        top,
        default: default.filter(|d| {
            entries
                .iter()
                .any(|e| e.candidates().iter().any(|c| c.id == **d))
        }),
        fold_by: &[],
    }
}

/// A `--fold-by` field no key of the groups has would put every key in one fold.
fn refuse_unknown_fold_fields(fields: &[String], groups: &Groups) -> anyhow::Result<()> {
    for name in fields {
        let known = groups
            .values()
            .flat_map(|(_, entries)| entries)
            .any(|e| e.key().fields().contains_key(name));
        if !known {
            return Err(usage(format!("--fold-by {name}: no key has that field")));
        }
    }
    Ok(())
}

/// The candidate `--default` names: `ALGO`, or `ALGO {PARAMS}` as `list` and `show` print one.
fn default_id(text: &str) -> anyhow::Result<CandidateId> {
    let (algo, params) = text.split_once(' ').unwrap_or((text, ""));
    if algo.is_empty() {
        return Err(usage(format!(
            "--default {text:?}: give a candidate as ALGO or 'ALGO {{PARAMS}}'"
        )));
    }
    let params = params.trim();
    if params.is_empty() {
        return Ok(CandidateId::new(algo, &[]));
    }
    let fields = crate::render::parse_fields("--default's params", params)
        .map_err(|e| usage(format!("--default {text:?}: {e:#}")))?;
    Ok(CandidateId {
        algorithm: algo.to_owned(),
        params: fields,
    })
}

/// A usage error when no key of `groups` has the candidate `default` (`--default` names
/// none: a baseline of nothing would silently become each key's first candidate).
fn refuse_unknown_default(default: &CandidateId, groups: &Groups) -> anyhow::Result<()> {
    let entries = || groups.values().flat_map(|(_, e)| e);
    if entries().any(|e| e.candidates().iter().any(|c| c.id == *default)) {
        return Ok(());
    }
    let mut names: Vec<String> = entries()
        .flat_map(|e| e.candidates().iter().map(|c| c.id.to_string()))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if names.is_empty() {
        return Err(usage(format!(
            "--default {default}: no key matches the namespace and scope asked for"
        )));
    }
    let more = names.len().saturating_sub(8);
    names.truncate(8);
    Err(usage(format!(
        "--default {default}: no key evaluated has that candidate (candidates here: {}{})",
        names.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    )))
}

/// Where a transfer predicts from.
pub(super) enum Source {
    /// One scope's keys.
    Scope(Scope),
    /// For each scope, every other scope's keys of its namespace.
    Others,
}

/// A transfer evaluation's settings.
struct Transfer<'a> {
    from: &'a Source,
    /// Only targets of this scope.
    target: Option<&'a Scope>,
    top: &'a [usize],
    default: Option<&'a CandidateId>,
    predictor: &'a Predictor,
    /// With --few-tuned: each of this many folds of the target tuned in turn, with the source.
    few_tuned: Option<usize>,
    /// The key fields the target's keys share a fold by (--fold-by).
    fold_by: &'a [String],
}

/// Each target scope's keys of each namespace, predicted from the source's alone (with
/// --few-tuned: from a tuned fold of the target, the source's same key voting beside).
fn transfers(groups: &Groups, how: &Transfer<'_>, report: &mut EvaluateReport) {
    for ((_, ns), (scope, target)) in groups {
        if how.target.is_some_and(|t| t != scope) {
            continue;
        }
        let (source, from_text): (Vec<Entry>, String) = match how.from {
            Source::Scope(from) if from == scope => continue,
            Source::Scope(from) => {
                let text = Value::Map(from.fields().clone()).to_string();
                match groups.get(&(from.fingerprint().to_hex(), ns.clone())) {
                    Some((_, source)) => (source.clone(), text),
                    None => {
                        let target = Value::Map(scope.fields().clone());
                        report
                            .skipped
                            .push(format!("{ns} in {target}: {text} has no keys of it"));
                        continue;
                    }
                }
            }
            Source::Others => {
                let others: Vec<Entry> = groups
                    .iter()
                    .filter(|((_, n), (s, _))| n == ns && s != scope)
                    .flat_map(|(_, (_, entries))| entries.iter().cloned())
                    .collect();
                if others.is_empty() {
                    let target = Value::Map(scope.fields().clone());
                    report
                        .skipped
                        .push(format!("{ns} in {target}: no other scope has keys of it"));
                    continue;
                }
                (others, "the other scopes".to_owned())
            }
        };
        let mut methods = methods_for(how.top, how.default, target);
        methods.fold_by = how.fold_by;
        let eval = match how.few_tuned {
            Some(folds) => {
                few_tuned_with(&source, target, &current, how.predictor, folds, &methods).overall
            }
            None => transfer(&source, target, &current, how.predictor, &methods),
        };
        let scope_text = Value::Map(scope.fields().clone()).to_string();
        if eval.held_out == 0 {
            // Nothing scored is no score: a share of the optimum over no key would read 100%.
            report.skipped.push(format!(
                "{ns} in {scope_text}: none of its {} keys could be predicted from {from_text} \
                 (no key with every candidate recorded and candidates in common); nothing evaluated",
                target.len()
            ));
            continue;
        }
        let mut g = group(ns.clone(), scope_text, target.len(), &eval);
        g.from = Some(from_text);
        g.baseline = baseline_note(how.default, &methods);
        report.groups.push(g);
    }
}

fn group(namespace: String, scope: String, keys: usize, eval: &Evaluation) -> Group {
    let n = eval.held_out.max(1) as f64;
    let row = |m: &MethodScore| MethodRow {
        method: m.method.clone(),
        share_of_optimum: m.share_of_optimum(),
        p10_share: m.p10_share,
        below_90_share: m.below_90 as f64 / n,
        exact_share: m.exact as f64 / n,
        measured_per_key: m.measured_per_key,
        tuning_share: m.tuning_share,
        worst_fold_share: None,
        fold_shares: Vec::new(),
    };
    Group {
        scope,
        namespace,
        from: None,
        keys,
        evaluated: eval.held_out,
        methods: eval.methods.iter().map(row).collect(),
        baseline: None,
    }
}
