//! Why a migration could not run.

use cache_format::FormatError;

/// Why a cache could not be brought to the current versions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MigrateError {
    /// The file belongs to another application.
    #[error("the file belongs to application {found:?}, not {expected:?}")]
    Foreign {
        /// The application named in the file.
        found: String,
        /// The application that opened it.
        expected: String,
    },
    /// The file's schema is newer than this build's: it must not be touched (downgrades are
    /// refused).
    #[error("schema version {found} is newer than this build's {current}; refusing to downgrade")]
    NewerSchema {
        /// The schema in the file.
        found: u32,
        /// The schema of this build.
        current: u32,
    },
    /// A step is missing in the chain.
    #[error("no migration path from schema {from} to {to}: no step starts at schema {missing}")]
    NoPath {
        /// The schema in the file.
        from: u32,
        /// The current schema.
        to: u32,
        /// The first version with no step leaving it.
        missing: u32,
    },
    /// A step reported an error.
    #[error("migration step {from}→{to} failed: {reason}")]
    StepFailed {
        /// The step's source version.
        from: u32,
        /// The step's target version.
        to: u32,
        /// What the step said.
        reason: String,
    },
    /// The schema-less data does not have the shape of a payload.
    #[error("cannot migrate: {what} {detail}")]
    Shape {
        /// What was being read.
        what: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// The data could not be decoded.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// A registry was built wrongly (a programming error in the application).
    #[error("invalid migration registry: {0}")]
    Registry(String),
}

impl MigrateError {
    pub(crate) fn shape(what: &'static str, detail: impl Into<String>) -> Self {
        MigrateError::Shape {
            what,
            detail: detail.into(),
        }
    }
}
