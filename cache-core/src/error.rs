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
    #[error("timed out after {waited:.1?} waiting for the lock {path} (another process holds it)")]
    LockTimeout {
        /// The lock file.
        path: PathBuf,
        /// How long we waited.
        waited: Duration,
    },
    /// A path that must be a regular file is something else (a device, a FIFO, a socket, a
    /// folder): tunecache neither reads, writes, locks nor renames it.
    #[error("{path} is not a regular file (it is {kind}); tunecache leaves it alone")]
    NotAFile {
        /// The path.
        path: PathBuf,
        /// What it is instead.
        kind: &'static str,
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
    /// A file is not a valid cache file (corrupt, truncated, too large, a newer format).
    #[error("{path}: {source}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: FormatError,
    },
    /// A file's versions cannot be brought to the current ones (another application's file,
    /// a newer schema, no migration path, a failing step).
    #[error("{path}: {source}")]
    Migrate {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: MigrateError,
    },
    /// The cache keeps results in memory only, so there is nothing to make durable.
    #[error("the cache is not persistent: {reason}")]
    NotPersistent {
        /// Why (disabled, read-only, unwritable location, newer file...).
        reason: String,
    },
    /// A flush did not finish within its bound; the save goes on in the background.
    #[error(
        "flush did not finish within {0:?}; the save goes on in the background while this process runs"
    )]
    FlushTimeout(Duration),
    /// An entry was refused where it entered ([`crate::Store::try_put`]): a file holding it
    /// could not be read back (non-finite timings, nesting or a size past the readers' bounds).
    /// Nothing of it was recorded.
    #[error("refused an entry of namespace {namespace:?}: {reason}; nothing was recorded")]
    Refused {
        /// The namespace the entry was put in.
        namespace: String,
        /// What is wrong with it.
        reason: Refusal,
    },
    /// A namespace name was rejected.
    #[error("invalid namespace {name:?}: {reason}")]
    InvalidNamespace {
        /// The name given.
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },
}

/// Why the bytes of a file cannot be used: their format, or their versions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Cause {
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error(transparent)]
    Migrate(#[from] MigrateError),
}

impl StoreError {
    /// The condition this error is an instance of, for saying it once: its kind (and, for an
    /// OS error, the action and the OS error's kind), never its text, which names temporary
    /// files (a full disk would otherwise be a new condition at every attempt).
    pub fn condition(&self) -> String {
        match self {
            StoreError::LockTimeout { .. } => "lock-timeout".to_owned(),
            StoreError::Io { action, source, .. } => format!("io:{action}:{:?}", source.kind()),
            StoreError::Format { path, .. } => format!("format:{}", path.display()),
            StoreError::Migrate { path, .. } => format!("migrate:{}", path.display()),
            StoreError::NotPersistent { .. } => "not-persistent".to_owned(),
            StoreError::FlushTimeout(_) => "flush-timeout".to_owned(),
            StoreError::InvalidNamespace { .. } => "namespace".to_owned(),
            StoreError::Refused { .. } => "refused".to_owned(),
            StoreError::NotAFile { path, .. } => format!("not-a-file:{}", path.display()),
        }
    }

    /// The error for a file that cannot be used, carrying the typed cause.
    pub(crate) fn unusable(path: impl Into<PathBuf>, cause: Cause) -> Self {
        let path = path.into();
        match cause {
            Cause::Format(source) => StoreError::Format { path, source },
            Cause::Migrate(source) => StoreError::Migrate { path, source },
        }
    }

    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        StoreError::Io {
            action,
            path: path.into(),
            source: Arc::new(source),
        }
    }
}

/// Why an entry is refused where it enters a cache: no reader would accept it back
/// ([`crate::check_entry`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    /// A field nests deeper than readers accept.
    #[error("{what} {name:?} nests {depth} levels; readers accept at most {max}")]
    TooDeep {
        /// What kind of field (`key field`, `scope field`, `<algorithm> param`).
        what: String,
        /// Its name.
        name: String,
        /// How deep it nests.
        depth: u32,
        /// How deep readers accept.
        max: u32,
    },
    /// A candidate's timings are not finite numbers.
    #[error("{candidate} has non-finite timings")]
    NonFinite {
        /// The candidate, as its label.
        candidate: String,
    },
    /// A candidate's timings are negative: no measurement gives them.
    #[error("{candidate} has negative timings")]
    Negative {
        /// The candidate, as its label.
        candidate: String,
    },
    /// Its encoding is beyond what a reader accepts (too many fields, too large).
    #[error("{0}")]
    Unreadable(cache_format::FormatError),
}
