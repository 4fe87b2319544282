//! Errors of the store. Each names the file and what went wrong.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cache_format::FormatError;
use cache_migrate::MigrateError;

/// Why a store operation did not complete.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// Another process held the cache lock for longer than the configured bound.
    #[error(
        "timed out after {waited:?} waiting for the lock {path} (another process holds it); will retry"
    )]
    LockTimeout {
        /// The lock file.
        path: PathBuf,
        /// How long we waited.
        waited: Duration,
    },
    /// A file operation failed.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// What we were doing (`read`, `write`, `rename`, ...).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: Arc<io::Error>,
    },
    /// A file is not a valid cache file.
    #[error("{path}: {source}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: FormatError,
    },
    /// A file's versions cannot be brought to the current ones.
    #[error("{path}: {source}")]
    Migrate {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: MigrateError,
    },
    /// A file cannot be used as it is (corrupt, no migration path, newer, foreign).
    #[error("{path}: {reason}")]
    Unusable {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The cache keeps results in memory only, so there is nothing to make durable.
    #[error("the cache is not persistent: {reason}")]
    NotPersistent {
        /// Why (disabled, read-only, unwritable location, newer file...).
        reason: String,
    },
    /// A flush did not finish within its bound; the save goes on in the background.
    #[error("flush did not finish within {0:?}; the save continues in the background")]
    FlushTimeout(Duration),
    /// A namespace name was rejected.
    #[error("invalid namespace {name:?}: {reason}")]
    InvalidNamespace {
        /// The name given.
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },
}

impl StoreError {
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        StoreError::Io {
            action,
            path: path.into(),
            source: Arc::new(source),
        }
    }
}
