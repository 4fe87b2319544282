//! `tunecache evaluate --tuned-in FILE,...`: a workload never tuned, on a device whose other
//! workloads were. Every key of the cache is predicted from the keys of the same namespace and
//! scope in the other files (`gpu_tuner::predict::from_tuned`; a key both have would be a hit,
//! so it does not vote), with `--transfer-from`'s result for the same key voting beside them
//! as the tuner lets another device's.

use std::ops::ControlFlow;
use std::path::PathBuf;

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
    /// Whose result for the same key votes beside (`--transfer-from`).
    pub(super) beside: Option<&'a Source>,
    /// Only targets of this scope (`--scope`).
    pub(super) target: Option<&'a Scope>,
    pub(super) top: &'a [usize],
    pub(super) default: Option<&'a CandidateId>,
    pub(super) predictor: &'a Predictor,
}

/// The other files' entries, by scope and namespace as `groups` has them; a file that is not
/// there or cannot be read is an error naming it, damage within one is said on stderr.
fn read(ctx: &Context<'_>, paths: &[PathBuf]) -> anyhow::Result<Groups> {
    let mut tuned = Groups::new();
    for path in paths {
        if std::fs::symlink_metadata(path).is_err() {
            return Err(usage(format!(
                "--tuned-in {}: no such file",
                path.display()
            )));
        }
        let found = ctx.inspect_as_read(path)?;
        if let Some(GateVerdict::Refused { error, .. }) = &found.gate {
            anyhow::bail!("--tuned-in {}: cannot be read: {error}", path.display());
        }
        if found.snapshot.header.is_none() {
            anyhow::bail!("--tuned-in {}: holds no readable cache", path.display());
        }
        for problem in found.for_each_entry(|s, n, e| {
            tuned
                .entry((s.fingerprint().to_hex(), n.to_owned()))
                .or_insert_with(|| (s.clone(), Vec::new()))
                .1
                .push(e.clone());
            ControlFlow::Continue(())
        }) {
            crate::output::say(format_args!("damaged: {}: {problem}", path.display()));
        }
    }
    Ok(tuned)
}

/// Each group of the cache predicted from the same scope's and namespace's keys in the
/// `--tuned-in` files; a group they have no key of is listed as skipped.
pub(super) fn evaluate(
    ctx: &Context<'_>,
    how: &TunedIn<'_>,
    groups: &Groups,
    report: &mut EvaluateReport,
) -> anyhow::Result<()> {
    let tuned = read(ctx, how.paths)?;
    let names: Vec<String> = how.paths.iter().map(|p| p.display().to_string()).collect();
    let from_text = match how.beside {
        None => format!("the keys of {}", names.join(", ")),
        Some(Source::Scope(from)) => format!(
            "the keys of {}, with {}'s result for the same key beside them",
            names.join(", "),
            Value::Map(from.fields().clone())
        ),
        Some(Source::Others) => format!(
            "the keys of {}, with the other scopes' results for the same key beside them",
            names.join(", ")
        ),
    };
    for (group_key, (scope, target)) in groups {
        let ns = &group_key.1;
        let scope_text = Value::Map(scope.fields().clone()).to_string();
        let elsewhere: Vec<Entry> = match how.beside {
            None => Vec::new(),
            // The source scope's keys vote; they are not predicted.
            Some(Source::Scope(from)) if from == scope => continue,
            Some(Source::Scope(from)) => groups
                .get(&(from.fingerprint().to_hex(), ns.clone()))
                .map(|(_, e)| e.clone())
                .unwrap_or_default(),
            Some(Source::Others) => groups
                .iter()
                .filter(|((_, n), (s, _))| n == ns && s != scope)
                .flat_map(|(_, (_, e))| e.iter().cloned())
                .collect(),
        };
        if how.target.is_some_and(|t| t != scope) {
            continue;
        }
        let Some((_, others)) = tuned.get(group_key) else {
            report.skipped.push(format!(
                "{ns} in {scope_text}: no key of that namespace and scope in {}",
                names.join(", ")
            ));
            continue;
        };
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
                "{ns} in {scope_text}: none of its {} keys could be predicted from {from_text} \
                 (no key with every candidate recorded and candidates in common, or every key \
                 tuned there too); nothing evaluated",
                target.len()
            ));
            continue;
        }
        let mut g = group(ns.clone(), scope_text, target.len(), &eval);
        g.from = Some(from_text.clone());
        g.baseline = baseline_note(how.default, &methods);
        report.groups.push(g);
    }
    Ok(())
}
