//! The value stored for one entry (a one-entry snapshot, FORMAT.md "Shared tier") and the
//! checks a value read from the server must pass before it is used: the same version gate
//! and migration as a file, then the poisoning filters.

use cache_format::{CacheData, Entry, Fingerprint, Limits, Outcome, Scope, now_millis};
use cache_migrate::{MigrateError, Migrations};

use crate::options::RemoteOptions;

/// How far ahead of this machine's clock a remote timestamp may be.
const FUTURE_SLACK_MS: u64 = 60_000;

/// Why a remote value was refused: the counter it goes to.
pub(crate) type Rejection = &'static str;

/// The value stored for one entry: a snapshot (FORMAT.md) holding that one entry in its
/// scope and namespace.
pub fn encode_value(registry: &Migrations, scope: &Scope, ns: &str, entry: &Entry) -> Vec<u8> {
    let mut data = CacheData::new();
    data.insert(scope, ns, entry.clone());
    cache_format::encode_snapshot(registry.app(), registry.current(), &data)
}

/// What a value read for one key must be.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Expect<'a> {
    pub(crate) scope: &'a Fingerprint,
    pub(crate) ns: &'a str,
    pub(crate) fp: &'a Fingerprint,
}

/// Checks a remote value for `expect`'s key as every read path checks a file, then the
/// poisoning filters; returns the entry as stored (origin untouched).
pub(crate) fn check_value(
    bytes: &[u8],
    registry: &Migrations,
    limits: &Limits,
    options: &RemoteOptions,
    expect: Expect<'_>,
) -> Result<(Scope, Entry), Rejection> {
    if bytes.len() > options.max_value_bytes {
        return Err("oversized");
    }
    let snap = cache_format::read_snapshot(bytes, limits).map_err(|_| "damaged")?;
    let upgraded = cache_migrate::upgrade(
        registry,
        snap.format,
        &snap.header.app,
        snap.header.schema,
        snap.payload_bytes(),
        limits,
    )
    .map_err(|e| match e {
        MigrateError::Foreign { .. } => "foreign application",
        MigrateError::NewerSchema { .. } => "newer schema",
        _ => "not migratable",
    })?;
    let data = upgraded.data;
    if data.len() != 1 {
        return Err("not one entry");
    }
    let (found_scope, found_ns, entry) = data.entries().next().ok_or("not one entry")?;
    if found_scope.fingerprint() != *expect.scope {
        return Err("wrong scope");
    }
    if found_ns != expect.ns || entry.fingerprint() != *expect.fp {
        return Err("wrong key");
    }
    cache_core::check_entry(found_scope, found_ns, entry, limits)
        .map_err(|_| "unreadable entry")?;
    let latest = now_millis().saturating_add(FUTURE_SLACK_MS);
    if entry.recorded_at() > latest || entry.candidates().iter().any(|c| c.measured_at > latest) {
        return Err("future timestamp");
    }
    let implausible = entry.candidates().iter().any(|c| match &c.outcome {
        Outcome::Measured(s) => {
            // No measured kernel takes no time: a zero median is made up.
            s.median_ns <= 0.0
                || s.min_ns < 0.0
                || s.spread_ns < 0.0
                || s.min_ns > s.median_ns
                || s.samples < options.min_samples
        }
        // A failure, or a winner another tool chose: no figures to judge.
        Outcome::Failed(_) | Outcome::Chosen(_) => false,
    });
    if implausible {
        return Err("implausible statistics");
    }
    Ok((found_scope.clone(), entry.clone()))
}
