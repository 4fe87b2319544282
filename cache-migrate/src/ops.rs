//! Declarative migration operations. An operation is data: it can be reviewed in a file,
//! printed by the CLI and applied identically by the library and the CLI.

use std::fmt;

use cache_format::Value;
use cache_format::rmpv::Value as Raw;
use serde::{Deserialize, Serialize};

use crate::report::Change;
use crate::view::{PayloadView, field, field_mut, remove_field, set_field};

/// One declarative change to a schema-less payload. Filters (`namespace`, `algorithm`) are
/// optional: without them the operation applies everywhere.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Renames an algorithm in every candidate.
    RenameAlgorithm {
        /// The old name.
        from: String,
        /// The new name.
        to: String,
        /// Only in this namespace.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        namespace: Option<String>,
    },
    /// Renames a candidate param; a candidate that already has the new name is an error.
    RenameParam {
        /// The old name.
        from: String,
        /// The new name.
        to: String,
        /// Only for this algorithm.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        algorithm: Option<String>,
        /// Only in this namespace.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        namespace: Option<String>,
    },
    /// Removes a candidate param.
    DropParam {
        /// The param.
        name: String,
        /// Only for this algorithm.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        algorithm: Option<String>,
        /// Only in this namespace.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        namespace: Option<String>,
    },
    /// Gives a candidate param a value where it is absent.
    SetParamDefault {
        /// The param.
        name: String,
        /// Its value (a canonical value: no floats).
        value: Value,
        /// Only for this algorithm.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        algorithm: Option<String>,
        /// Only in this namespace.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        namespace: Option<String>,
    },
    /// Renames a namespace; entries meeting an existing namespace of that name are merged.
    RenameNamespace {
        /// The old name.
        from: String,
        /// The new name.
        to: String,
    },
    /// Removes a namespace and its entries.
    DropNamespace {
        /// The namespace.
        name: String,
    },
    /// Renames a key field (fingerprints are recomputed; collisions are reported).
    RenameKeyField {
        /// The old name.
        from: String,
        /// The new name.
        to: String,
        /// Only in this namespace.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        namespace: Option<String>,
    },
    /// Removes a key field (fingerprints are recomputed; collisions are reported).
    DropKeyField {
        /// The field.
        name: String,
        /// Only in this namespace.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        namespace: Option<String>,
    },
    /// Gives a key field a value where it is absent (fingerprints are recomputed).
    SetKeyFieldDefault {
        /// The field.
        name: String,
        /// Its value (a canonical value: no floats).
        value: Value,
        /// Only in this namespace.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        namespace: Option<String>,
    },
}

pub(crate) fn in_ns(filter: &Option<String>, ns: &str) -> bool {
    filter.as_deref().is_none_or(|want| want == ns)
}

fn scope_text(namespace: &Option<String>) -> String {
    namespace
        .as_deref()
        .map(|n| format!(" in {n}"))
        .unwrap_or_default()
}

/// Applies `f` to every candidate map of every entry in matching namespaces; returns how
/// many entries had at least one candidate changed.
fn each_candidate(
    view: &mut PayloadView,
    namespace: &Option<String>,
    algorithm: &Option<String>,
    mut f: impl FnMut(&mut Raw) -> Result<bool, ApplyError>,
) -> Result<u64, ApplyError> {
    let mut touched = 0;
    for (ns, entry) in view.entries_mut() {
        if !in_ns(namespace, ns) {
            continue;
        }
        let mut changed = false;
        if let Some(Raw::Array(candidates)) = field_mut(entry, "candidates") {
            for c in candidates {
                let matches = algorithm
                    .as_deref()
                    .is_none_or(|want| field(c, "algo").and_then(Raw::as_str) == Some(want));
                if matches {
                    changed |= f(c)?;
                }
            }
        }
        touched += u64::from(changed);
    }
    Ok(touched)
}

/// Applies `f` to the key map of every entry in matching namespaces; returns how many
/// entries changed.
fn each_key(
    view: &mut PayloadView,
    namespace: &Option<String>,
    mut f: impl FnMut(&mut Raw) -> Result<bool, ApplyError>,
) -> Result<u64, ApplyError> {
    let mut touched = 0;
    for (ns, entry) in view.entries_mut() {
        if !in_ns(namespace, ns) {
            continue;
        }
        if let Some(key) = field_mut(entry, "key") {
            touched += u64::from(f(key)?);
        }
    }
    Ok(touched)
}

fn rename_in_map(
    map: &mut Raw,
    from: &str,
    to: &str,
    what: &'static str,
) -> Result<bool, ApplyError> {
    if field(map, from).is_none() {
        return Ok(false);
    }
    if field(map, to).is_some() {
        return Err(ApplyError::RenameOnto {
            what,
            from: from.to_owned(),
            to: to.to_owned(),
        });
    }
    let value = remove_field(map, from).expect("checked above");
    set_field(map, to, value);
    Ok(true)
}

impl Op {
    /// Applies the operation to `view` and says what it changed.
    pub fn apply(&self, view: &mut PayloadView) -> Result<Change, ApplyError> {
        let n = match self {
            Op::RenameAlgorithm {
                from,
                to,
                namespace,
            } => each_candidate(view, namespace, &None, |c| match field_mut(c, "algo") {
                Some(algo) if algo.as_str() == Some(from.as_str()) => {
                    *algo = Raw::from(to.as_str());
                    Ok(true)
                }
                _ => Ok(false),
            })?,
            Op::RenameParam {
                from,
                to,
                algorithm,
                namespace,
            } => each_candidate(view, namespace, algorithm, |c| {
                match field_mut(c, "params") {
                    Some(params) => rename_in_map(params, from, to, "param"),
                    None => Ok(false),
                }
            })?,
            Op::DropParam {
                name,
                algorithm,
                namespace,
            } => each_candidate(view, namespace, algorithm, |c| {
                Ok(field_mut(c, "params")
                    .and_then(|p| remove_field(p, name))
                    .is_some())
            })?,
            Op::SetParamDefault {
                name,
                value,
                algorithm,
                namespace,
            } => {
                let raw = Raw::from(value);
                each_candidate(view, namespace, algorithm, |c| {
                    match field_mut(c, "params") {
                        Some(params) if field(params, name).is_none() => {
                            Ok(set_field(params, name, raw.clone()))
                        }
                        _ => Ok(false),
                    }
                })?
            }
            Op::RenameNamespace { from, to } => {
                let mut n = 0;
                for scope in &mut view.scopes {
                    for ns in &mut scope.namespaces {
                        if ns.name == *from {
                            ns.name = to.clone();
                            n += ns.entries.len() as u64;
                        }
                    }
                }
                view.normalize();
                n
            }
            Op::DropNamespace { name } => {
                let mut n = 0;
                for scope in &mut view.scopes {
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
            } => each_key(view, namespace, |k| rename_in_map(k, from, to, "key field"))?,
            Op::DropKeyField { name, namespace } => {
                each_key(view, namespace, |k| Ok(remove_field(k, name).is_some()))?
            }
            Op::SetKeyFieldDefault {
                name,
                value,
                namespace,
            } => {
                let raw = Raw::from(value);
                each_key(view, namespace, |k| {
                    Ok(field(k, name).is_none() && set_field(k, name, raw.clone()))
                })?
            }
        };
        Ok(self.change(n))
    }

    /// What applying the operation to `entries` entries did, as reports and logs say it.
    pub(crate) fn change(&self, entries: u64) -> Change {
        let (action, detail) = match self {
            Op::RenameAlgorithm {
                from,
                to,
                namespace,
            } => ("renamed", format!("{from}→{to}{}", scope_text(namespace))),
            Op::RenameParam {
                from,
                to,
                namespace,
                ..
            } => (
                "renamed param",
                format!("{from}→{to}{}", scope_text(namespace)),
            ),
            Op::DropParam {
                name, namespace, ..
            } => ("dropped param", format!("{name}{}", scope_text(namespace))),
            Op::SetParamDefault {
                name,
                value,
                namespace,
                ..
            } => (
                "set param default",
                format!("{name}={value}{}", scope_text(namespace)),
            ),
            Op::RenameNamespace { from, to } => ("moved", format!("namespace {from}→{to}")),
            Op::DropNamespace { name } => ("dropped", format!("namespace {name}")),
            Op::RenameKeyField {
                from,
                to,
                namespace,
            } => (
                "renamed key field",
                format!("{from}→{to}{}", scope_text(namespace)),
            ),
            Op::DropKeyField { name, namespace } => (
                "dropped key field",
                format!("{name}{}", scope_text(namespace)),
            ),
            Op::SetKeyFieldDefault {
                name,
                value,
                namespace,
            } => (
                "set key field default",
                format!("{name}={value}{}", scope_text(namespace)),
            ),
        };
        Change::new(action, detail, entries)
    }

    /// Whether the operation can change keys (and so fingerprints).
    pub fn touches_keys(&self) -> bool {
        matches!(
            self,
            Op::RenameKeyField { .. } | Op::DropKeyField { .. } | Op::SetKeyFieldDefault { .. }
        )
    }
}

impl fmt::Display for Op {
    /// The operation as one line of JSON, the form it has in a migration file.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match serde_json::to_string(self) {
            Ok(s) => f.write_str(&s),
            Err(_) => write!(f, "{self:?}"),
        }
    }
}

/// Why an [`Op`] could not be applied: the step fails, and the file is left as it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// A rename whose new name is already there (renaming would lose one of the two).
    #[error("cannot rename {what} {from:?} to {to:?}: {to:?} is already there")]
    RenameOnto {
        /// What was renamed: `param`, `key field`.
        what: &'static str,
        /// The old name.
        from: String,
        /// The new name, already present.
        to: String,
    },
}
