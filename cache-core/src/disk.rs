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

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cache_format::{
    CacheData, FormatError, FormatVersion, Limits, Tail, encode_journal_header, encode_record,
    encode_snapshot, peek_header, read_journal_header, read_snapshot, scan_records,
};
use cache_migrate::{MigrateError, Migrations, Report, upgrade};

use crate::error::StoreError;
use crate::fsio::{self, FileId};

/// The files of one cache.
#[derive(Debug, Clone)]
pub(crate) struct Paths {
    pub(crate) snapshot: PathBuf,
    pub(crate) journal: PathBuf,
    pub(crate) lock: PathBuf,
    pub(crate) dir: PathBuf,
}

impl Paths {
    pub(crate) fn new(snapshot: PathBuf) -> Self {
        Paths {
            journal: fsio::with_suffix(&snapshot, ".journal"),
            lock: fsio::with_suffix(&snapshot, ".lock"),
            dir: fsio::parent_dir(&snapshot),
            snapshot,
        }
    }
}

/// Tuning of the disk tier.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DiskOptions {
    pub(crate) limits: Limits,
    /// Compact when the journal would exceed this fraction of the snapshot's size...
    pub(crate) compact_ratio: f64,
    /// ...and this many bytes.
    pub(crate) compact_min_bytes: u64,
    /// Keep the pre-migration files when a migrated snapshot is rewritten.
    pub(crate) backup_on_migrate: bool,
}

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
    Unusable { path: PathBuf, reason: String },
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
    pub(crate) reason: String,
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
    pub(crate) events: Vec<Event>,
    /// The snapshot must be rewritten (it was migrated, or is unusable and the lock was busy).
    pub(crate) needs_rewrite: bool,
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
}

enum SnapRead {
    Missing,
    Loaded {
        id: FileId,
        data: CacheData,
        generation: u64,
        report: Option<Report>,
        schema: u32,
    },
    Unusable(String),
}

impl Disk {
    pub(crate) fn new(paths: Paths, registry: Arc<Migrations>, options: DiskOptions) -> Self {
        Disk {
            paths,
            registry,
            options,
            cursor: Cursor::default(),
        }
    }

    /// Reads what changed on disk since the last read. With `locked`, the caller holds the
    /// cache lock and this may also repair: quarantine unusable files, cut torn tails,
    /// remove stale journals. Without it, it only reads.
    pub(crate) fn read_updates(&mut self, locked: bool) -> Result<Incoming, Failure> {
        let mut cursor = std::mem::take(&mut self.cursor);
        let result = self.read_into(&mut cursor, locked);
        self.cursor = cursor;
        result
    }

    /// Reads everything on disk (all scopes) from scratch, without changing the cursor.
    pub(crate) fn read_all(&self, locked: bool) -> Result<Incoming, Failure> {
        let mut fresh = Cursor::default();
        self.read_into(&mut fresh, locked)
    }

    fn read_into(&self, cursor: &mut Cursor, locked: bool) -> Result<Incoming, Failure> {
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
            match self.load_snapshot()? {
                SnapRead::Missing => return Ok(inc),
                SnapRead::Loaded {
                    id,
                    data,
                    generation,
                    report,
                    schema,
                } => {
                    inc.data = data;
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
                SnapRead::Unusable(reason) => {
                    if locked {
                        self.quarantine_snapshot(&reason, &mut inc)?;
                    } else {
                        inc.needs_rewrite = true;
                        inc.events.push(Event::Unusable {
                            path: self.paths.snapshot.clone(),
                            reason,
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

    fn load_snapshot(&self) -> Result<SnapRead, Failure> {
        let path = &self.paths.snapshot;
        let Some((bytes, id)) = read_with_id(path, self.options.limits.max_file_bytes)? else {
            return Ok(SnapRead::Missing);
        };
        let bytes = match bytes {
            Ok(bytes) => bytes,
            Err(too_large) => return Ok(SnapRead::Unusable(too_large.to_string())),
        };
        let snap = match read_snapshot(&bytes, &self.options.limits) {
            Ok(snap) => snap,
            Err(e @ FormatError::NewerFormat { .. }) => {
                return Err(self.blocked(path, e.to_string()));
            }
            Err(e) => return Ok(SnapRead::Unusable(e.to_string())),
        };
        match upgrade(
            &self.registry,
            snap.format,
            &snap.header.app,
            snap.header.schema,
            snap.payload_bytes(),
            &self.options.limits,
        ) {
            Ok(up) => Ok(SnapRead::Loaded {
                id,
                data: up.data,
                generation: snap.header.generation,
                report: up.report,
                schema: snap.header.schema,
            }),
            Err(e @ (MigrateError::Foreign { .. } | MigrateError::NewerSchema { .. })) => {
                Err(self.blocked(path, e.to_string()))
            }
            Err(e) => Ok(SnapRead::Unusable(e.to_string())),
        }
    }

    fn blocked(&self, path: &Path, reason: String) -> Failure {
        Failure::Blocked(Blocked {
            path: path.to_owned(),
            reason,
        })
    }

    /// Moves an unusable snapshot aside, rescuing the valid records of its journal.
    fn quarantine_snapshot(&self, reason: &str, inc: &mut Incoming) -> Result<(), Failure> {
        let stamp = cache_format::now_millis();
        let moved_to = fsio::with_suffix(&self.paths.snapshot, &format!(".unusable-{stamp}"));
        fs::rename(&self.paths.snapshot, &moved_to)
            .map_err(|e| StoreError::io("move aside", &self.paths.snapshot, e))?;
        inc.events.push(Event::Quarantined {
            original: self.paths.snapshot.clone(),
            moved_to,
            reason: reason.to_owned(),
        });
        if fsio::stat(&self.paths.journal)?.is_some() {
            // Its records are individually checksummed and gated: keep the good ones.
            let mut scratch = Cursor::default();
            let mut rescued = Incoming::default();
            if self
                .read_journal_any_base(&mut scratch, &mut rescued)
                .is_ok()
            {
                inc.salvaged.merge(rescued.data);
            }
            let journal_to = fsio::with_suffix(&self.paths.journal, &format!(".unusable-{stamp}"));
            fs::rename(&self.paths.journal, &journal_to)
                .map_err(|e| StoreError::io("move aside", &self.paths.journal, e))?;
            inc.events.push(Event::Quarantined {
                original: self.paths.journal.clone(),
                moved_to: journal_to,
                reason: "its snapshot was unusable; its valid records were kept".to_owned(),
            });
        }
        fsio::sync_dir(&self.paths.dir)?;
        Ok(())
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
                return self.journal_unusable(e.to_string(), locked, inc);
            }
        };
        let (format, header, start) = match read_journal_header(&bytes, &self.options.limits) {
            Ok(h) => h,
            Err(e @ FormatError::NewerFormat { .. }) => {
                return Err(self.blocked(path, e.to_string()));
            }
            Err(e) => return self.journal_unusable(e.to_string(), locked, inc),
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
                return Err(self.blocked(path, e.to_string()));
            }
            Err(e) => return self.journal_unusable(e.to_string(), locked, inc),
        }
        cursor.journal = Some(JournalState::new(id, format, header, &bytes[..start]));
        self.apply_records(cursor, &bytes[start..], locked, inc)
    }

    fn journal_unusable(
        &self,
        reason: String,
        locked: bool,
        inc: &mut Incoming,
    ) -> Result<(), Failure> {
        if locked {
            let moved_to = fsio::with_suffix(
                &self.paths.journal,
                &format!(".unusable-{}", cache_format::now_millis()),
            );
            fs::rename(&self.paths.journal, &moved_to)
                .map_err(|e| StoreError::io("move aside", &self.paths.journal, e))?;
            fsio::sync_dir(&self.paths.dir)?;
            inc.events.push(Event::Quarantined {
                original: self.paths.journal.clone(),
                moved_to,
                reason,
            });
        } else {
            inc.events.push(Event::Unusable {
                path: self.paths.journal.clone(),
                reason,
            });
        }
        Ok(())
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
        let mut damaged = scan.damaged.len();
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
                Err(_) => damaged += 1,
            }
        }
        let good_end = j.offset + scan.end as u64;
        let path = &self.paths.journal;
        if damaged > 0 {
            let kept = if locked {
                self.keep_copy(path, "damaged")?
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
                self.keep_copy(path, "torn")?
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

    fn keep_copy(&self, path: &Path, tag: &str) -> Result<Option<PathBuf>, StoreError> {
        let to = fsio::with_suffix(path, &format!(".{tag}-{}", cache_format::now_millis()));
        fs::copy(path, &to).map_err(|e| StoreError::io("copy aside", path, e))?;
        Ok(Some(to))
    }

    fn remove_journal(&self) -> Result<(), StoreError> {
        match fs::remove_file(&self.paths.journal) {
            Ok(()) => fsio::sync_dir(&self.paths.dir),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StoreError::io("remove", &self.paths.journal, e)),
        }
    }

    /// Writes `batch` (under the lock, right after `read_updates(true)`): appends one journal
    /// record, or compacts everything into a new snapshot when there is no snapshot yet, when
    /// `rewrite` is set, or when the journal has grown past its share of the snapshot.
    pub(crate) fn write(
        &mut self,
        batch: &CacheData,
        rewrite: bool,
    ) -> Result<Vec<Event>, Failure> {
        if batch.is_empty() && !rewrite {
            return Ok(Vec::new());
        }
        let record = if batch.is_empty() {
            Vec::new()
        } else {
            encode_record(batch)
        };
        let snapshot_len = self.cursor.snapshot.as_ref().map(|s| s.id.len);
        let journal_len = fsio::stat(&self.paths.journal)?.map_or(0, |m| m.len());
        let budget = snapshot_len.map_or(0, |len| {
            self.options
                .compact_min_bytes
                .max((len as f64 * self.options.compact_ratio) as u64)
        });
        let wants_compaction =
            snapshot_len.is_none() || rewrite || journal_len + record.len() as u64 > budget;
        if wants_compaction {
            let estimate = snapshot_len.unwrap_or(0) + journal_len + record.len() as u64;
            match fs4::available_space(&self.paths.dir) {
                // Not enough room for a new snapshot beside the old one: keep appending.
                Ok(free) if free < estimate + (1 << 20) && snapshot_len.is_some() && !rewrite => {}
                _ => return self.compact(batch),
            }
        }
        self.append(&record)?;
        Ok(Vec::new())
    }

    fn compact(&mut self, batch: &CacheData) -> Result<Vec<Event>, Failure> {
        let all = self.read_all(true)?;
        let mut data = all.data;
        data.merge(all.salvaged);
        data.merge(batch.clone());
        self.write_snapshot(&data, all.events)
    }

    /// Replaces the snapshot with `data` and removes the journal (under the lock). `data`
    /// must be everything on disk (as a read from a fresh cursor returns) plus what is new.
    pub(crate) fn write_snapshot(
        &mut self,
        data: &CacheData,
        mut events: Vec<Event>,
    ) -> Result<Vec<Event>, Failure> {
        fsio::remove_stale_temporaries(&self.paths.snapshot);
        fsio::remove_stale_temporaries(&self.paths.journal);
        let migrated = self
            .cursor
            .snapshot
            .as_ref()
            .is_some_and(|s| s.migrated_from.is_some());
        if migrated && self.options.backup_on_migrate {
            events.extend(self.back_up()?);
        }
        let bytes = encode_snapshot(self.registry.app(), self.registry.current(), data);
        fsio::atomic_write(&self.paths.snapshot, &bytes)?;
        self.remove_journal()?;
        let (_, header) = peek_header(&bytes, &self.options.limits)
            .expect("a snapshot this build just encoded has a valid header");
        let id = fsio::stat(&self.paths.snapshot)?
            .map(|m| FileId::of(&m))
            .ok_or_else(|| {
                StoreError::io(
                    "find the snapshot just written at",
                    &self.paths.snapshot,
                    std::io::ErrorKind::NotFound.into(),
                )
            })?;
        self.cursor = Cursor {
            snapshot: Some(SnapState {
                id,
                generation: header.generation,
                migrated_from: None,
            }),
            journal: None,
        };
        Ok(events)
    }

    /// Keeps the current snapshot (and journal) as `<file>.bak.<ms>` (`<file>.journal.bak.<ms>`):
    /// a hard link where the file system allows, a copy otherwise.
    fn back_up(&self) -> Result<Vec<Event>, StoreError> {
        let stamp = cache_format::now_millis();
        let mut events = Vec::new();
        for original in [&self.paths.snapshot, &self.paths.journal] {
            if fsio::stat(original)?.is_none() {
                continue;
            }
            let backup = fsio::with_suffix(original, &format!(".bak.{stamp}"));
            if fs::hard_link(original, &backup).is_err() {
                fs::copy(original, &backup).map_err(|e| StoreError::io("back up", original, e))?;
            }
            events.push(Event::Backup { path: backup });
        }
        Ok(events)
    }

    fn append(&mut self, record: &[u8]) -> Result<(), Failure> {
        let path = self.paths.journal.clone();
        let snap = self
            .cursor
            .snapshot
            .as_ref()
            .expect("append happens only when a snapshot exists");
        if self.cursor.journal.is_none() {
            // No journal for this snapshot yet (or a stale one was removed): start one.
            let header = cache_format::JournalHeader {
                app: self.registry.app().to_owned(),
                schema: self.registry.current(),
                base: snap.generation,
            };
            let bytes = encode_journal_header(&header);
            fsio::atomic_write(&path, &bytes)?;
            let id = FileId::of(&fsio::stat(&path)?.ok_or_else(|| {
                StoreError::io("find", &path, std::io::ErrorKind::NotFound.into())
            })?);
            self.cursor.journal = Some(JournalState::new(
                id,
                FormatVersion::CURRENT,
                header,
                &bytes,
            ));
        }
        let j = self.cursor.journal.as_mut().expect("just ensured");
        if j.schema != self.registry.current() || j.app != self.registry.app() {
            // An older journal is still bound to this snapshot; it is rewritten at the next
            // compaction. Appending current-schema records to it would mislabel them.
            return Err(Failure::Retry(StoreError::io(
                "append to",
                &path,
                std::io::Error::other("the journal has an older schema; compaction pending"),
            )));
        }
        let mut file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| StoreError::io("open", &path, e))?;
        let before = j.offset;
        let written = file.write_all(record).and_then(|()| file.sync_data());
        if let Err(e) = written {
            // Leave no partial record behind (we hold the lock, nobody else appends).
            let _ = file.set_len(before).and_then(|()| file.sync_all());
            return Err(Failure::Retry(StoreError::io("append to", &path, e)));
        }
        j.offset = before + record.len() as u64;
        if let Ok(Some(meta)) = fsio::stat(&path) {
            j.id = FileId::of(&meta);
        }
        Ok(())
    }
}

/// Reads a whole file with the identity of the version read. The inner error is a file over
/// the size limit (which makes it unusable rather than the read failing).
#[allow(
    clippy::type_complexity,
    reason = "a local triple of outcomes, named at the call sites"
)]
fn read_with_id(
    path: &Path,
    limit: u64,
) -> Result<Option<(Result<Vec<u8>, FormatError>, FileId)>, StoreError> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StoreError::io("open", path, e)),
    };
    let meta = file
        .metadata()
        .map_err(|e| StoreError::io("inspect", path, e))?;
    let id = FileId::of(&meta);
    if meta.len() > limit {
        return Ok(Some((
            Err(FormatError::TooLarge {
                what: "file",
                len: meta.len(),
                limit,
            }),
            id,
        )));
    }
    let mut buf = Vec::with_capacity(meta.len() as usize);
    (&mut file)
        .take(limit)
        .read_to_end(&mut buf)
        .map_err(|e| StoreError::io("read", path, e))?;
    Ok(Some((Ok(buf), id)))
}

/// Reads the first `head` bytes and the bytes from `from` to the end.
fn read_range(
    path: &Path,
    head: u64,
    from: u64,
    limit: u64,
) -> Result<(Vec<u8>, Vec<u8>), StoreError> {
    let mut file = File::open(path).map_err(|e| StoreError::io("open", path, e))?;
    let mut first = vec![0u8; head as usize];
    file.read_exact(&mut first)
        .map_err(|e| StoreError::io("read", path, e))?;
    file.seek(SeekFrom::Start(from))
        .map_err(|e| StoreError::io("read", path, e))?;
    let mut rest = Vec::new();
    file.take(limit)
        .read_to_end(&mut rest)
        .map_err(|e| StoreError::io("read", path, e))?;
    Ok((first, rest))
}
