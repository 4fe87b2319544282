//! Writing a new cache file (a table) from entries in key order, in one pass and bounded
//! memory, for tools that produce one (`tunecache merge -o`, a bundle's table): each entry
//! checked as `try_put` checks it, the file written to a temporary beside the path, synced,
//! and linked into place only if nothing is there (never replacing anything).

use std::path::{Path, PathBuf};

use cache_format::table::{TKey, TableBuilder, namespace_hash};
use cache_format::{Entry, Limits, Scope};
use cache_migrate::Migrations;

use crate::error::StoreError;
use crate::tablefile::NewTable;

/// A new cache file being written (see the module docs).
#[derive(Debug)]
pub struct TableWriter {
    out: NewTable,
    path: PathBuf,
    limits: Limits,
    last: Option<TKey>,
}

impl TableWriter {
    /// Starts a new table of `registry`'s application at its current schema at `path`, which
    /// must not exist (anything there is refused, and left alone).
    pub fn create(
        path: &Path,
        registry: &Migrations,
        limits: &Limits,
    ) -> Result<TableWriter, StoreError> {
        refuse_existing(path)?;
        let builder = TableBuilder::new(registry.app(), registry.current(), None);
        Ok(TableWriter {
            out: NewTable::create(path, builder)?,
            path: path.to_owned(),
            limits: *limits,
            last: None,
        })
    }

    /// The table key an entry of namespace `ns` in `scope` is filed under: entries must come
    /// in ascending order of it.
    pub fn key_of(scope: &Scope, ns: &str, entry: &Entry) -> TKey {
        TKey::new(
            &scope.fingerprint(),
            &namespace_hash(ns),
            &entry.fingerprint(),
        )
    }

    /// Adds `entry` of namespace `ns` in `scope`: checked as `try_put` checks it (an entry no
    /// reader would accept is [`StoreError::Refused`]); its key must be greater than every
    /// key added before.
    pub fn add(&mut self, scope: &Scope, ns: &str, entry: &Entry) -> Result<(), StoreError> {
        let key = Self::key_of(scope, ns, entry);
        let bytes = cache_format::table::encode_entry(entry);
        crate::check::check_encoded(scope, ns, entry, &key, &bytes, &self.limits).map_err(
            |reason| StoreError::Refused {
                namespace: ns.to_owned(),
                reason,
            },
        )?;
        if self.last.is_some_and(|last| last >= key) {
            return Err(crate::tablefile::format_error(
                &self.path,
                cache_format::FormatError::Invalid {
                    what: "table",
                    detail: "entries out of key order".to_owned(),
                },
            ));
        }
        self.last = Some(key);
        self.out.add(key, scope, ns, &bytes)
    }

    /// Finishes the file and puts it in place; returns its size in bytes.
    pub fn finish(self) -> Result<u64, StoreError> {
        let written = self.out.written()?;
        written.commit_new()?;
        Ok(crate::fsio::stat(&self.path)?.map_or(0, |m| m.len()))
    }
}

/// Fails if anything is at `path` (even a dangling link).
fn refuse_existing(path: &Path) -> Result<(), StoreError> {
    if std::fs::symlink_metadata(path).is_ok() {
        return Err(StoreError::io(
            "create",
            path,
            std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "a file is already there (remove it first)",
            ),
        ));
    }
    Ok(())
}
