//! Pure migrations of tunecache data between schema versions: no I/O, no locks, no clock.
//!
//! An application registers [`Step`]s in a [`Migrations`] registry; [`upgrade`] gates a
//! payload by application and version, chains the steps from the file's version to the
//! current one over the schema-less [`PayloadView`], recomputes fingerprints, reports what
//! changed ([`Report`]) and decodes the result. cache-core calls [`upgrade`] on every read
//! path, including the read inside merge-on-save, so no path can skip the gate.
//!
//! What this crate is not: it does not read or write files (cache-core does, and keeps
//! backups), and it does not know what any application's algorithms mean.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod error;
mod ops;
mod registry;
mod report;
mod typed;
mod upgrade;
mod view;

pub use error::MigrateError;
pub use ops::{ApplyError, Op};
pub use registry::{
    FORMAT_STEPS, FormatStep, Gate, MigrationFile, Migrations, Step, StepFn, StepSpec,
};
pub use report::{Change, Collision, Report, StepReport, Upgraded};
pub use typed::{EntryMigration, Streamed, upgrade_streamed};
pub use upgrade::{upgrade, upgrade_snapshot};

/// The two appliers `upgrade` chooses between, for the tests that check they agree (the
/// `testing` feature; never in a normal build: `upgrade` and `upgrade_snapshot` are the way
/// in, with the version gate around them).
#[cfg(feature = "testing")]
pub mod testing {
    pub use crate::typed::upgrade_typed;
    pub use crate::upgrade::upgrade_view;
}
pub use view::{NamespaceView, PayloadView, ScopeView, field, field_mut, remove_field, set_field};
