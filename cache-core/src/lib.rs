//! The tunecache store: remembers, per application and scope, the ranked candidates measured
//! for each problem key, and keeps them safe on disk across threads, processes, crashes and
//! upgrades.
//!
//! - [`Store`] is the small trait every tier implements; [`MemoryStore`] is the in-memory
//!   tier (sharded, lock-per-shard, no allocation on a hit).
//! - [`Cache`] puts a `MemoryStore` in front of a file: a snapshot plus an append-only
//!   journal, written under a cross-process lock with a bounded wait by one background
//!   saver per cache, durable within about `save_delay` of a change or at once on
//!   [`Store::flush`]. Every read path goes through the same version gate and migration
//!   ([`cache_migrate::upgrade`]). An unusable file is moved aside, a newer one is left
//!   untouched, an unwritable location degrades to memory: each with one warning.
//! - [`CacheBuilder`] configures it, with `TUNECACHE_*` environment overrides.
//! - [`ArtifactStore`] keeps content-addressed blobs (compiled kernels) with a size limit
//!   and least-recently-used eviction.
//!
//! What it is not: it does not measure anything (gpu-tuner does) and knows nothing of GPUs.
#![deny(missing_docs)]

mod artifact;
mod background;
mod bundle;
mod cache;
mod check;
mod claim;
mod config;
mod deadline;
mod disk;
mod error;
mod flight;
mod fork_safe;
mod fsio;
mod gc;
mod host;
mod import;
mod inspect;
mod lock;
mod memory;
mod migrate;
mod namespace;
mod record;
mod retention;
pub mod settings;
mod sigint;
mod spill;
mod store;
mod tablefile;
mod tier;
mod writer;

pub use artifact::{ARTIFACT_HEADER_LEN, ArtifactStore, Blob, BlobCheck, BlobInfo, Eviction};
pub use background::{spawn_background, with_signals_blocked};
pub use bundle::{BundleCheck, BundleWriter, BundleWritten, check_bundle, open_bundle};
pub use cache::system::{ENV_SYSTEM_PATH, serve_files};
pub use cache::{Cache, Health, Imported, MemoryLookup, Mode};
pub use check::check_entry;
pub use claim::{Claim, ClaimGuard};
pub use config::{
    CacheBuilder, Location, MemoryOnly, SwitchError, Switches, default_dir, file_name,
};
pub use deadline::{deadline_after, deadline_from};
pub use error::{Refusal, StoreError};
pub use flight::{Follower, Join, Leader, SingleFlight};
pub use fork_safe::GlobalLock;
pub use gc::{GcPolicy, GcReport, gc_file};
pub use host::{host_name, measured_entry, measured_here};
pub use import::{ImportError, ImportLines};
pub use inspect::{
    GateVerdict, InKeyOrder, Inspection, JournalInfo, KeyedEntry, SnapshotInfo, inspect,
};
pub use memory::MemoryStore;
pub use migrate::{MigrateOptions, MigrateOutcome, migrate_file};
pub use namespace::{MAX_NAMESPACE_LEN, MAX_NAMESPACES, Namespace};
pub use record::{AppendOptions, Appended, append_to_file, merge_built_into_file, merge_into_file};
pub use retention::{Retention, STALE_SCOPE_AFTER};
pub use sigint::{catch_sigint, sigint_requested};
pub use spill::Spill;
pub use store::Store;
pub use tier::{Fill, Tier, TierContext, TierHealth, TierLink, TierSource};
pub use writer::TableWriter;

/// The file primitives every part of tunecache writes and locks with (the output cache, the
/// CLI's bundle writer, the artifact store): one atomic write, one lock.
pub mod file {
    pub use crate::fsio::{
        AtomicFile, open_regular, read_bounded, remove_abandoned_temporaries, write_atomic,
    };
    pub use crate::lock::FileLock;
}

pub use cache_format;
pub use cache_migrate;
