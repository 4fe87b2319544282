//! The one function every read path calls: version gate, then migration, then typed decode.

use std::collections::HashMap;

use cache_format::rmpv::Value as Raw;
use cache_format::{Fields, Fingerprint, FormatVersion, Limits, Value};

use crate::error::MigrateError;
use crate::registry::{FORMAT_STEPS, Migrations, lift_format};
use crate::report::{Collision, Upgraded};
use crate::view::{PayloadView, field, set_field};

/// Gates, migrates and decodes the payload of a snapshot or journal record.
///
/// `app` and `schema` come from the header the payload was found under, `format` from its
/// envelope. Already-current data is decoded directly; older data goes through the
/// registry's chain of steps (on the typed model when every step is declarative and the data
/// decodes as it is, else on the schema-less view); anything else is an error value
/// (another application, a newer schema, no path), never a panic. Pure: no I/O.
pub fn upgrade(
    registry: &Migrations,
    format: FormatVersion,
    app: &str,
    schema: u32,
    payload: &[u8],
    limits: &Limits,
) -> Result<Upgraded, MigrateError> {
    registry.check(app, schema)?;
    if format.is_current_payload() && schema == registry.current() {
        return Ok(Upgraded {
            data: cache_format::raw::decode_payload(payload, limits)?,
            report: None,
        });
    }
    // Declarative steps on data that decodes as it is: applied to the typed model, with the
    // same result and report as below (typed.rs says when it declines).
    if format.is_current_payload()
        && let Some(up) = crate::typed::upgrade_typed(registry, schema, payload, limits)
    {
        return Ok(up);
    }
    upgrade_view(registry, format, schema, payload, limits)
}

/// [`upgrade`] for a snapshot that [`cache_format::read_snapshot`] verified. That read already
/// made the bounded scan and the census of its payload, so current data is decoded without
/// repeating them ([`cache_format::raw::decode_snapshot`]); anything else goes through
/// [`upgrade`] itself. The gate is the same.
pub fn upgrade_snapshot(
    registry: &Migrations,
    snap: &cache_format::Snapshot<'_>,
    limits: &Limits,
) -> Result<Upgraded, MigrateError> {
    let (app, schema) = (snap.header.app.as_str(), snap.header.schema);
    registry.check(app, schema)?;
    if snap.format.is_current_payload() && schema == registry.current() {
        return Ok(Upgraded {
            data: cache_format::raw::decode_snapshot(snap)?,
            report: None,
        });
    }
    // Declarative steps on the typed model, decoding without a second scan; declines go to
    // the view as in `upgrade`.
    if snap.format.is_current_payload()
        && registry
            .path(schema)
            .is_ok_and(|p| p.iter().all(|s| s.ops().is_some()))
        && let Ok(decoded) = cache_format::raw::decode_snapshot_counted(snap)
        && let Some(up) = crate::typed::upgrade_decoded(registry, schema, decoded, limits)
    {
        return Ok(up);
    }
    upgrade_view(registry, snap.format, schema, snap.payload_bytes(), limits)
}

/// The general path of [`upgrade`] after its gate: every step on the schema-less view, which
/// any step (coded ones too) and any payload can go through. [`upgrade`] takes the typed path
/// ([`crate::upgrade_typed`]) instead when it can, with the same result; this one is public so
/// tests can compare the two.
#[cfg_attr(
    not(feature = "testing"),
    allow(
        unreachable_pub,
        reason = "public only to the agreement tests (`testing`)"
    )
)]
pub fn upgrade_view(
    registry: &Migrations,
    format: FormatVersion,
    schema: u32,
    payload: &[u8],
    limits: &Limits,
) -> Result<Upgraded, MigrateError> {
    let value = cache_format::raw::payload_value(payload, limits)?;
    // Container format steps lift the payload to the current payload layout first (format 4
    // changed the file around the payload, not the payload: its step is the file's, which the
    // store reports when it rewrites an older file as a table).
    let (value, format_steps) = lift_format(
        FORMAT_STEPS,
        format.number().min(FormatVersion::CURRENT_PAYLOAD.number()),
        FormatVersion::CURRENT_PAYLOAD.number(),
        value,
    )?;
    let mut view = PayloadView::from_value(value)?;
    let mut report = registry.migrate_view(schema, &mut view)?;
    report.steps.splice(0..0, format_steps);
    report.collisions = refingerprint(&mut view)?;
    let data = cache_format::raw::data_from_value(&view.into_value(), limits)?;
    Ok(Upgraded {
        data,
        report: Some(report),
    })
}

/// Recomputes every entry's fingerprint from its (possibly migrated) key and reports keys
/// that now coincide within a namespace. Colliding entries are merged by the usual merge
/// rule when the payload is decoded; the report makes that visible.
pub(crate) fn refingerprint(view: &mut PayloadView) -> Result<Vec<Collision>, MigrateError> {
    let mut collisions = Vec::new();
    for scope in &mut view.scopes {
        for ns in &mut scope.namespaces {
            let mut seen: HashMap<Fingerprint, u64> = HashMap::with_capacity(ns.entries.len());
            for entry in &mut ns.entries {
                let key = field(entry, "key").ok_or_else(|| {
                    MigrateError::shape("entry", format!("in namespace {:?} has no key", ns.name))
                })?;
                let fields = match Value::try_from(key) {
                    Ok(Value::Map(fields)) => fields,
                    Ok(_) => Fields::new(),
                    Err(e) => {
                        return Err(MigrateError::shape(
                            "entry",
                            format!("in namespace {:?} has an invalid key: {e}", ns.name),
                        ));
                    }
                };
                let fp = Fingerprint::of_key(&fields);
                set_field(entry, "fp", Raw::Binary(fp.0.to_vec()));
                *seen.entry(fp).or_default() += 1;
            }
            let mut here: Vec<Collision> = seen
                .into_iter()
                .filter(|(_, n)| *n > 1)
                .map(|(fingerprint, merged)| Collision {
                    namespace: ns.name.clone(),
                    fingerprint,
                    merged,
                })
                .collect();
            here.sort_by_key(|c| c.fingerprint);
            collisions.extend(here);
        }
    }
    Ok(collisions)
}
