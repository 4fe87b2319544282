//! `tunecache evaluate --tuned-in FILE [--tuned-in FILE ...]`: a workload never tuned, on a
//! device whose other workloads were. Every key of the cache is predicted from the keys of the
//! same namespace and scope in the other files (`gpu_tuner::predict::from_tuned`; a key both
//! have would be a hit, so it does not vote; a key two files hold votes once), with
//! `--transfer-from`'s result for the same key voting beside them as the tuner lets another
//! device's.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use cache_core::GateVerdict;
use cache_format::{CandidateId, Entry, Scope, Value};
use gpu_tuner::predict::{Predictor, from_tuned};

use super::{EvaluateReport, Groups, Source, baseline_note, current, group, methods_for};
use crate::context::Context;
use crate::options::usage;

/// What `--tuned-in` evaluates with.
pub(super) struct TunedIn<'a> {
    /// The other workloads' cache files.
    pub(super) paths: &'a [PathBuf],
    /// The cache evaluated, and its application (what the other files must be of).
    pub(super) cache: &'a Path,
    pub(super) app: Option<&'a str>,
    /// Whose result for the same key votes beside (`--transfer-from`).
    pub(super) beside: Option<&'a Source>,
    /// Only targets of this scope (`--scope`).
    pub(super) target: Option<&'a Scope>,
    pub(super) top: &'a [usize],
    pub(super) default: Option<&'a CandidateId>,
    pub(super) predictor: &'a Predictor,
}

/// Each scope's and namespace's keys in the other files, one entry per key (a key two files
/// hold merged, by the merge rule), with the files that had keys there.
type Tuned = BTreeMap<(String, String), (Vec<Entry>, BTreeSet<String>)>;

/// A usage error for a file named twice, or the cache itself (its keys would all be hits).
fn refuse_repeats(how: &TunedIn<'_>) -> anyhow::Result<()> {
    let same = |a: &Path, b: &Path| match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    };
    for (i, path) in how.paths.iter().enumerate() {
        if same(path, how.cache) {
            return Err(usage(format!(
                "--tuned-in {}: that is the cache evaluated (its own keys never vote)",
                path.display()
            )));
        }
        if let Some(earlier) = how.paths[..i].iter().find(|p| same(p, path)) {
            return Err(usage(format!(
                "--tuned-in {}: the same file as --tuned-in {}",
                path.display(),
                earlier.display()
            )));
        }
    }
    Ok(())
}

/// The other files' entries (see [`Tuned`]); a file that is not there, cannot be read or is
/// another application's is an error naming it, damage within one is said on stderr.
fn read(ctx: &Context<'_>, how: &TunedIn<'_>) -> anyhow::Result<Tuned> {
    let mut by_key: BTreeMap<(String, String), BTreeMap<String, Entry>> = BTreeMap::new();
    let mut files: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for path in how.paths {
        let named = path.display().to_string();
        if std::fs::symlink_metadata(path).is_err() {
            anyhow::bail!("--tuned-in {named}: no such file");
        }
        let found = ctx
            .inspect_as_read(path)
            .map_err(|e| anyhow::anyhow!("--tuned-in {named}: {e:#}"))?;
        if let Some(GateVerdict::Refused { error, .. }) = &found.gate {
            anyhow::bail!("--tuned-in {named}: cannot be read: {error}");
        }
        let Some(header) = &found.snapshot.header else {
            anyhow::bail!("--tuned-in {named}: holds no readable cache");
        };
        if let Some(app) = how.app.filter(|a| *a != header.app) {
            anyhow::bail!(
                "--tuned-in {named}: it is {}'s cache, not {app}'s (the one evaluated)",
                header.app
            );
        }
        for problem in found.for_each_entry(|s, n, e| {
            let group = (s.fingerprint().to_hex(), n.to_owned());
            files
                .entry(group.clone())
                .or_default()
                .insert(named.clone());
            let keys = by_key.entry(group).or_default();
            match keys.get_mut(&e.fingerprint().to_hex()) {
                Some(held) => held.merge(e.clone()),
                None => {
                    keys.insert(e.fingerprint().to_hex(), e.clone());
                }
            }
            ControlFlow::Continue(())
        }) {
            crate::output::say(format_args!("damaged (--tuned-in): {problem}"));
        }
    }
    Ok(by_key
        .into_iter()
        .map(|(group, keys)| {
            let named = files.remove(&group).unwrap_or_default();
            (group, (keys.into_values().collect(), named))
        })
        .collect())
}

/// Each group of the cache predicted from the same scope's and namespace's keys in the
/// `--tuned-in` files; a group they have no key of is listed as skipped.
pub(super) fn evaluate(
    ctx: &Context<'_>,
    how: &TunedIn<'_>,
    groups: &Groups,
    report: &mut EvaluateReport,
) -> anyhow::Result<()> {
    refuse_repeats(how)?;
    let tuned = read(ctx, how)?;
    let mut used = BTreeSet::new();
    for (group_key, (scope, target)) in groups {
        let ns = &group_key.1;
        let scope_text = Value::Map(scope.fields().clone()).to_string();
        let (elsewhere, beside): (Vec<Entry>, String) = match how.beside {
            None => (Vec::new(), String::new()),
            // The source scope's keys vote; they are not predicted.
            Some(Source::Scope(from)) if from == scope => continue,
            Some(Source::Scope(from)) => (
                groups
                    .get(&(from.fingerprint().to_hex(), ns.clone()))
                    .map(|(_, e)| e.clone())
                    .unwrap_or_default(),
                format!("{}'s result", Value::Map(from.fields().clone())),
            ),
            Some(Source::Others) => (
                groups
                    .iter()
                    .filter(|((_, n), (s, _))| n == ns && s != scope)
                    .flat_map(|(_, (_, e))| e.iter().cloned())
                    .collect(),
                "the other scopes' results".to_owned(),
            ),
        };
        if how.target.is_some_and(|t| t != scope) {
            continue;
        }
        let Some((others, named)) = tuned.get(group_key) else {
            report.skipped.push(format!(
                "{ns} in {scope_text}: no --tuned-in file holds keys of that namespace and scope"
            ));
            continue;
        };
        let files = named.iter().cloned().collect::<Vec<_>>().join(", ");
        let methods = methods_for(how.top, how.default, target);
        let eval = from_tuned(
            others,
            &elsewhere,
            target,
            &current,
            how.predictor,
            &methods,
        );
        if eval.held_out == 0 {
            report.skipped.push(format!(
                "{ns} in {scope_text}: none of its {} keys could be predicted from the keys of \
                 {files} (none of them comparable: other key fields or text values such as the \
                 dtype; or every key tuned there too; a key is scored when it has two or more \
                 candidates, each recorded)",
                target.len()
            ));
            continue;
        }
        used.extend(named.iter().cloned());
        let mut g = group(ns.clone(), scope_text, target.len(), &eval);
        g.from = Some(if elsewhere.is_empty() {
            format!("the keys of {files}")
        } else {
            format!("the keys of {files}, with {beside} for the same key beside them")
        });
        g.baseline = baseline_note(how.default, &methods);
        report.groups.push(g);
    }
    for path in how.paths {
        let named = path.display().to_string();
        if !used.contains(&named) {
            crate::output::say(format_args!(
                "--tuned-in {named}: no key of it predicted any key evaluated (other scopes or \
                 namespaces, or nothing comparable); not used"
            ));
        }
    }
    Ok(())
}
