//! Offline migration of a cache file (`tunecache migrate`), through the same code the
//! library's saver uses, so both write the same bytes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cache_format::Limits;
use cache_migrate::{Migrations, Report};

use crate::disk::{Disk, DiskOptions, Event, Failure, Paths};
use crate::error::StoreError;
use crate::fsio;
use crate::lock::CacheLock;

/// How to migrate.
#[derive(Debug, Clone)]
pub struct MigrateOptions {
    /// Keep the pre-migration files as `<file>.bak.<ms>`.
    pub backup: bool,
    /// Report what would change; write nothing and take no lock.
    pub dry_run: bool,
    /// Longest wait for the cache lock.
    pub lock_timeout: Duration,
    /// Decoding bounds.
    pub limits: Limits,
}

impl Default for MigrateOptions {
    fn default() -> Self {
        MigrateOptions {
            backup: false,
            dry_run: false,
            lock_timeout: Duration::from_secs(10),
            limits: Limits::default(),
        }
    }
}

/// What [`migrate_file`] did.
#[derive(Debug, Clone)]
pub enum MigrateOutcome {
    /// There is no cache file.
    Missing,
    /// The file is already at the current versions; nothing was written.
    Current {
        /// Entries in the file.
        entries: usize,
    },
    /// The file was (or, in a dry run, would be) migrated.
    Migrated {
        /// What the steps did.
        report: Report,
        /// Whether the file was rewritten (false in a dry run).
        written: bool,
        /// The backups kept, if any.
        backups: Vec<PathBuf>,
        /// Entries after the migration.
        entries: usize,
    },
}

fn failure(f: Failure) -> StoreError {
    match f {
        Failure::Blocked(b) => b.into_error(),
        Failure::Retry(e) => e,
    }
}

/// Migrates the cache at `path` (snapshot and journal) to `registry`'s current schema and
/// this build's format. The rewrite is the library's own compaction, under the same lock, so
/// its bytes equal what a `Cache` writes after migrating the same file on load.
///
/// A file that cannot be migrated (corrupt, no migration path, newer, another
/// application's) is an error, and is left untouched.
pub fn migrate_file(
    path: &Path,
    registry: &Migrations,
    options: &MigrateOptions,
) -> Result<MigrateOutcome, StoreError> {
    let paths = Paths::new(path.to_owned());
    if fsio::stat(&paths.snapshot)?.is_none() {
        return Ok(MigrateOutcome::Missing);
    }
    // Not a regular file (a device, a FIFO, a folder): refused before a lock file is made
    // beside it (`/dev/null.lock`, found by a hostile review).
    fsio::check_regular(&paths.snapshot)?;
    let disk_options = DiskOptions::new(options.limits).backup(options.backup);
    let mut disk = Disk::new(paths.clone(), Arc::new(registry.clone()), disk_options);
    // A real migration reads (and migrates) once, under the lock: what it writes is exactly
    // what it read. A dry run takes no lock.
    let lock = if options.dry_run {
        None
    } else {
        Some(CacheLock::acquire(
            &paths.lock,
            &paths.dir,
            options.lock_timeout,
        )?)
    };
    // A format 3 snapshot whose steps are all declarative migrates entry by entry into the new
    // table's bytes (its journal's records merged in): the decoded model is never held, so a
    // large file needs about twice its size in memory. A table walks its entries in place
    // into a spill: an index in memory. Anything either path declines is read the usual way
    // below.
    if let Some(outcome) = migrate_streamed(&mut disk, registry, options, lock.is_some())? {
        return Ok(outcome);
    }
    // A table likewise, entry by entry into a spill, then written in key order.
    if let Some(outcome) = migrate_table(&mut disk, lock.is_some())? {
        return Ok(outcome);
    }
    // A read that repairs nothing: an unusable file must be reported, not moved aside.
    let mut read = disk.read_updates(false).map_err(failure)?;
    let mut report = None;
    let mut damaged = false;
    for event in &read.events {
        match event {
            Event::Unusable { path, cause } => {
                return Err(StoreError::unusable(path.clone(), cause.clone()));
            }
            Event::Migrated { report: r, .. } => report = Some(r.clone()),
            Event::DamagedRecords { .. } | Event::TornTail { .. } => damaged = true,
            _ => {}
        }
    }
    if !read.needs_rewrite {
        // A table is read a key at a time: its count is in its commit.
        let entries = match disk.table() {
            Some(t) => usize::try_from(t.commit().entries).unwrap_or(usize::MAX),
            None => read.data.len(),
        };
        return Ok(MigrateOutcome::Current { entries });
    }
    let report = report.unwrap_or_else(|| Report {
        app: registry.app().to_owned(),
        from: registry.current(),
        to: registry.current(),
        entries: read.data.len() as u64,
        steps: Vec::new(),
        collisions: Vec::new(),
    });
    if lock.is_none() {
        return Ok(MigrateOutcome::Migrated {
            report,
            written: false,
            backups: Vec::new(),
            entries: read.data.len(),
        });
    }
    if damaged {
        // Damage in the journal is kept aside before the journal is replaced: that is the
        // locked read's job, so read again as the saver's compaction would.
        disk.reset();
        read = disk.read_updates(true).map_err(failure)?;
    }
    let mut data = read.data;
    data.merge(read.salvaged);
    let entries = data.len();
    let events = disk
        .write_table_of(&data, read.events, None)
        .map_err(failure)?;
    Ok(MigrateOutcome::Migrated {
        report,
        written: true,
        backups: backups_of(events),
        entries,
    })
}

/// The streamed path of [`migrate_file`], writing (`write`: the lock is held) what it made;
/// `None` when it declines and the usual read must answer.
fn migrate_streamed(
    disk: &mut Disk,
    registry: &Migrations,
    options: &MigrateOptions,
    write: bool,
) -> Result<Option<MigrateOutcome>, StoreError> {
    let Some(streamed) = disk.migrate_streamed().map_err(failure)? else {
        return Ok(None);
    };
    let entries = usize::try_from(streamed.entries).unwrap_or(usize::MAX);
    // A default that added fields may have crossed a reader's bounds: such a file takes the
    // usual path, which reports it.
    let within_bounds = !streamed.grew
        || streamed
            .snapshot
            .try_for_each_in_table_order(|key, _, ns, bytes| {
                cache_format::table::decode_entry(&key, ns, bytes, &options.limits).map(|_| ())
            })
            .is_ok();
    if !within_bounds {
        disk.reset();
        return Ok(None);
    }
    let _ = registry;
    let (written, backups) = if write {
        let events = disk
            .write_built(&streamed.snapshot, Vec::new())
            .map_err(failure)?;
        (true, backups_of(events))
    } else {
        (false, Vec::new())
    };
    Ok(Some(MigrateOutcome::Migrated {
        report: streamed.report,
        written,
        backups,
        entries,
    }))
}

/// The streamed path of [`migrate_file`] for a table (`Disk::migrate_table_streamed`),
/// writing (`write`: the lock is held) what it made; `None` when it declines.
fn migrate_table(disk: &mut Disk, write: bool) -> Result<Option<MigrateOutcome>, StoreError> {
    let Some(migration) = disk.migrate_table_streamed().map_err(failure)? else {
        return Ok(None);
    };
    let entries = usize::try_from(migration.spill.len()).unwrap_or(usize::MAX);
    let (written, backups) = if write {
        let events = disk
            .write_spilled(&migration.spill, Vec::new())
            .map_err(failure)?;
        (true, backups_of(events))
    } else {
        (false, Vec::new())
    };
    Ok(Some(MigrateOutcome::Migrated {
        report: migration.report,
        written,
        backups,
        entries,
    }))
}

/// The backups a write kept.
fn backups_of(events: Vec<Event>) -> Vec<PathBuf> {
    events
        .into_iter()
        .filter_map(|e| match e {
            Event::Backup { path } => Some(path),
            _ => None,
        })
        .collect()
}
