//! Declarative steps applied to the typed model, one entry at a time: the fast path of
//! [`crate::upgrade`], and [`upgrade_streamed`], which never holds the whole model.
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

use cache_format::raw::{EntryFacts, decode_entry, walk_checked_payload};
use cache_format::{CacheData, Entry, Fields, Key, Limits, Scope, SnapshotBuilder, Value};

use crate::ops::{Op, in_ns};
use crate::registry::{Migrations, Step};
use crate::report::Upgraded;
use crate::report::{Report, StepReport};

/// Why the typed path declines: the caller takes the schema-less view.
struct Decline;

/// A chain of declarative steps, and how many entries each of its operations changed so far.
struct Chain<'r> {
    steps: Vec<(&'r Step, &'r [Op])>,
    counts: Vec<Vec<u64>>,
}

impl<'r> Chain<'r> {
    /// The chain from schema `from`, if every step of it is declarative.
    fn new(registry: &'r Migrations, from: u32) -> Option<Self> {
        let steps: Vec<(&Step, &[Op])> = registry
            .path(from)
            .ok()?
            .into_iter()
            .map(|s| s.ops().map(|ops| (s, ops)))
            .collect::<Option<_>>()?;
        let counts = steps.iter().map(|(_, ops)| vec![0; ops.len()]).collect();
        Some(Chain { steps, counts })
    }

    /// Passes one entry of namespace `ns` through every operation, in order, counting it
    /// where an operation changes it: the namespace and entry it becomes, or `None` if a step
    /// drops its namespace.
    fn migrate(&mut self, ns: &str, entry: Entry) -> Result<Option<(String, Entry)>, Decline> {
        let (key, candidate_set, origin, recorded_at, mut candidates) = entry.into_parts();
        let mut ns = ns.to_owned();
        let mut fields: Option<Fields> = None;
        for ((_, ops), counts) in self.steps.iter().zip(&mut self.counts) {
            for (op, count) in ops.iter().zip(counts.iter_mut()) {
                let changed = match op {
                    Op::RenameNamespace { from, to } => {
                        let hit = ns == *from;
                        if hit {
                            ns.clone_from(to);
                        }
                        hit
                    }
                    Op::DropNamespace { name } => {
                        if ns == *name {
                            *count += 1;
                            return Ok(None);
                        }
                        false
                    }
                    // The key's fields are copied out only when an operation changes them.
                    Op::RenameKeyField {
                        from,
                        to,
                        namespace,
                    } => {
                        in_ns(namespace, &ns)
                            && has(&fields, &key, from)
                            && rename_in(key_fields(&mut fields, &key), from, to)?
                    }
                    Op::DropKeyField { name, namespace } => {
                        in_ns(namespace, &ns)
                            && has(&fields, &key, name)
                            && key_fields(&mut fields, &key).remove(name).is_some()
                    }
                    Op::SetKeyFieldDefault {
                        name,
                        value,
                        namespace,
                    } => {
                        in_ns(namespace, &ns)
                            && !has(&fields, &key, name)
                            && set_default(key_fields(&mut fields, &key), name, value)
                    }
                    _ => candidate_op(op, &ns, &mut candidates)?,
                };
                *count += u64::from(changed);
            }
        }
        let key = match fields {
            Some(fields) => Key::new(fields),
            None => key,
        };
        Ok(Some((
            ns,
            Entry::new(key, candidate_set, origin, recorded_at, candidates),
        )))
    }

    /// Whether an operation that adds fields changed anything: the bounds a reader applies
    /// must then be checked again.
    fn grew(&self) -> bool {
        self.steps
            .iter()
            .zip(&self.counts)
            .any(|((_, ops), counts)| {
                ops.iter().zip(counts).any(|(op, n)| {
                    *n > 0
                        && matches!(
                            op,
                            Op::SetParamDefault { .. } | Op::SetKeyFieldDefault { .. }
                        )
                })
            })
    }

    /// The report of what the chain did, from schema `from` over `stored` entries.
    fn report(&self, registry: &Migrations, from: u32, stored: u64) -> Report {
        Report {
            app: registry.app().to_owned(),
            from,
            to: registry.current(),
            entries: stored,
            steps: self
                .steps
                .iter()
                .zip(&self.counts)
                .map(|((step, ops), counts)| StepReport {
                    from: step.from(),
                    to: step.to(),
                    description: step.description().to_owned(),
                    changes: ops
                        .iter()
                        .zip(counts)
                        .map(|(op, n)| op.change(*n))
                        .collect(),
                })
                .collect(),
            collisions: Vec::new(),
        }
    }
}

/// Whether the key (as changed so far) has the field `name`.
fn has(fields: &Option<Fields>, key: &Key, name: &str) -> bool {
    fields
        .as_ref()
        .unwrap_or_else(|| key.fields())
        .contains_key(name)
}

/// The key's fields, taken out of `key` on first change.
fn key_fields<'f>(fields: &'f mut Option<Fields>, key: &Key) -> &'f mut Fields {
    fields.get_or_insert_with(|| key.fields().clone())
}

/// An operation on candidates: applies it to those of `candidates` it selects (in namespace
/// `ns`); whether it changed at least one.
fn candidate_op(
    op: &Op,
    ns: &str,
    candidates: &mut [cache_format::Candidate],
) -> Result<bool, Decline> {
    let (namespace, algorithm) = match op {
        Op::RenameAlgorithm { namespace, .. } => (namespace, &None),
        Op::RenameParam {
            namespace,
            algorithm,
            ..
        }
        | Op::DropParam {
            namespace,
            algorithm,
            ..
        }
        | Op::SetParamDefault {
            namespace,
            algorithm,
            ..
        } => (namespace, algorithm),
        _ => return Ok(false),
    };
    if !in_ns(namespace, ns) {
        return Ok(false);
    }
    let mut changed = false;
    for c in candidates.iter_mut() {
        if algorithm
            .as_deref()
            .is_some_and(|want| c.id.algorithm != want)
        {
            continue;
        }
        changed |= match op {
            Op::RenameAlgorithm { from, to, .. } => {
                let hit = c.id.algorithm == *from;
                if hit {
                    c.id.algorithm.clone_from(to);
                }
                hit
            }
            Op::RenameParam { from, to, .. } => rename_in(&mut c.id.params, from, to)?,
            Op::DropParam { name, .. } => c.id.params.remove(name).is_some(),
            Op::SetParamDefault { name, value, .. } => set_default(&mut c.id.params, name, value),
            _ => false,
        };
    }
    Ok(changed)
}

/// Declarative steps applied one entry at a time, for a reader that walks a file's entries in
/// place (a table, in key order): each entry as the typed path ([`upgrade_streamed`]) migrates
/// it, and the same report. The caller declines what that path declines: keys that collide
/// after the steps, and (when [`EntryMigration::grew`]) entries past a reader's bounds.
pub struct EntryMigration<'r> {
    chain: Chain<'r>,
    registry: &'r Migrations,
    from: u32,
    stored: u64,
}

impl std::fmt::Debug for EntryMigration<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EntryMigration")
            .field("from", &self.from)
            .field("to", &self.registry.current())
            .field("stored", &self.stored)
            .finish_non_exhaustive()
    }
}

impl<'r> EntryMigration<'r> {
    /// The steps from schema `from` to `registry`'s current one; `None` unless every one of
    /// them is declarative.
    pub fn new(registry: &'r Migrations, from: u32) -> Option<Self> {
        Some(EntryMigration {
            chain: Chain::new(registry, from)?,
            registry,
            from,
            stored: 0,
        })
    }

    /// One entry of namespace `ns`, migrated: `Some(Some((ns, entry)))`, `Some(None)` when a
    /// step drops its namespace, `None` when an operation declines (or leaves an empty
    /// namespace name): the whole path must then be taken, which reports why.
    pub fn migrate(&mut self, ns: &str, entry: Entry) -> Option<Option<(String, Entry)>> {
        self.stored += 1;
        match self.chain.migrate(ns, entry).ok()? {
            Some((ns, _)) if ns.is_empty() => None,
            out => Some(out),
        }
    }

    /// Whether an operation that adds fields changed an entry (the caller then checks the
    /// migrated entries against the reader's bounds).
    pub fn grew(&self) -> bool {
        self.chain.grew()
    }

    /// What the steps did to the entries given so far.
    pub fn report(&self) -> Report {
        self.chain.report(self.registry, self.from, self.stored)
    }
}

/// Migrates `payload` (a current-format payload at schema `from`) through `registry`'s steps
/// on the typed model, or `None` where it declines: not every step is declarative, the data
/// does not decode as it is, or the result could differ from [`crate::upgrade_view`]'s (an
/// operation fails, keys collide, a bound is crossed). [`crate::upgrade`] tries it first; it
/// is public so tests can compare the two paths. Does not apply the version gate.
#[cfg_attr(
    not(feature = "testing"),
    allow(
        unreachable_pub,
        reason = "public only to the agreement tests (`testing`)"
    )
)]
pub fn upgrade_typed(
    registry: &Migrations,
    from: u32,
    payload: &[u8],
    limits: &Limits,
) -> Option<Upgraded> {
    Chain::new(registry, from)?;
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
    let mut chain = Chain::new(registry, from)?;
    if stored != data.len() as u64 {
        return None;
    }
    let mut out = CacheData::new();
    for (scope, scope_data) in data.into_scopes() {
        for (ns, entries) in scope_data.into_namespaces() {
            for entry in entries.into_values() {
                let Some((ns, entry)) = chain.migrate(&ns, entry).ok()? else {
                    continue;
                };
                // Keys that collide after the steps, and empty names, are the view's to report.
                if ns.is_empty() || out.get(&scope, &ns, &entry.fingerprint()).is_some() {
                    return None;
                }
                out.insert(&scope, &ns, entry);
            }
        }
    }
    if chain.grew() {
        // A default added a field somewhere: the bounds a reader applies must still hold.
        cache_format::check_payload(&cache_format::encode_payload(&out), limits).ok()?;
    }
    Some(Upgraded {
        data: out,
        report: Some(chain.report(registry, from, stored)),
    })
}

/// A migration made entry by entry from a payload's bytes into a new snapshot's
/// ([`upgrade_streamed`]).
#[derive(Debug)]
pub struct Streamed {
    /// The migrated entries, encoded.
    pub snapshot: SnapshotBuilder,
    /// What the steps did (as [`crate::upgrade`] reports it).
    pub report: Report,
    /// Whether an operation added fields: the finished snapshot must be checked against the
    /// reader's bounds before it is written (a writer does that anyway).
    pub grew: bool,
}

/// the typed path (`upgrade_typed`) without ever holding the model: each entry of `payload` (a
/// current-format payload at schema `from`, not yet scanned) is decoded, passed through the
/// steps and encoded into a [`SnapshotBuilder`] before the next is read, so the memory needed
/// is the payload's bytes and the new entries' bytes, not a decoded model. The same result
/// and report as the typed path (`upgrade_typed`) (a test compares them); `None` wherever that declines, and
/// also for a payload not in the order this crate writes (scopes, namespace names and key
/// fingerprints each strictly increasing), where a key stored twice could hide.
pub fn upgrade_streamed(
    registry: &Migrations,
    from: u32,
    payload: &[u8],
    limits: &Limits,
) -> Option<Streamed> {
    let mut chain = Chain::new(registry, from)?;
    let mut snapshot = SnapshotBuilder::new();
    let mut stored = 0u64;
    let mut last: Option<(Scope, String, cache_format::Fingerprint)> = None;
    let mut failed = false;
    let walked = walk_checked_payload(
        payload,
        limits,
        |scope, ns, bytes, facts: Option<EntryFacts>| {
            let step = (|| {
                let entry = decode_entry(bytes, ns).ok()?;
                let fp = facts.map_or_else(|| entry.fingerprint(), |f| f.fingerprint);
                // In the written order, a key cannot be stored twice unseen.
                if last
                    .as_ref()
                    .is_some_and(|(s, n, f)| (s, n.as_str(), *f) >= (scope, ns, fp))
                {
                    return None;
                }
                match &mut last {
                    Some((s, n, f)) if s == scope => {
                        if n != ns {
                            *n = ns.to_owned();
                        }
                        *f = fp;
                    }
                    _ => last = Some((scope.clone(), ns.to_owned(), fp)),
                }
                stored += 1;
                if let Some((ns, entry)) = chain.migrate(ns, entry).ok()?
                    && (ns.is_empty() || !snapshot.insert_new(scope, &ns, &entry))
                {
                    return None;
                }
                Some(())
            })();
            if step.is_none() {
                failed = true;
                return std::ops::ControlFlow::Break(());
            }
            std::ops::ControlFlow::Continue(())
        },
    );
    if failed || walked.is_err() {
        return None;
    }
    Some(Streamed {
        snapshot,
        grew: chain.grew(),
        report: chain.report(registry, from, stored),
    })
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
