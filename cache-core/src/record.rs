//! Recording results into a cache file without a [`crate::Cache`], for one-shot writers such
//! as `tunecache put` and `import`: [`append_to_file`] appends one journal record under the
//! lock, at a cost that does not depend on the cache's size; [`merge_into_file`] merges many
//! entries with one read of the file and one write. A long-running program uses a `Cache`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cache_format::{CacheData, Entry, Limits, Scope};

use crate::spill::Spill;
use cache_migrate::Migrations;

use crate::check::check_entry;
use crate::disk::{Disk, DiskOptions, Failure, Paths};
use crate::error::StoreError;
use crate::lock::CacheLock;
use crate::namespace::Namespace;

/// How [`append_to_file`] writes.
#[derive(Debug, Clone)]
pub struct AppendOptions {
    /// Longest wait for the cache lock.
    pub lock_timeout: Duration,
    /// The bounds every entry is checked against (the readers' bounds).
    pub limits: Limits,
}

impl Default for AppendOptions {
    fn default() -> Self {
        AppendOptions {
            lock_timeout: Duration::from_secs(10),
            limits: Limits::default(),
        }
    }
}

/// What [`append_to_file`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Appended {
    /// The entries are durable, in one journal record.
    Done,
    /// Nothing was written: the file needs more than an append (no file yet, an older
    /// schema, a damaged or stale journal, a compaction due). Open a [`crate::Cache`] to
    /// record them: it reads, repairs, migrates and compacts.
    NeedsCache {
        /// Why, in a few words.
        reason: &'static str,
    },
}

/// Appends `entries` (of `scope`) to the cache file at `path` as one journal record, under
/// the cache lock, after reading only the snapshot's header and the journal's framing. The
/// file must be at `registry`'s application and current schema. Each entry is checked as
/// [`crate::Store::try_put`] checks it (an entry no reader could read is
/// [`StoreError::Refused`], and nothing is written) and timestamps from the future are set
/// to the present. The merge rule makes the record's entries combine with what the file
/// holds when it is read, exactly as if a `Cache` had saved them.
pub fn append_to_file(
    path: &Path,
    registry: &Migrations,
    scope: &Scope,
    entries: Vec<(Namespace, Entry)>,
    options: &AppendOptions,
) -> Result<Appended, StoreError> {
    let now = cache_format::now_millis();
    let mut batch = CacheData::new();
    for (ns, mut entry) in entries {
        check_entry(scope, ns.name(), &entry, &options.limits).map_err(|reason| {
            StoreError::Refused {
                namespace: ns.name().to_owned(),
                reason,
            }
        })?;
        entry.clamp_future(now);
        batch.insert(scope, ns.name(), entry);
    }
    let paths = Paths::new(path.to_owned());
    let disk_options = DiskOptions::new(options.limits).backup(false);
    // Nothing is created beside a path that is not a regular file, or for a cache that does
    // not exist yet (the full path creates it).
    crate::fsio::check_regular(&paths.snapshot)?;
    if crate::fsio::stat(&paths.snapshot)?.is_none() {
        return Ok(Appended::NeedsCache {
            reason: "no cache file yet",
        });
    }
    let mut disk = Disk::new(paths, Arc::new(registry.clone()), disk_options);
    let _lock = CacheLock::acquire(&disk.paths.lock, &disk.paths.dir, options.lock_timeout)?;
    match disk.append_unread(&batch) {
        Ok(Ok(())) => Ok(Appended::Done),
        Ok(Err(reason)) => Ok(Appended::NeedsCache { reason }),
        Err(Failure::Blocked(b)) => Err(b.into_error()),
        Err(Failure::Retry(e)) => Err(e),
    }
}

/// Merges `data` (entries of any scopes) into the cache file at `path`, under the lock: one
/// read of everything on disk (with the repairs and migration a `Cache` makes), then one
/// write, an append or, when due, a compaction that uses what was just read. Every entry is
/// checked first ([`StoreError::Refused`] for the first that no reader could read, and then
/// nothing is written) and timestamps from the future are set to the present. Returns how
/// many entries were merged. For an import: it holds the imported entries, what the file had
/// and the bytes written, not a `Cache`'s memory tier and save queue besides.
pub fn merge_into_file(
    path: &Path,
    registry: &Migrations,
    data: CacheData,
    options: &AppendOptions,
) -> Result<usize, StoreError> {
    let now = cache_format::now_millis();
    let mut batch = CacheData::new();
    for (scope, scope_data) in data.into_scopes() {
        for (ns, entries) in scope_data.into_namespaces() {
            for mut entry in entries.into_values() {
                check_entry(&scope, &ns, &entry, &options.limits).map_err(|reason| {
                    StoreError::Refused {
                        namespace: ns.clone(),
                        reason,
                    }
                })?;
                entry.clamp_future(now);
                batch.insert(&scope, &ns, entry);
            }
        }
    }
    merge_batch(path, registry, Batch::Model(batch), options)
}

/// [`merge_into_file`] of entries held as their bytes by a [`Spill`] (an import of a million
/// lines holds an index, not the entries). The caller has checked every entry with
/// [`check_entry`] and set timestamps from the future to the present. Into a file with nothing
/// in it yet the entries are written as a new table, streamed from the spill; into a table,
/// a few are merged as [`merge_into_file`] merges, many folded into it as one commit, each
/// read from the spill as the fold reaches it.
pub fn merge_built_into_file(
    path: &Path,
    registry: &Migrations,
    built: Spill,
    options: &AppendOptions,
) -> Result<usize, StoreError> {
    merge_batch(path, registry, Batch::Built(built), options)
}

/// The entries [`merge_batch`] writes.
enum Batch {
    Model(CacheData),
    Built(Spill),
}

fn merge_batch(
    path: &Path,
    registry: &Migrations,
    batch: Batch,
    options: &AppendOptions,
) -> Result<usize, StoreError> {
    let count = match &batch {
        Batch::Model(data) => data.len(),
        Batch::Built(built) => usize::try_from(built.len()).unwrap_or(usize::MAX),
    };
    let paths = Paths::new(path.to_owned());
    crate::fsio::check_regular(&paths.snapshot)?;
    // A first write on a fresh machine makes the cache's folder, as opening a cache does.
    std::fs::create_dir_all(&paths.dir).map_err(|e| StoreError::io("create", &paths.dir, e))?;
    let disk_options = DiskOptions::new(options.limits);
    let mut disk = Disk::new(paths, Arc::new(registry.clone()), disk_options);
    let _lock = CacheLock::acquire(&disk.paths.lock, &disk.paths.dir, options.lock_timeout)?;
    let failure = |f: Failure| match f {
        Failure::Blocked(b) => b.into_error(),
        Failure::Retry(e) => e,
    };
    // A table's fixed start and one commit, and the journal (under its bound): what a read
    // costs whatever the size of the cache. A file of an older format is read whole.
    let mut read = disk.read_updates(true).map_err(failure)?;
    let rewrite = read.needs_rewrite;
    let salvaged = std::mem::take(&mut read.salvaged);
    let mut batch = match batch {
        Batch::Built(built) if !disk.has_snapshot() && salvaged.is_empty() => {
            // Nothing to merge with: the spill's entries are the new table.
            let events = disk.write_spilled(&built, read.events).map_err(failure)?;
            crate::cache::log_events(&events);
            return Ok(count);
        }
        Batch::Built(built)
            if !rewrite && salvaged.is_empty() && disk.takes_spill(built.encoded_len()) =>
        {
            // Many entries into a table: one fold, each entry read from the spill as the fold
            // reaches its key (an entry the table holds as merging would leave it is kept).
            crate::cache::log_events(&read.events);
            let events = disk.fold_spilled(&built).map_err(failure)?;
            crate::cache::log_events(&events);
            return Ok(count);
        }
        Batch::Built(built) => built.into_data()?,
        Batch::Model(data) => data,
    };
    crate::cache::log_events(&read.events);
    // Entries the file already holds as merging would leave them change nothing and are not
    // written: importing the same source twice writes nothing the second time.
    batch = disk.without_unchanged(batch, &read.data);
    batch.merge(salvaged);
    if batch.is_empty() && !rewrite && disk.has_snapshot() {
        return Ok(count);
    }
    let events = disk.write_merging(&batch, rewrite).map_err(failure)?;
    crate::cache::log_events(&events);
    Ok(count)
}
