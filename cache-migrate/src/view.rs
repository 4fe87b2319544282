//! The schema-less view of a payload that migration steps edit: scopes, namespaces and
//! entries, where each entry stays a msgpack map (`rmpv::Value`) of whatever shape its
//! schema version had.

use cache_format::rmpv::Value;

use crate::error::MigrateError;

/// A whole payload, schema-less.
#[derive(Debug, Clone, PartialEq)]
pub struct PayloadView {
    /// The scopes, in file order.
    pub scopes: Vec<ScopeView>,
}

/// One scope: its fields (untouched by migrations) and its namespaces.
#[derive(Debug, Clone, PartialEq)]
pub struct ScopeView {
    /// The scope's fields, as stored.
    pub scope: Value,
    /// The namespaces, in file order.
    pub namespaces: Vec<NamespaceView>,
}

/// One namespace and its entries.
#[derive(Debug, Clone, PartialEq)]
pub struct NamespaceView {
    /// The namespace name.
    pub name: String,
    /// Each entry as a msgpack map (`fp`, `key`, `candidates`, ... in format 1).
    pub entries: Vec<Value>,
}

impl PayloadView {
    /// Splits a payload value (`{"scopes": [{"scope": .., "namespaces": {..}}]}`) into a view.
    pub fn from_value(value: Value) -> Result<Self, MigrateError> {
        let mut scopes_value = None;
        for (k, v) in into_map(value, "payload")? {
            if k.as_str() == Some("scopes") {
                scopes_value = Some(v);
            }
        }
        let scopes = match scopes_value {
            Some(Value::Array(items)) => items,
            Some(_) => return Err(MigrateError::shape("payload", "\"scopes\" is not a list")),
            None => return Err(MigrateError::shape("payload", "no \"scopes\" field")),
        };
        let mut out = Vec::with_capacity(scopes.len());
        for scope in scopes {
            let mut fields = None;
            let mut namespaces = Vec::new();
            for (k, v) in into_map(scope, "scope")? {
                match k.as_str() {
                    Some("scope") => fields = Some(v),
                    Some("namespaces") => {
                        for (name, entries) in into_map(v, "namespaces")? {
                            let name = match name {
                                Value::String(s) => s.into_str().ok_or_else(|| {
                                    MigrateError::shape(
                                        "namespaces",
                                        "a namespace name is not UTF-8",
                                    )
                                })?,
                                _ => {
                                    return Err(MigrateError::shape(
                                        "namespaces",
                                        "a namespace name is not a string",
                                    ));
                                }
                            };
                            let entries = match entries {
                                Value::Array(items) => items,
                                _ => {
                                    return Err(MigrateError::shape(
                                        "namespaces",
                                        format!(
                                            "namespace {name:?} does not hold a list of entries"
                                        ),
                                    ));
                                }
                            };
                            namespaces.push(NamespaceView { name, entries });
                        }
                    }
                    _ => {}
                }
            }
            out.push(ScopeView {
                scope: fields.ok_or_else(|| MigrateError::shape("scope", "no \"scope\" field"))?,
                namespaces,
            });
        }
        Ok(PayloadView { scopes: out })
    }

    /// Joins the view back into a payload value.
    pub fn into_value(self) -> Value {
        Value::Map(vec![(
            Value::from("scopes"),
            Value::Array(
                self.scopes
                    .into_iter()
                    .map(|s| {
                        Value::Map(vec![
                            (Value::from("scope"), s.scope),
                            (
                                Value::from("namespaces"),
                                Value::Map(
                                    s.namespaces
                                        .into_iter()
                                        .map(|n| (Value::from(n.name), Value::Array(n.entries)))
                                        .collect(),
                                ),
                            ),
                        ])
                    })
                    .collect(),
            ),
        )])
    }

    /// Every entry with its namespace name, mutably.
    pub fn entries_mut(&mut self) -> impl Iterator<Item = (&str, &mut Value)> {
        self.scopes.iter_mut().flat_map(|s| {
            s.namespaces.iter_mut().flat_map(|n| {
                let name = n.name.as_str();
                n.entries.iter_mut().map(move |e| (name, e))
            })
        })
    }

    /// Merges namespaces that share a name within a scope (after a rename), keeping the
    /// position of the first.
    pub fn normalize(&mut self) {
        for scope in &mut self.scopes {
            let mut merged: Vec<NamespaceView> = Vec::with_capacity(scope.namespaces.len());
            for ns in scope.namespaces.drain(..) {
                match merged.iter_mut().find(|m| m.name == ns.name) {
                    Some(existing) => existing.entries.extend(ns.entries),
                    None => merged.push(ns),
                }
            }
            scope.namespaces = merged;
        }
    }

    /// Number of entries.
    pub fn entry_count(&self) -> usize {
        self.scopes
            .iter()
            .flat_map(|s| &s.namespaces)
            .map(|n| n.entries.len())
            .sum()
    }
}

fn into_map(value: Value, what: &'static str) -> Result<Vec<(Value, Value)>, MigrateError> {
    match value {
        Value::Map(items) => Ok(items),
        _ => Err(MigrateError::shape(what, "is not a map")),
    }
}

/// Looks a field of a msgpack map up by name.
pub fn field<'a>(map: &'a Value, name: &str) -> Option<&'a Value> {
    match map {
        Value::Map(items) => items
            .iter()
            .find(|(k, _)| k.as_str() == Some(name))
            .map(|(_, v)| v),
        _ => None,
    }
}

/// Looks a field of a msgpack map up by name, mutably.
pub fn field_mut<'a>(map: &'a mut Value, name: &str) -> Option<&'a mut Value> {
    match map {
        Value::Map(items) => items
            .iter_mut()
            .find(|(k, _)| k.as_str() == Some(name))
            .map(|(_, v)| v),
        _ => None,
    }
}

/// Sets a field of a msgpack map, replacing it if present; returns false if `map` is not a map.
pub fn set_field(map: &mut Value, name: &str, value: Value) -> bool {
    match map {
        Value::Map(items) => {
            match items.iter_mut().find(|(k, _)| k.as_str() == Some(name)) {
                Some((_, v)) => *v = value,
                None => items.push((Value::from(name), value)),
            }
            true
        }
        _ => false,
    }
}

/// Removes a field of a msgpack map; returns it if it was there.
pub fn remove_field(map: &mut Value, name: &str) -> Option<Value> {
    match map {
        Value::Map(items) => {
            let at = items.iter().position(|(k, _)| k.as_str() == Some(name))?;
            Some(items.remove(at).1)
        }
        _ => None,
    }
}
