//! Declarative steps applied to the typed model: the fast path of [`crate::upgrade`].
//!
//! The schema-less view (`view.rs`) can carry anything a step may meet, which costs a tree of
//! small allocations per entry, an encode and a second decode. When every step of the chain is
//! declarative and the payload decodes as it is, the same operations are applied here to the
//! decoded entries instead, with the same result and the same report.
//!
//! "The same" is kept simple by declining (returning `None`, so the caller takes the view)
//! whenever the two could differ: the payload does not decode strictly (stale fingerprints, a
//! shape the decoder refuses), it stores a key twice in a namespace, an operation fails, keys
//! collide after the steps, a namespace ends up with an empty name, or a default value pushes
//! a map past the bounds. Errors and collision reports therefore always come from the view.
//! `tests/it/typed.rs` checks the two paths agree on random payloads and steps.

use std::collections::HashSet;

use cache_format::{
    CacheData, Candidate, Fields, Fingerprint, Key, Limits, Millis, Origin, Scope, Value,
};

use crate::ops::{Op, in_ns};
use crate::registry::{Migrations, Step};
use crate::report::{Change, Report, StepReport};
use crate::upgrade::Upgraded;

struct TEntry {
    key: Fields,
    candidate_set: Fingerprint,
    origin: Origin,
    recorded_at: Millis,
    candidates: Vec<Candidate>,
}

struct TNamespace {
    name: String,
    entries: Vec<TEntry>,
}

struct TScope {
    scope: Scope,
    namespaces: Vec<TNamespace>,
}

/// Why the typed path declines: the caller takes the schema-less view.
struct Decline;

/// The chain's steps, if every one of them is declarative.
fn declarative_steps(registry: &Migrations, from: u32) -> Option<Vec<(&Step, &[Op])>> {
    let path = registry.path(from).ok()?;
    path.into_iter()
        .map(|s| s.ops().map(|ops| (s, ops)))
        .collect()
}

/// Migrates `payload` (a current-format payload at schema `from`) through `registry`'s steps
/// on the typed model, or `None` where it declines: not every step is declarative, the data
/// does not decode as it is, or the result could differ from [`crate::upgrade_view`]'s (an
/// operation fails, keys collide, a bound is crossed). [`crate::upgrade`] tries it first; it
/// is public so tests can compare the two paths. Does not apply the version gate.
pub fn upgrade_typed(
    registry: &Migrations,
    from: u32,
    payload: &[u8],
    limits: &Limits,
) -> Option<Upgraded> {
    declarative_steps(registry, from)?;
    let decoded = cache_format::raw::decode_payload_counted(payload, limits).ok()?;
    upgrade_decoded(registry, from, decoded, limits)
}

/// [`upgrade_typed`] on data already decoded (with its count as stored), e.g. from a snapshot
/// `read_snapshot` verified.
pub(crate) fn upgrade_decoded(
    registry: &Migrations,
    from: u32,
    (data, stored): (CacheData, u64),
    limits: &Limits,
) -> Option<Upgraded> {
    let steps = declarative_steps(registry, from)?;
    if stored != data.len() as u64 {
        return None;
    }
    let mut scopes = split(data);
    let mut report = Report {
        app: registry.app().to_owned(),
        from,
        to: registry.current(),
        entries: stored,
        steps: Vec::new(),
        collisions: Vec::new(),
    };
    let mut grew = false;
    for (step, ops) in steps {
        let mut changes = Vec::with_capacity(ops.len());
        for op in ops {
            let change = apply(op, &mut scopes).ok()?;
            grew |= change.entries > 0
                && matches!(
                    op,
                    Op::SetParamDefault { .. } | Op::SetKeyFieldDefault { .. }
                );
            changes.push(change);
        }
        normalize(&mut scopes);
        report.steps.push(StepReport {
            from: step.from(),
            to: step.to(),
            description: step.description().to_owned(),
            changes,
        });
    }
    let data = join(scopes).ok()?;
    if grew {
        // A default added a field somewhere: the bounds a reader applies must still hold.
        cache_format::check_payload(&cache_format::encode_payload(&data), limits).ok()?;
    }
    Some(Upgraded {
        data,
        report: Some(report),
    })
}

fn split(data: CacheData) -> Vec<TScope> {
    data.into_scopes()
        .map(|(scope, scope_data)| TScope {
            scope,
            namespaces: scope_data
                .into_namespaces()
                .map(|(name, entries)| TNamespace {
                    name,
                    entries: entries
                        .into_values()
                        .map(|e| {
                            let (key, candidate_set, origin, recorded_at, candidates) =
                                e.into_parts();
                            TEntry {
                                key: key.into_fields(),
                                candidate_set,
                                origin,
                                recorded_at,
                                candidates,
                            }
                        })
                        .collect(),
                })
                .collect(),
        })
        .collect()
}

/// Back to the model. Declines if keys now collide within a namespace (the view reports
/// collisions) or a namespace name is empty (the decoder refuses it).
fn join(scopes: Vec<TScope>) -> Result<CacheData, Decline> {
    let mut data = CacheData::new();
    for s in scopes {
        for ns in s.namespaces {
            if ns.name.is_empty() {
                return Err(Decline);
            }
            let mut seen: HashSet<Fingerprint> = HashSet::with_capacity(ns.entries.len());
            for e in ns.entries {
                let key = Key::new(e.key);
                if !seen.insert(key.fingerprint()) {
                    return Err(Decline);
                }
                let entry = cache_format::Entry::new(
                    key,
                    e.candidate_set,
                    e.origin,
                    e.recorded_at,
                    e.candidates,
                );
                data.insert(&s.scope, &ns.name, entry);
            }
        }
    }
    Ok(data)
}

/// Merges namespaces that share a name within a scope, keeping the first one's position (as
/// the view does after every step).
fn normalize(scopes: &mut [TScope]) {
    for scope in scopes {
        let mut merged: Vec<TNamespace> = Vec::with_capacity(scope.namespaces.len());
        for ns in scope.namespaces.drain(..) {
            match merged.iter_mut().find(|m| m.name == ns.name) {
                Some(existing) => existing.entries.extend(ns.entries),
                None => merged.push(ns),
            }
        }
        scope.namespaces = merged;
    }
}

/// Applies `f` to every candidate of every entry in matching namespaces (and of the matching
/// algorithm); counts the entries where it changed at least one.
fn each_candidate(
    scopes: &mut [TScope],
    namespace: &Option<String>,
    algorithm: &Option<String>,
    mut f: impl FnMut(&mut Candidate) -> Result<bool, Decline>,
) -> Result<u64, Decline> {
    let mut touched = 0;
    for ns in scopes.iter_mut().flat_map(|s| s.namespaces.iter_mut()) {
        if !in_ns(namespace, &ns.name) {
            continue;
        }
        for e in &mut ns.entries {
            let mut changed = false;
            for c in &mut e.candidates {
                if algorithm
                    .as_deref()
                    .is_none_or(|want| c.id.algorithm == want)
                {
                    changed |= f(c)?;
                }
            }
            touched += u64::from(changed);
        }
    }
    Ok(touched)
}

/// Applies `f` to the key of every entry in matching namespaces; counts the changed ones.
fn each_key(
    scopes: &mut [TScope],
    namespace: &Option<String>,
    mut f: impl FnMut(&mut Fields) -> Result<bool, Decline>,
) -> Result<u64, Decline> {
    let mut touched = 0;
    for ns in scopes.iter_mut().flat_map(|s| s.namespaces.iter_mut()) {
        if !in_ns(namespace, &ns.name) {
            continue;
        }
        for e in &mut ns.entries {
            touched += u64::from(f(&mut e.key)?);
        }
    }
    Ok(touched)
}

/// Moves field `from` to `to`; declines where `to` is already there (the view fails the step).
fn rename_in(map: &mut Fields, from: &str, to: &str) -> Result<bool, Decline> {
    if !map.contains_key(from) {
        return Ok(false);
    }
    if map.contains_key(to) {
        return Err(Decline);
    }
    let value = map.remove(from).ok_or(Decline)?;
    map.insert(to, value);
    Ok(true)
}

fn set_default(map: &mut Fields, name: &str, value: &Value) -> bool {
    if map.contains_key(name) {
        return false;
    }
    map.insert(name, value.clone());
    true
}

/// The typed twin of [`Op::apply`]: the same change, counted and described the same way.
fn apply(op: &Op, scopes: &mut [TScope]) -> Result<Change, Decline> {
    let n = match op {
        Op::RenameAlgorithm {
            from,
            to,
            namespace,
        } => each_candidate(scopes, namespace, &None, |c| {
            Ok(if c.id.algorithm == *from {
                c.id.algorithm = to.clone();
                true
            } else {
                false
            })
        })?,
        Op::RenameParam {
            from,
            to,
            algorithm,
            namespace,
        } => each_candidate(scopes, namespace, algorithm, |c| {
            rename_in(&mut c.id.params, from, to)
        })?,
        Op::DropParam {
            name,
            algorithm,
            namespace,
        } => each_candidate(scopes, namespace, algorithm, |c| {
            Ok(c.id.params.remove(name).is_some())
        })?,
        Op::SetParamDefault {
            name,
            value,
            algorithm,
            namespace,
        } => each_candidate(scopes, namespace, algorithm, |c| {
            Ok(set_default(&mut c.id.params, name, value))
        })?,
        Op::RenameNamespace { from, to } => {
            let mut n = 0;
            for ns in scopes.iter_mut().flat_map(|s| s.namespaces.iter_mut()) {
                if ns.name == *from {
                    ns.name = to.clone();
                    n += ns.entries.len() as u64;
                }
            }
            normalize(scopes);
            n
        }
        Op::DropNamespace { name } => {
            let mut n = 0;
            for scope in scopes.iter_mut() {
                scope.namespaces.retain(|ns| {
                    let drop = ns.name == *name;
                    if drop {
                        n += ns.entries.len() as u64;
                    }
                    !drop
                });
            }
            n
        }
        Op::RenameKeyField {
            from,
            to,
            namespace,
        } => each_key(scopes, namespace, |k| rename_in(k, from, to))?,
        Op::DropKeyField { name, namespace } => {
            each_key(scopes, namespace, |k| Ok(k.remove(name).is_some()))?
        }
        Op::SetKeyFieldDefault {
            name,
            value,
            namespace,
        } => each_key(scopes, namespace, |k| Ok(set_default(k, name, value)))?,
    };
    Ok(op.change(n))
}
