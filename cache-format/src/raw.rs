//! Decoders that skip the version gate: payload bytes to entries, or to the schema-less view,
//! exactly as stored, with no check of application, schema or format version. **They are the
//! gate's bypass**: anything that wants entries to use goes through `cache_migrate::upgrade`
//! (or `upgrade_snapshot`), which applies the gate before decoding and the migration in
//! between. Every decoder here takes [`Limits`] and scans before it decodes.
//!
//! Their real callers, the only ones they should have:
//! - cache-migrate's `upgrade`, `upgrade_snapshot` and the typed and streamed paths behind
//!   them (`upgrade.rs`, `typed.rs`): the gate is applied around them;
//! - cache-format's table (`table::decode_entry`), read by cache-core a key at a time only
//!   once the table's header passed the gate as current;
//! - cache-core's read-only inspection (`inspect/`): shows a file as stored and reports the
//!   gate it would apply separately (`GateVerdict`);
//! - xtask's golden-file check: decodes committed expected outputs to compare them.

use crate::census;
use crate::envelope::{Snapshot, scan_whole, value_from_bytes};
use crate::error::FormatError;
use crate::model::CacheData;
use crate::scan::Limits;
use crate::version::FormatVersion;
use crate::wire;

/// Decodes the schema-less view of a payload (e.g. after a migration) into the typed model
/// of the current format.
pub fn data_from_value(value: &rmpv::Value, limits: &Limits) -> Result<CacheData, FormatError> {
    let mut bytes = Vec::new();
    rmpv::encode::write_value(&mut bytes, value).expect("encoding to a Vec cannot fail");
    decode_payload(&bytes, limits)
}

/// Decodes payload bytes (of a snapshot or a journal record) at the current format, after
/// the bounded scan.
pub fn decode_payload(bytes: &[u8], limits: &Limits) -> Result<CacheData, FormatError> {
    scan_whole(bytes, "payload", limits)?;
    census::check(bytes, limits)?;
    wire::decode_payload(bytes, "payload")
}

/// Like [`decode_payload`], also returning how many entries the payload stores (entries of
/// one key stored twice in a namespace count twice; the model holds them merged).
pub fn decode_payload_counted(
    bytes: &[u8],
    limits: &Limits,
) -> Result<(CacheData, u64), FormatError> {
    scan_whole(bytes, "payload", limits)?;
    census::check(bytes, limits)?;
    wire::decode_payload_counted(bytes, "payload")
}

/// [`decode_snapshot`] with the entries counted as stored (see [`decode_payload_counted`]).
pub fn decode_snapshot_counted(snap: &Snapshot<'_>) -> Result<(CacheData, u64), FormatError> {
    match snap.format {
        // Format 2 added an optional candidate field that a format 1 payload lacks: one
        // decoder reads both.
        FormatVersion::V1 | FormatVersion::V2 | FormatVersion::V3 | FormatVersion::V4 => {
            wire::decode_payload_counted(snap.payload_bytes(), "payload")
        }
    }
}

/// Decodes payload bytes into the schema-less view, after the bounded scan.
pub fn payload_value(bytes: &[u8], limits: &Limits) -> Result<rmpv::Value, FormatError> {
    scan_whole(bytes, "payload", limits)?;
    census::check(bytes, limits)?;
    value_from_bytes(bytes, "payload")
}

/// Decodes a snapshot's payload as stored, at the current format. Its payload was scanned and
/// its census checked when [`crate::read_snapshot`] verified the envelope, so neither is done
/// again.
pub fn decode_snapshot(snap: &Snapshot<'_>) -> Result<CacheData, FormatError> {
    match snap.format {
        FormatVersion::V1 | FormatVersion::V2 | FormatVersion::V3 | FormatVersion::V4 => {
            wire::decode_payload(snap.payload_bytes(), "payload")
        }
    }
}

pub use crate::fastcheck::{EntryFacts, entry_decodes, entry_facts};
pub use crate::stream::{decode_entry, entry_fingerprint, walk_checked_payload, walk_payload};
