//! Pruning a cache file (`tunecache gc`): entries past an age, the oldest entries past a size
//! limit, claim files no process holds, and, only when asked, the copies kept aside after
//! damage, migrations and torn appends.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cache_format::Limits;
use cache_migrate::Migrations;

use crate::disk::{Disk, DiskOptions, Event, Failure, Paths};
use crate::error::StoreError;
use crate::lock::CacheLock;
use crate::retention::{Retention, prune};

mod leftovers;

use leftovers::prune_leftovers;

/// What [`gc_file`] removes.
#[derive(Debug, Clone)]
pub struct GcPolicy {
    /// Keep the snapshot at most this many bytes, dropping the entries of stale scopes
    /// ([`crate::STALE_SCOPE_AFTER`]) first, then those recorded longest ago.
    pub max_bytes: Option<u64>,
    /// Drop entries recorded longer ago than this.
    pub max_age: Option<Duration>,
    /// Also remove the copies kept aside (`.unusable-*`, `.bak.*`, `.damaged-*`, `.torn-*`)
    /// older than this, counted from when each was set aside, and only those that hold a
    /// cache file or a journal (or the beginning of one).
    pub leftovers_older_than: Option<Duration>,
    /// Say what would go; change nothing.
    pub dry_run: bool,
    /// The longest wait for the cache's lock.
    pub lock_timeout: Duration,
    /// The bounds the rewritten file must meet.
    pub limits: Limits,
}

impl Default for GcPolicy {
    fn default() -> Self {
        GcPolicy {
            max_bytes: None,
            max_age: None,
            leftovers_older_than: None,
            dry_run: false,
            lock_timeout: Duration::from_secs(60),
            limits: Limits::default(),
        }
    }
}

/// What [`gc_file`] did (or, in a dry run, would do).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Entries before.
    pub entries_before: usize,
    /// Entries kept.
    pub entries_after: usize,
    /// Entries dropped for their age.
    pub dropped_by_age: usize,
    /// Entries dropped to meet the size limit.
    pub dropped_by_size: usize,
    /// Snapshot and journal bytes before.
    pub bytes_before: u64,
    /// Snapshot bytes after (the journal is folded in).
    pub bytes_after: u64,
    /// Claim files no process held, removed.
    pub claims_removed: usize,
    /// Copies kept aside, removed.
    pub leftovers_removed: Vec<PathBuf>,
}

/// Prunes the cache file at `path` (see [`GcPolicy`]) under its lock: one read with repairs
/// and migration, then one new snapshot if anything is dropped. "Least recently used" is
/// measured by when an entry was last recorded: the file keeps no read times.
pub fn gc_file(
    path: &Path,
    registry: &Migrations,
    policy: &GcPolicy,
) -> Result<GcReport, StoreError> {
    let paths = Paths::new(path.to_owned());
    crate::fsio::check_regular(&paths.snapshot)?;
    let size = |p: &Path| crate::fsio::stat(p).ok().flatten().map_or(0, |m| m.len());
    let mut report = GcReport {
        bytes_before: size(&paths.snapshot) + size(&paths.journal),
        ..GcReport::default()
    };
    let options = DiskOptions::new(policy.limits);
    let mut disk = Disk::new(paths.clone(), Arc::new(registry.clone()), options);
    let lock = CacheLock::acquire(&disk.paths.lock, &disk.paths.dir, policy.lock_timeout)?;
    let failure = |f: Failure| match f {
        Failure::Blocked(b) => b.into_error(),
        Failure::Retry(e) => e,
    };
    // gc moves nothing aside: a file it finds unusable is reported (a cache, or a command
    // that records, sets it aside and keeps its journal's records), and a dry run repairs
    // nothing at all. A first read that repairs nothing says which.
    let mut probe_disk = Disk::new(paths.clone(), Arc::new(registry.clone()), options);
    let probe = probe_disk.read_updates(false).map_err(failure)?;
    if let Some(Event::Unusable { path, cause }) = probe
        .events
        .iter()
        .find(|e| matches!(e, Event::Unusable { .. }))
    {
        return Err(StoreError::unusable(path.clone(), cause.clone()));
    }
    // Nor does it prune past damage, which its rewrite would leave behind (a copy kept, and
    // exit 0 with nothing said, before): it says what is damaged and stops.
    if let Some(why) = damage(&probe_disk, &probe) {
        return Err(StoreError::io(
            "prune",
            &paths.snapshot,
            std::io::Error::other(format!(
                "{why}; gc prunes no damaged cache (`tunecache verify` says what is lost; the \
                 next command that records keeps a copy of the damage and writes past it)"
            )),
        ));
    }
    let read = if policy.dry_run {
        probe
    } else {
        disk.read_updates(true).map_err(failure)?
    };
    let streams = disk.table().is_some()
        && !read.needs_rewrite
        && read.salvaged.is_empty()
        && !(policy.dry_run && disk.journal_holds_entries());
    if streams {
        gc_table(&mut disk, policy, &mut report).map_err(failure)?;
    } else {
        gc_whole(&mut disk, registry, policy, read, &mut report).map_err(failure)?;
    }
    if !policy.dry_run {
        report.bytes_after = size(&paths.snapshot) + size(&paths.journal);
    }
    report.claims_removed = prune_claims(path, policy.dry_run);
    if let Some(age) = policy.leftovers_older_than {
        report.leftovers_removed = prune_leftovers(&paths, age, policy.dry_run);
    }
    drop(lock);
    Ok(report)
}

/// The damage a read that repaired nothing found: a newest commit that does not read back,
/// journal records that fail their checks, or anything a check of every node and entry of
/// the table finds (a damaged entry a fold would have replaced silently: a third hostile
/// review). gc rewrites the whole table anyway; the check reads it once more.
fn damage(disk: &Disk, read: &crate::disk::Incoming) -> Option<String> {
    let table = disk.table();
    let passed = table.as_ref().and_then(|t| {
        t.passed_over().map(|p| {
            format!(
                "its newest commit ({}) does not read back: {}",
                p.seq, p.problem
            )
        })
    });
    let records = || {
        read.events.iter().find_map(|e| match e {
            Event::DamagedRecords { path, count, .. } => Some(format!(
                "{count} record(s) of {} fail their checks",
                path.display()
            )),
            _ => None,
        })
    };
    let walked = || {
        let t = table.as_ref()?;
        let report = cache_format::table::check_table(t, |_, _, _| ControlFlow::Continue(()));
        let first = report.problems.first()?;
        Some(match report.problems.len() {
            1 => first.clone(),
            n => format!("{first} (and {} more)", n - 1),
        })
    };
    passed.or_else(records).or_else(walked)
}

/// [`gc_file`] of a table (under the lock): the journal folded in, then the table rewritten
/// without what the limits drop, streamed as a compaction streams it (memory: the keys, not
/// the entries). A dry run plans the drops and writes nothing.
fn gc_table(disk: &mut Disk, policy: &GcPolicy, report: &mut GcReport) -> Result<(), Failure> {
    if !policy.dry_run {
        disk.fold_journal()?;
    }
    let retention = Retention {
        max_age: policy.max_age,
        max_bytes: policy.max_bytes,
    };
    let Some(rewrite) = disk.rewrite_with(retention) else {
        return Ok(());
    };
    let entries = usize::try_from(rewrite.entries()).unwrap_or(usize::MAX);
    report.entries_before = entries;
    let drops = rewrite.retention_drops(&std::sync::atomic::AtomicBool::new(false))?;
    report.dropped_by_age = drops.by_age;
    report.dropped_by_size = drops.keys.len() - drops.by_age;
    report.entries_after = entries - drops.keys.len();
    report.bytes_after = drops.bytes_after.unwrap_or(report.bytes_before);
    if policy.dry_run || drops.keys.is_empty() {
        return Ok(());
    }
    match rewrite.run_locked()? {
        crate::disk::Compacted::Done { .. } => Ok(()),
        crate::disk::Compacted::Dropped(why) => {
            Err(StoreError::io("rewrite", &disk.paths.snapshot, std::io::Error::other(why)).into())
        }
    }
}

/// [`gc_file`] of a file of an older format, or one needing repair: one read of everything,
/// one new table.
fn gc_whole(
    disk: &mut Disk,
    registry: &Migrations,
    policy: &GcPolicy,
    read: crate::disk::Incoming,
    report: &mut GcReport,
) -> Result<(), Failure> {
    let mut all = disk.read_all(!policy.dry_run)?;
    let salvaged = std::mem::take(&mut all.salvaged);
    let mut data = all.data;
    data.merge(salvaged);
    data.merge(read.salvaged);
    report.entries_before = data.len();
    let (kept, by_age, by_size, bytes) = prune(&data, registry, policy.max_age, policy.max_bytes);
    report.dropped_by_age = by_age;
    report.dropped_by_size = by_size;
    report.entries_after = kept.len();
    report.bytes_after = bytes;
    if !policy.dry_run && (by_age + by_size > 0 || read.needs_rewrite) {
        let lineage = disk.table().map(|t| t.lineage());
        disk.write_table_of(&kept, read.events, lineage)?;
    }
    Ok(())
}

/// Removes the claim files that no process holds (each is locked first, so a claim held by a
/// live process stays); returns how many went (or would go). Only a real folder named as the
/// cache's claims folder is looked into (never a symbolic link to somewhere else), and only
/// files named as claim files are touched.
fn prune_claims(path: &Path, dry_run: bool) -> usize {
    let dir = crate::claim::claims_dir(path);
    let is_folder = std::fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_dir());
    let Some(files) = std::fs::read_dir(&dir).ok().filter(|_| is_folder) else {
        return 0;
    };
    let mut removed = 0;
    for f in files.flatten() {
        let p = f.path();
        let named = f
            .file_name()
            .to_str()
            .is_some_and(crate::claim::is_claim_file);
        if !named || !f.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let Ok(file) = std::fs::OpenOptions::new().read(true).write(true).open(&p) else {
            continue;
        };
        if file.try_lock().is_err() {
            continue;
        }
        if dry_run || std::fs::remove_file(&p).is_ok() {
            removed += 1;
        }
    }
    removed
}
