//! The tunecache file format: what the bytes on disk are, and nothing about where they live.
//!
//! This crate defines
//! - the canonical [`Value`]s allowed in keys, scopes and params, their canonical msgpack
//!   encoding, and the 128-bit [`Fingerprint`]s computed from it (identical for a Rust
//!   struct and for the same key given as JSON);
//! - the domain model: [`Key`], [`Scope`], [`Entry`] with ranked [`Candidate`]s, and
//!   [`CacheData`], with the one merge rule every layer uses ([`Entry::merge`]);
//! - the versioned snapshot envelope ([`encode_snapshot`], [`read_snapshot`]) and the
//!   append-only journal ([`encode_record`], [`scan_records`]), both valid msgpack end to end;
//! - [`raw`]: the decoders that skip the version gate, for cache-migrate and inspection only;
//! - bounded decoding ([`Limits`]): a hostile length prefix or nesting gives an error, never
//!   a large allocation or a panic.
//!
//! It does no I/O, takes no locks and knows nothing of GPUs; cache-core does the file
//! handling. The byte layout is specified in `FORMAT.md` at the repository root.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod build;
pub mod bundle;
mod candidate;
mod census;
mod clock;
mod envelope;
mod error;
mod fastcheck;
mod fingerprint;
mod journal;
pub mod json;
mod loose;
mod model;
pub mod raw;
mod scan;
mod ser;
mod stream;
pub mod table;
mod value;
mod version;
mod wire;

pub use build::SnapshotBuilder;
pub use candidate::{Candidate, CandidateId, Outcome, Stats, comparable, policy_class, rank};
pub use clock::{Millis, now_millis};
pub(crate) use envelope::ENVELOPE_VERSION;
pub use envelope::{
    Header, Snapshot, check_payload, encode_payload, encode_snapshot, peek_header, read_snapshot,
    read_snapshot_framing,
};
pub use error::FormatError;
pub use fingerprint::{Fingerprint, KEY_TAG, ParseFingerprintError};
pub use journal::{
    Damage, JournalHeader, JournalScan, Tail, encode_journal_header, encode_record,
    read_journal_header, scan_records,
};
pub use loose::{FAMILY_VERSION_PREFIX, differing_fields, loose_match};
pub use model::{CacheData, Entry, Key, Origin, Scope, ScopeData};
pub use scan::Limits;
pub use ser::{ValueError, to_fields};
pub use value::{Fields, Value, encode_fields};
pub use version::{FORMAT_VERSION, FormatVersion};

/// Re-exported so callers of the schema-less API need not depend on rmpv themselves.
pub use rmpv;
