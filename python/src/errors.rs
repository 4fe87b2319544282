//! The core's errors as Python exceptions a caller can catch by kind (after polars' mapping
//! of error kinds to exception classes): `CacheError` and its subclasses in
//! `tunecache._errors` (a refused entry, a foreign or newer file, a lock timeout, a shared
//! tier that is unreachable).

use cache_core::cache_migrate::MigrateError;
use cache_core::{ImportError, StoreError};
use cache_remote::RemoteError;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::CacheError;

/// The exception classes of `tunecache._errors`.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Refused,
    Foreign,
    LockTimeout,
    Unreachable,
}

impl Kind {
    fn class(self) -> &'static str {
        match self {
            Kind::Refused => "RefusedEntryError",
            Kind::Foreign => "ForeignFileError",
            Kind::LockTimeout => "LockTimeoutError",
            Kind::Unreachable => "SharedTierUnreachableError",
        }
    }
}

/// A `RefusedEntryError`: an entry no reader would accept, refused where it enters.
pub(crate) fn refused(message: String) -> PyErr {
    raise(Kind::Refused, message)
}

/// An exception of `kind` with `message`; a plain `CacheError` if the class cannot be found
/// (the extension imported without its package).
fn raise(kind: Kind, message: String) -> PyErr {
    Python::attach(|py| {
        let class = py
            .import("tunecache._errors")
            .and_then(|m| m.getattr(kind.class()));
        match class {
            Ok(class) => match class.call1((message.clone(),)) {
                Ok(instance) => PyErr::from_value(instance),
                Err(e) => e,
            },
            Err(_) => CacheError::new_err(message),
        }
    })
}

/// A store error as the exception of its kind.
pub(crate) fn store(e: &StoreError) -> PyErr {
    let message = e.to_string();
    match e {
        StoreError::Refused { .. } | StoreError::InvalidNamespace { .. } => {
            raise(Kind::Refused, message)
        }
        StoreError::LockTimeout { .. } | StoreError::FlushTimeout(_) => {
            raise(Kind::LockTimeout, message)
        }
        StoreError::Migrate { source, .. } if foreign(source) => raise(Kind::Foreign, message),
        _ => CacheError::new_err(message),
    }
}

/// Whether a migration error says the data is another application's or newer.
fn foreign(e: &MigrateError) -> bool {
    matches!(
        e,
        MigrateError::Foreign { .. } | MigrateError::NewerSchema { .. }
    )
}

/// An import error: a bad line is a `ValueError`; lines of another application or a newer
/// schema a `ForeignFileError`; an entry no reader would accept a `RefusedEntryError`.
pub(crate) fn import(e: &ImportError) -> PyErr {
    let message = e.to_string();
    match e {
        ImportError::Line(_) => PyValueError::new_err(message),
        ImportError::Foreign { .. } | ImportError::Newer { .. } => raise(Kind::Foreign, message),
        ImportError::Migrate { error, .. } if foreign(error) => raise(Kind::Foreign, message),
        ImportError::Unreadable { .. }
        | ImportError::Namespace { .. }
        | ImportError::Refused { .. } => raise(Kind::Refused, message),
        _ => CacheError::new_err(message),
    }
}

/// A shared tier's error: an outage is a `SharedTierUnreachableError`.
pub(crate) fn remote(e: &RemoteError) -> PyErr {
    if e.is_outage() {
        raise(Kind::Unreachable, e.to_string())
    } else {
        CacheError::new_err(e.to_string())
    }
}
