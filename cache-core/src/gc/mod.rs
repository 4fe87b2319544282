//! Pruning a cache file (`tunecache gc`): entries past an age, the oldest entries past a size
//! limit, claim files no process holds, and, only when asked, the copies kept aside after
//! damage, migrations and torn appends.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cache_format::{CacheData, Fingerprint, Limits, Scope, now_millis};
use cache_migrate::Migrations;

use crate::disk::{Disk, DiskOptions, Event, Failure, Paths};
use crate::error::StoreError;
use crate::lock::CacheLock;

mod leftovers;

use leftovers::prune_leftovers;

/// What [`gc_file`] removes.
#[derive(Debug, Clone)]
pub struct GcPolicy {
    /// Keep the snapshot at most this many bytes, dropping the entries of stale scopes
    /// ([`STALE_SCOPE_AFTER`]) first, then those recorded longest ago.
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

/// How long entries are kept, and how large a snapshot may grow: applied by a `Cache` at each
/// compaction (see [`crate::CacheBuilder::retention`]) and by [`gc_file`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    /// Drop entries recorded longer ago than this.
    pub max_age: Option<Duration>,
    /// Drop the entries recorded longest ago until the snapshot is at most this many bytes.
    pub max_bytes: Option<u64>,
}

/// A scope with no result recorded for this long, while others of the same file received
/// results since, is stale: a size limit drops its entries before any other's.
pub const STALE_SCOPE_AFTER: Duration = Duration::from_secs(30 * 24 * 3600);

/// The order a size limit drops scopes in: a scope nothing was recorded in for
/// [`STALE_SCOPE_AFTER`] while the file kept receiving results elsewhere (an old driver, a
/// retired GPU kind) goes whole before any other entry, the scope that went quiet longest ago
/// first; then every other entry, oldest first. One rule for [`prune`] and [`plan_drops`].
struct Staleness {
    /// Each scope's newest result.
    newest: std::collections::HashMap<Fingerprint, u64>,
    /// The file's newest result.
    file_newest: u64,
}

impl Staleness {
    /// From each entry's scope and recording time.
    fn of(entries: impl Iterator<Item = (Fingerprint, u64)>) -> Self {
        let mut newest = std::collections::HashMap::new();
        for (scope, at) in entries {
            let n = newest.entry(scope).or_insert(0u64);
            *n = (*n).max(at);
        }
        let file_newest = newest.values().copied().max().unwrap_or(0);
        Staleness {
            newest,
            file_newest,
        }
    }

    /// A scope's place in the drop order: stale scopes first (the quietest first), then the
    /// rest, equal (their entries then go oldest first).
    fn rank(&self, scope: &Fingerprint) -> (u8, u64) {
        let stale_gap = u64::try_from(STALE_SCOPE_AFTER.as_millis()).unwrap_or(u64::MAX);
        let last = self.newest.get(scope).copied().unwrap_or(0);
        if last.saturating_add(stale_gap) < self.file_newest {
            (0, last)
        } else {
            (1, 0)
        }
    }
}

/// The time before which an entry is older than `max_age`, if there is an age limit.
fn oldest_kept(max_age: Option<Duration>) -> Option<u64> {
    max_age
        .map(|age| now_millis().saturating_sub(u64::try_from(age.as_millis()).unwrap_or(u64::MAX)))
}

/// `data` without the entries recorded before `max_age` ago, then without the entries of
/// stale scopes (see [`STALE_SCOPE_AFTER`]) and those recorded longest ago until its snapshot
/// encodes in at most `max_bytes`; returns what is
/// kept, how many went for age and for size, and the encoded size of what is kept.
pub(crate) fn prune(
    data: &CacheData,
    registry: &Migrations,
    max_age: Option<Duration>,
    max_bytes: Option<u64>,
) -> (CacheData, usize, usize, u64) {
    // Oldest first, ties broken by identity so the choice does not depend on map order.
    let mut all: Vec<(u64, Fingerprint, String, Fingerprint, Scope)> = data
        .entries()
        .map(|(s, ns, e)| {
            (
                e.recorded_at(),
                s.fingerprint(),
                ns.to_owned(),
                e.fingerprint(),
                s.clone(),
            )
        })
        .collect();
    let staleness = Staleness::of(all.iter().map(|(at, s, ..)| (*s, *at)));
    all.sort_by(|a, b| {
        let (ra, rb) = (staleness.rank(&a.1), staleness.rank(&b.1));
        (ra, a.0, a.1, &a.2, a.3).cmp(&(rb, b.0, b.1, &b.2, b.3))
    });
    let oldest_kept = oldest_kept(max_age);
    let mut kept = CacheData::new();
    let mut by_age = 0;
    let mut order = Vec::new();
    for (at, _, ns, fp, scope) in &all {
        if oldest_kept.is_some_and(|t| *at < t) {
            by_age += 1;
            continue;
        }
        order.push((scope.clone(), ns.clone(), *fp));
    }
    for (scope, ns, fp) in &order {
        if let Some(e) = data.get(scope, ns, fp) {
            kept.insert(scope, ns, e.clone());
        }
    }
    // Drop the oldest until the encoded snapshot fits: first by each entry's share of the
    // payload, then exactly.
    let mut bytes = encoded_len(registry, &kept);
    let mut by_size = 0;
    if let Some(max) = max_bytes
        && bytes > max
    {
        let per_entry = bytes as f64 / kept.len().max(1) as f64;
        let estimate = (((bytes - max) as f64 / per_entry).ceil() as usize).min(order.len());
        let mut dropped = estimate.saturating_sub(1);
        loop {
            let mut smaller = CacheData::new();
            for (scope, ns, fp) in &order[dropped..] {
                if let Some(e) = data.get(scope, ns, fp) {
                    smaller.insert(scope, ns, e.clone());
                }
            }
            bytes = encoded_len(registry, &smaller);
            kept = smaller;
            if bytes <= max || dropped >= order.len() {
                break;
            }
            dropped += 1 + (dropped / 64);
            dropped = dropped.min(order.len());
        }
        by_size = dropped;
    }
    (kept, by_age, by_size, bytes)
}

/// The size of the table `data` makes.
fn encoded_len(registry: &Migrations, data: &CacheData) -> u64 {
    cache_format::table::table_bytes(registry.app(), registry.current(), Some(0), data).len() as u64
}

/// What a size and age limit drop, decided from each entry's scope, time and size alone (for
/// a rewrite that streams the table): the same order as [`prune`] (stale scopes first, then
/// the oldest), by an estimate of each entry's share of the table (its bytes and its record
/// in a leaf) on top of `fixed` bytes. Returns the indices of `items` to drop, how many of
/// them went for age, and the estimated size of what is kept.
pub(crate) fn plan_drops(
    items: &[(Fingerprint, u64, u64)],
    fixed: u64,
    retention: &Retention,
) -> (std::collections::HashSet<usize>, usize, u64) {
    let staleness = Staleness::of(items.iter().map(|(s, at, _)| (*s, *at)));
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| (staleness.rank(&items[i].0), items[i].1, i));
    let oldest_kept = oldest_kept(retention.max_age);
    let mut drop = std::collections::HashSet::new();
    let mut total = fixed;
    for &i in &order {
        if oldest_kept.is_some_and(|t| items[i].1 < t) {
            drop.insert(i);
        } else {
            total += items[i].2 + 66;
        }
    }
    let by_age = drop.len();
    if let Some(max) = retention.max_bytes {
        for &i in &order {
            if total <= max {
                break;
            }
            if drop.insert(i) {
                total = total.saturating_sub(items[i].2 + 66);
            }
        }
    }
    (drop, by_age, total)
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

#[cfg(test)]
mod tests {
    use super::*;
    use cache_format::{Candidate, CandidateId, Entry, Fields, Key, Origin, Outcome, Stats, Value};

    fn entry(id: i64, at: u64) -> Entry {
        let mut c = Candidate::new(
            CandidateId::new("tiled", &[("tile", 8)]),
            Outcome::Measured(Stats {
                median_ns: 100.0,
                min_ns: 90.0,
                spread_ns: 2.0,
                samples: 9,
            }),
        );
        c.measured_at = at;
        let key = Key::new(Fields::from([("id".to_owned(), Value::Int(id))]));
        Entry::new(
            key,
            Fingerprint::default(),
            Origin::Imported("t".into()),
            at,
            [c],
        )
    }

    fn scope(driver: i64) -> Scope {
        Scope::new(Fields::from([("driver".to_owned(), Value::Int(driver))]))
    }

    #[test]
    fn a_size_limit_drops_a_stale_scope_before_older_entries_of_a_live_one() {
        const DAY: u64 = 24 * 3600 * 1000;
        let now = now_millis();
        let (old, live) = (scope(550), scope(560));
        let mut data = CacheData::new();
        // The old driver's scope went quiet 60 days ago, with 20 entries.
        for i in 0..20 {
            data.insert(&old, "mm", entry(i, now - 60 * DAY - i as u64));
        }
        // The live scope has one entry older than all of those, and 20 recent ones.
        data.insert(&live, "mm", entry(1000, now - 90 * DAY));
        for i in 0..20 {
            data.insert(&live, "mm", entry(2000 + i, now - i as u64 * 1000));
        }
        let registry = Migrations::new("gc", 1);
        let mut live_only = CacheData::new();
        for (s, ns, e) in data.entries().filter(|(s, ..)| **s == live) {
            live_only.insert(s, ns, e.clone());
        }
        let limit = encoded_len(&registry, &live_only);
        let (kept, by_age, by_size, bytes) = prune(&data, &registry, None, Some(limit));
        assert!(bytes <= limit);
        assert_eq!((by_age, by_size), (0, 20));
        assert_eq!(kept.len(), 21);
        assert!(
            kept.entries().all(|(s, ..)| *s == live),
            "the stale scope went whole"
        );

        // Without a gap of STALE_SCOPE_AFTER, age alone decides: the oldest live entry goes first.
        let mut fresh = CacheData::new();
        for i in 0..20 {
            fresh.insert(&old, "mm", entry(i, now - 60 * DAY - i as u64));
        }
        fresh.insert(&live, "mm", entry(1000, now - 90 * DAY));
        for i in 0..20 {
            fresh.insert(&live, "mm", entry(2000 + i, now - 59 * DAY - i as u64));
        }
        let (kept, _, by_size, _) = prune(&fresh, &registry, None, Some(limit));
        assert!(by_size >= 1);
        let oldest = Key::new(Fields::from([("id".to_owned(), Value::Int(1000))]));
        assert!(kept.get(&live, "mm", &oldest.fingerprint()).is_none());
    }
}
