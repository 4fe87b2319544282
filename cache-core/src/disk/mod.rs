//! The disk tier: a snapshot file plus an append-only journal beside it, read incrementally
//! and written under the cross-process lock.
//!
//! Files, for a cache at `<file>`:
//! - `<file>`: the snapshot (cache-format envelope), replaced atomically on compaction;
//! - `<file>.journal`: records appended since that snapshot, bound to it by generation;
//! - `<file>.lock`: the lock file (see `lock`).
//!
//! Every read goes through [`cache_migrate::upgrade`], so the version gate and migration
//! apply identically to the load at start-up, to the incremental refresh, and to the read
//! that merge-on-save does under the lock. Nothing here touches a file without the lock,
//! except reading; an unusable file is renamed aside (quarantined), never overwritten.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cache_format::{
    CacheData, Fingerprint, FormatError, FormatVersion, Scope, Tail, check_payload,
    read_journal_header, read_snapshot_framing, scan_records,
};
use cache_migrate::{MigrateError, Migrations, Report, upgrade, upgrade_snapshot};

use crate::error::{Cause, StoreError};
use crate::fsio::{self, FileId, read_range, read_with_id};
use crate::lazy::{self, StoredEntry};
use crate::namespace::Namespace;

mod append;
mod options;
mod repair;
mod streamed;
mod write;

pub(crate) use options::{DiskOptions, Paths};

/// Something the disk tier did or found that the user should hear about (once).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Event {
    /// An unusable file was renamed aside.
    Quarantined {
        original: PathBuf,
        moved_to: PathBuf,
        reason: String,
    },
    /// An unusable file was found but not yet moved (the lock was busy).
    Unusable { path: PathBuf, cause: Cause },
    /// Incomplete bytes at the end of the journal were cut off.
    TornTail {
        path: PathBuf,
        offset: u64,
        len: u64,
        kept: Option<PathBuf>,
    },
    /// Journal records with a bad checksum were skipped.
    DamagedRecords {
        path: PathBuf,
        count: usize,
        kept: Option<PathBuf>,
    },
    /// A journal that no longer matches its snapshot was removed (its records were already
    /// in the snapshot, or the snapshot was deleted on purpose).
    StaleJournal { path: PathBuf },
    /// Data was migrated from an older schema.
    Migrated { path: PathBuf, report: Report },
    /// The pre-migration snapshot was kept.
    Backup { path: PathBuf },
}

/// Why the disk tier must not be used at all for this file.
#[derive(Debug, Clone)]
pub(crate) struct Blocked {
    pub(crate) path: PathBuf,
    pub(crate) cause: Cause,
}

impl Blocked {
    /// The error a caller sees: the file and the typed cause.
    pub(crate) fn into_error(self) -> StoreError {
        StoreError::unusable(self.path, self.cause)
    }
}

/// A read or write failure.
#[derive(Debug, Clone)]
pub(crate) enum Failure {
    /// The file belongs to a newer build or another application: leave it alone for good.
    Blocked(Blocked),
    /// Something that may go away (lock busy, disk full, I/O error): retry later.
    Retry(StoreError),
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Retry(e)
    }
}

/// What a read found.
#[derive(Debug, Default)]
pub(crate) struct Incoming {
    /// Entries read (all scopes), at the current versions.
    pub(crate) data: CacheData,
    /// Entries rescued from a quarantined journal: they must be saved again.
    pub(crate) salvaged: CacheData,
    /// Entries of the snapshot checked but not decoded (a read asked for them: see `lazy`),
    /// all of the scope it named, none of them in `data`.
    pub(crate) stored: Vec<(Namespace, Fingerprint, Arc<StoredEntry>)>,
    pub(crate) events: Vec<Event>,
    /// The snapshot must be rewritten (it was migrated, or is unusable and the lock was busy).
    pub(crate) needs_rewrite: bool,
    /// `data` holds a whole snapshot (and its journal) read afresh, because the file is not
    /// the one this process saw last: whatever memory holds that it lacks must be written
    /// again.
    pub(crate) whole: bool,
}

#[derive(Debug, Clone)]
struct SnapState {
    id: FileId,
    generation: u64,
    /// The schema the file had, if it was older than current (it has been migrated in memory).
    migrated_from: Option<u32>,
}

#[derive(Debug, Clone)]
struct JournalState {
    id: FileId,
    format: FormatVersion,
    app: String,
    schema: u32,
    /// Bytes of the header, to detect a journal replaced by another at the same inode.
    header: Vec<u8>,
    /// Bytes read and applied so far (header included); always at a record boundary.
    offset: u64,
}

impl JournalState {
    /// The state of a journal whose header (`head`, its bytes) was just read.
    fn new(
        id: FileId,
        format: FormatVersion,
        header: cache_format::JournalHeader,
        head: &[u8],
    ) -> Self {
        JournalState {
            id,
            format,
            app: header.app,
            schema: header.schema,
            header: head.to_vec(),
            offset: head.len() as u64,
        }
    }
}

/// What this process has read of the files, so a refresh reads only what changed.
#[derive(Debug, Clone, Default)]
struct Cursor {
    snapshot: Option<SnapState>,
    journal: Option<JournalState>,
}

/// The disk tier of one cache file.
#[derive(Debug)]
pub(crate) struct Disk {
    pub(crate) paths: Paths,
    registry: Arc<Migrations>,
    options: DiskOptions,
    cursor: Cursor,
    /// Seconds per byte the last whole read of a snapshot took (read, check, decode): what a
    /// compaction, which reads everything and then writes it, is estimated from.
    read_cost: std::cell::Cell<Option<f64>>,
}

enum SnapRead {
    Missing,
    Loaded {
        id: FileId,
        data: CacheData,
        stored: Vec<(Namespace, Fingerprint, Arc<StoredEntry>)>,
        generation: u64,
        report: Option<Report>,
        schema: u32,
    },
    Unusable(Cause),
}

impl Disk {
    pub(crate) fn new(paths: Paths, registry: Arc<Migrations>, options: DiskOptions) -> Self {
        Disk {
            paths,
            registry,
            options,
            cursor: Cursor::default(),
            read_cost: std::cell::Cell::new(None),
        }
    }

    /// Reads what changed on disk since the last read. With `locked`, the caller holds the
    /// cache lock and this may also repair: quarantine unusable files, cut torn tails,
    /// remove stale journals. Without it, it only reads.
    pub(crate) fn read_updates(&mut self, locked: bool) -> Result<Incoming, Failure> {
        self.read_updates_keeping(locked, None)
    }

    /// [`Disk::read_updates`], leaving the snapshot's entries of `scope` undecoded (in
    /// [`Incoming::stored`]) if it reads the snapshot whole and needs no migration.
    pub(crate) fn read_updates_keeping(
        &mut self,
        locked: bool,
        scope: Option<&Scope>,
    ) -> Result<Incoming, Failure> {
        let mut cursor = std::mem::take(&mut self.cursor);
        let result = self.read_into(&mut cursor, locked, scope);
        self.cursor = cursor;
        result
    }

    /// Forgets what was read, so the next [`Disk::read_updates`] reads everything again.
    pub(crate) fn reset(&mut self) {
        self.cursor = Cursor::default();
    }

    /// Reads everything on disk (all scopes) from scratch, without changing the cursor.
    pub(crate) fn read_all(&self, locked: bool) -> Result<Incoming, Failure> {
        let mut fresh = Cursor::default();
        self.read_into(&mut fresh, locked, None)
    }

    fn read_into(
        &self,
        cursor: &mut Cursor,
        locked: bool,
        keep: Option<&Scope>,
    ) -> Result<Incoming, Failure> {
        let mut inc = Incoming::default();
        let snapshot_meta = fsio::stat(&self.paths.snapshot)?;
        let Some(snapshot_meta) = snapshot_meta else {
            *cursor = Cursor::default();
            // A journal without its snapshot: the snapshot was deleted to reset the cache.
            if locked && fsio::stat(&self.paths.journal)?.is_some() {
                self.remove_journal()?;
                inc.events.push(Event::StaleJournal {
                    path: self.paths.journal.clone(),
                });
            }
            return Ok(inc);
        };
        let unchanged = cursor
            .snapshot
            .as_ref()
            .is_some_and(|s| s.id == FileId::of(&snapshot_meta));
        if !unchanged {
            cursor.journal = None;
            cursor.snapshot = None;
            match self.load_snapshot(keep)? {
                SnapRead::Missing => return Ok(inc),
                SnapRead::Loaded {
                    id,
                    data,
                    stored,
                    generation,
                    report,
                    schema,
                } => {
                    inc.data = data;
                    inc.stored = stored;
                    inc.whole = true;
                    let migrated_from = report.as_ref().map(|_| schema);
                    if let Some(report) = report {
                        inc.needs_rewrite = true;
                        inc.events.push(Event::Migrated {
                            path: self.paths.snapshot.clone(),
                            report,
                        });
                    }
                    cursor.snapshot = Some(SnapState {
                        id,
                        generation,
                        migrated_from,
                    });
                }
                SnapRead::Unusable(cause) => {
                    if locked {
                        self.quarantine_snapshot(&cause.to_string(), &mut inc)?;
                    } else {
                        inc.needs_rewrite = true;
                        inc.events.push(Event::Unusable {
                            path: self.paths.snapshot.clone(),
                            cause,
                        });
                    }
                    return Ok(inc);
                }
            }
        }
        let Some(snap) = cursor.snapshot.as_ref() else {
            return Ok(inc);
        };
        let generation = snap.generation;
        self.read_journal(cursor, generation, locked, &mut inc)?;
        Ok(inc)
    }

    fn load_snapshot(&self, keep: Option<&Scope>) -> Result<SnapRead, Failure> {
        let started = std::time::Instant::now();
        let read = self.load_snapshot_untimed(keep);
        if let Ok(SnapRead::Loaded { id, stored, .. }) = &read
            && id.len >= 64 << 10
        {
            // A compaction's read decodes everything. A read that left entries in the file
            // checked them only, which costs about a third of decoding them (measured at
            // 100k entries: 130 against 400 ms).
            let decoded_share = if stored.is_empty() { 1.0 } else { 3.0 };
            let cost = decoded_share * started.elapsed().as_secs_f64() / id.len as f64;
            self.read_cost.set(Some(cost));
        }
        read
    }

    fn load_snapshot_untimed(&self, keep: Option<&Scope>) -> Result<SnapRead, Failure> {
        let path = &self.paths.snapshot;
        let Some((bytes, id, file)) =
            fsio::read_keeping_file(path, self.options.limits.max_file_bytes)?
        else {
            return Ok(SnapRead::Missing);
        };
        let bytes = match bytes {
            Ok(bytes) => bytes,
            Err(too_large) => return Ok(SnapRead::Unusable(too_large.into())),
        };
        // The framing first; the payload's own checks are made by the one walk of the lazy
        // read, or by `check_payload` before anything decodes it whole.
        let snap = match read_snapshot_framing(&bytes, &self.options.limits) {
            Ok(snap) => snap,
            Err(e @ FormatError::NewerFormat { .. }) => {
                return Err(self.blocked(path, e.into()));
            }
            Err(e) => return Ok(SnapRead::Unusable(e.into())),
        };
        // The entries of the scope asked for stay in the file until used, when the file is
        // at the current versions (otherwise they are migrated, so decoded, here).
        if let Some(scope) = keep
            && snap.format == FormatVersion::CURRENT
            && snap.header.schema == self.registry.current()
            && self
                .registry
                .check(&snap.header.app, snap.header.schema)
                .is_ok()
            && let Some((data, stored)) =
                lazy::index_snapshot(&snap, &bytes, scope, &self.options.limits, || {
                    lazy::Source::new(file, path.clone())
                })
        {
            return Ok(SnapRead::Loaded {
                id,
                data,
                stored,
                generation: snap.header.generation,
                report: None,
                schema: snap.header.schema,
            });
        }
        if let Err(e) = check_payload(snap.payload_bytes(), &self.options.limits) {
            return Ok(SnapRead::Unusable(e.into()));
        }
        match upgrade_snapshot(&self.registry, &snap, &self.options.limits) {
            Ok(up) => Ok(SnapRead::Loaded {
                id,
                data: up.data,
                stored: Vec::new(),
                generation: snap.header.generation,
                report: up.report,
                schema: snap.header.schema,
            }),
            Err(e @ (MigrateError::Foreign { .. } | MigrateError::NewerSchema { .. })) => {
                Err(self.blocked(path, e.into()))
            }
            Err(e) => Ok(SnapRead::Unusable(e.into())),
        }
    }

    fn blocked(&self, path: &Path, cause: Cause) -> Failure {
        Failure::Blocked(Blocked {
            path: path.to_owned(),
            cause,
        })
    }

    fn read_journal_any_base(
        &self,
        cursor: &mut Cursor,
        inc: &mut Incoming,
    ) -> Result<(), Failure> {
        let Some((bytes, id)) =
            read_with_id(&self.paths.journal, self.options.limits.max_file_bytes)?
        else {
            return Ok(());
        };
        let bytes = bytes.map_err(|e| {
            Failure::Retry(StoreError::Format {
                path: self.paths.journal.clone(),
                source: e,
            })
        })?;
        let (format, header, start) =
            read_journal_header(&bytes, &self.options.limits).map_err(|e| {
                Failure::Retry(StoreError::Format {
                    path: self.paths.journal.clone(),
                    source: e,
                })
            })?;
        cursor.journal = Some(JournalState::new(id, format, header, &bytes[..start]));
        self.apply_records(cursor, &bytes[start..], false, inc)
    }

    fn read_journal(
        &self,
        cursor: &mut Cursor,
        generation: u64,
        locked: bool,
        inc: &mut Incoming,
    ) -> Result<(), Failure> {
        let path = &self.paths.journal;
        let Some(meta) = fsio::stat(path)? else {
            cursor.journal = None;
            return Ok(());
        };
        let id = FileId::of(&meta);
        let continuing = cursor
            .journal
            .as_ref()
            .is_some_and(|j| j.id.same_file(&id) && id.len >= j.offset);
        if continuing {
            let j = cursor.journal.as_ref().expect("checked above");
            if id.len == j.offset {
                return Ok(());
            }
            // Read the header again and the new bytes; a different header at the same inode
            // means the journal was replaced: start over.
            let read = read_range(
                path,
                j.header.len() as u64,
                j.offset,
                self.options.limits.max_file_bytes,
            );
            if let Ok((head, tail)) = read
                && head == j.header
            {
                return self.apply_records(cursor, &tail, locked, inc);
            }
        }
        cursor.journal = None;
        let Some((bytes, id)) = read_with_id(path, self.options.limits.max_file_bytes)? else {
            return Ok(());
        };
        let bytes = match bytes {
            Ok(b) => b,
            Err(e) => {
                return self.journal_unusable(e.into(), locked, inc);
            }
        };
        let (format, header, start) = match read_journal_header(&bytes, &self.options.limits) {
            Ok(h) => h,
            Err(e @ FormatError::NewerFormat { .. }) => {
                return Err(self.blocked(path, e.into()));
            }
            Err(e) => return self.journal_unusable(e.into(), locked, inc),
        };
        if header.base != generation {
            // Stale: written against an earlier snapshot that already absorbed it.
            if locked {
                self.remove_journal()?;
                inc.events.push(Event::StaleJournal { path: path.clone() });
            }
            return Ok(());
        }
        match self.registry.check(&header.app, header.schema) {
            Ok(()) => {}
            Err(e @ (MigrateError::Foreign { .. } | MigrateError::NewerSchema { .. })) => {
                return Err(self.blocked(path, e.into()));
            }
            Err(e) => return self.journal_unusable(e.into(), locked, inc),
        }
        cursor.journal = Some(JournalState::new(id, format, header, &bytes[..start]));
        self.apply_records(cursor, &bytes[start..], locked, inc)
    }

    /// Applies the records in `bytes` (which start at the cursor's offset).
    fn apply_records(
        &self,
        cursor: &mut Cursor,
        bytes: &[u8],
        locked: bool,
        inc: &mut Incoming,
    ) -> Result<(), Failure> {
        let j = cursor
            .journal
            .as_mut()
            .expect("journal state is set before records are read");
        let scan = scan_records(bytes, 0, &self.options.limits);
        // Where the damage is (absolute offsets), which names the copy kept of it.
        let mut damage_at: Vec<u64> = scan.damaged.iter().map(|d| j.offset + d.offset).collect();
        for range in &scan.records {
            match upgrade(
                &self.registry,
                j.format,
                &j.app,
                j.schema,
                &bytes[range.clone()],
                &self.options.limits,
            ) {
                Ok(up) => {
                    if up.report.is_some() {
                        inc.needs_rewrite = true;
                    }
                    inc.data.merge(up.data);
                }
                Err(_) => damage_at.push(j.offset + range.start as u64),
            }
        }
        let damaged = damage_at.len();
        let good_end = j.offset + scan.end as u64;
        let path = &self.paths.journal;
        if damaged > 0 {
            let kept = if locked {
                let mut identity = j.header.clone();
                for at in &damage_at {
                    identity.extend_from_slice(&at.to_le_bytes());
                }
                self.keep_copy(path, "damaged", &identity)?
            } else {
                None
            };
            inc.events.push(Event::DamagedRecords {
                path: path.clone(),
                count: damaged,
                kept,
            });
        }
        if let Tail::Torn {
            offset,
            len,
            interrupted,
        } = scan.tail
            && locked
        {
            // Keep a copy unless it looks like what an interrupted append leaves.
            let kept = if interrupted {
                None
            } else {
                let mut identity = j.header.clone();
                identity.extend_from_slice(&(j.offset + offset).to_le_bytes());
                identity.extend_from_slice(&len.to_le_bytes());
                self.keep_copy(path, "torn", &identity)?
            };
            let file = OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(|e| StoreError::io("open", path, e))?;
            file.set_len(good_end)
                .and_then(|()| file.sync_all())
                .map_err(|e| StoreError::io("truncate the torn tail of", path, e))?;
            inc.events.push(Event::TornTail {
                path: path.clone(),
                offset: j.offset + offset,
                len,
                kept,
            });
        }
        j.offset = good_end;
        if let Ok(Some(meta)) = fsio::stat(path) {
            j.id = FileId::of(&meta);
        }
        Ok(())
    }
}
