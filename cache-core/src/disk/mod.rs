//! The disk tier: a cache file (a table, format 4) plus an append-only journal beside it, read
//! incrementally and written under the cross-process lock.
//!
//! Files, for a cache at `<file>`:
//! - `<file>`: the table (cache-format's `table`): opened by reading its fixed start and one
//!   commit, then read a block at a time as keys are used; written by appending a commit
//!   (a *fold* of the journal), or replaced atomically by a rewrite;
//! - `<file>.journal`: records appended since the last fold, bound to the table's lineage and
//!   kept under a bound in absolute size, so what an open replays does not grow with the cache;
//! - `<file>.lock`: the lock file (see `lock`).
//!
//! A file of an older format (1 to 3: one msgpack snapshot) is read whole, as before, and
//! rewritten as a table by the first writer. Every read goes through the version gate and
//! migration ([`cache_migrate::upgrade`], or the table's header checked against the same
//! registry), identically at start-up, at a refresh, and in the read a save makes under the
//! lock. Nothing here touches a file without the lock, except reading; an unusable file is
//! renamed aside (quarantined), never overwritten.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cache_format::CacheData;
use cache_format::table::TKey;
use cache_migrate::{Migrations, Report};

use crate::error::{Cause, StoreError};
use crate::fsio::{self, FileId};
use crate::tablefile::TableFile;

pub(crate) use journal_data::JournalData;
use journal_state::{JournalState, Lost};

mod append;
#[cfg(test)]
mod between_reads;
mod compact;
mod fold;
mod journal;
mod journal_data;
mod journal_state;
mod legacy;
mod options;
mod repair;
mod streamed;
mod table;
mod table_migration;
mod write;

pub(crate) use compact::Compacted;
pub(crate) use options::{DiskOptions, Paths};
pub(crate) use table::{lookup, read_whole as read_whole_table, scope_keys};

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
    /// Damaged blocks of a table were left behind by a rewrite (their entries are lost); a copy
    /// of the file as it was is kept.
    DamagedTable {
        path: PathBuf,
        problems: usize,
        first: String,
        kept: Option<PathBuf>,
    },
    /// A newer commit a valid slot names does not read back (damage); the file as it was, that
    /// commit's bytes with it, is kept as a copy before this process writes (see
    /// [`Disk::keep_passed_over`]).
    PassedOver {
        path: PathBuf,
        seq: u64,
        read: u64,
        problem: String,
        kept: PathBuf,
    },
    /// A journal that no longer matches its snapshot was removed (its records were already
    /// in the snapshot, or the snapshot was deleted on purpose).
    StaleJournal { path: PathBuf },
    /// A journal lost records this process wrote to it (removed, cut short, replaced, written
    /// back, damaged; not folded into the table): this process writes what it recorded again.
    JournalLost { path: PathBuf, why: &'static str },
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

/// Which keys of the table changed since the previous read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Changed {
    /// These (ascending).
    Keys(BTreeSet<TKey>),
    /// Any of them: the table was replaced, or its history is not at hand. `faithful`: the
    /// new table holds everything the old one did (a rewrite of the same lineage that caught
    /// up with every commit this process saw); otherwise what this process recorded must be
    /// written again.
    All { faithful: bool },
}

/// The file as a reader looks keys up in it: the table (if the cache file is one, at this
/// build's versions), and the current journal's entries merged.
#[derive(Debug, Clone)]
pub(crate) struct View {
    pub(crate) table: Option<Arc<TableFile>>,
    pub(crate) journal: JournalData,
    /// What changed since the view before.
    pub(crate) changed: Changed,
}

/// What a read found.
#[derive(Debug, Default)]
pub(crate) struct Incoming {
    /// Entries read (all scopes), at the current versions: of a file read whole (an older
    /// format, a migration) every entry; of a table, the journal's new records only.
    pub(crate) data: CacheData,
    /// Entries rescued from a quarantined journal: they must be saved again.
    pub(crate) salvaged: CacheData,
    pub(crate) events: Vec<Event>,
    /// The snapshot must be rewritten (it was migrated, is of an older format, or is unusable
    /// and the lock was busy).
    pub(crate) needs_rewrite: bool,
    /// `data` holds a whole file (and its journal) read afresh, because the file is not the
    /// one this process saw last: whatever memory holds that it lacks must be written again.
    pub(crate) whole: bool,
    /// The cache file is not the one this process read before, nor a faithful rewrite of it
    /// (renamed in, written over in place, damaged): what this process recorded may be
    /// missing from it and must be written again.
    pub(crate) replaced: bool,
    /// The file as lookups now see it, when it changed (a table's new commit, a journal's new
    /// records); `None`: no change to what lookups see.
    pub(crate) view: Option<View>,
}

impl Incoming {
    /// Whether `data` is every entry of the file (memory then mirrors the file), rather than
    /// what changed in a table's journal (memory keeps only what it holds).
    pub(crate) fn mirrors(&self) -> bool {
        self.view.as_ref().is_none_or(|v| v.table.is_none())
    }

    /// Takes in what a read right after this one found: one read that saw both.
    fn absorb(&mut self, later: Incoming) {
        if later.whole {
            // A file read afresh: its data is all of it.
            self.data = later.data;
        } else {
            self.data.merge(later.data);
        }
        self.salvaged.merge(later.salvaged);
        self.events.extend(later.events);
        self.needs_rewrite |= later.needs_rewrite;
        self.whole |= later.whole;
        self.replaced |= later.replaced;
        self.view = match (self.view.take(), later.view) {
            (Some(first), Some(mut second)) => {
                second.changed = first.changed.join(std::mem::replace(
                    &mut second.changed,
                    Changed::Keys(BTreeSet::new()),
                ));
                Some(second)
            }
            (first, second) => second.or(first),
        };
    }
}

impl Changed {
    /// What changed over two reads in a row.
    fn join(self, later: Changed) -> Changed {
        match (self, later) {
            (Changed::Keys(mut a), Changed::Keys(b)) => {
                a.extend(b);
                Changed::Keys(a)
            }
            (Changed::All { faithful: a }, Changed::All { faithful: b }) => {
                Changed::All { faithful: a && b }
            }
            (Changed::All { faithful }, Changed::Keys(_))
            | (Changed::Keys(_), Changed::All { faithful }) => Changed::All { faithful },
        }
    }
}

/// Whether a read without the lock reads again: the file moved while it was read (see
/// [`Disk::read_updates`]), and it has not tried too often already (a writer that folds
/// without pause cannot hold a reader for ever; past the bound it keeps what it read).
fn read_again(locked: bool, tries: usize, moved: bool) -> bool {
    const TRIES: usize = 16;
    !locked && moved && tries < TRIES
}

/// A format 1 to 3 snapshot, read whole.
#[derive(Debug, Clone)]
struct SnapState {
    id: FileId,
    generation: u64,
    /// The schema the file had, if it was older than current (it has been migrated in memory).
    migrated_from: Option<u32>,
}

/// A table.
#[derive(Debug, Clone)]
struct TableState {
    id: FileId,
    table: Arc<TableFile>,
    /// The schema the table had, if older than current: it was read whole and migrated in
    /// memory, and is rewritten at the next save.
    migrated_from: Option<u32>,
}

/// The cache file as last read.
#[derive(Debug, Clone)]
enum Base {
    Legacy(SnapState),
    Table(TableState),
}

impl Base {
    /// What a journal must name as its base to extend this file.
    fn journal_base(&self) -> u64 {
        match self {
            Base::Legacy(s) => s.generation,
            Base::Table(t) => t.table.lineage(),
        }
    }

    fn migrated_from(&self) -> Option<u32> {
        match self {
            Base::Legacy(s) => s.migrated_from,
            Base::Table(t) => t.migrated_from,
        }
    }
}

/// What this process has read of the files, so a refresh reads only what changed.
#[derive(Debug, Clone, Default)]
struct Cursor {
    base: Option<Base>,
    journal: Option<JournalState>,
    /// The current journal's records merged (a table's journal only: lookups read it).
    journal_data: JournalData,
    /// What this process wrote to journals that went during the read under way.
    lost: Lost,
    /// The nonce of the journal this process last folded, and the table as the fold left it:
    /// a rewrite of that very table that drops entries says so (`Dropped::journal`).
    folded: Option<(u64, FileId)>,
}

impl Cursor {
    fn table(&self) -> Option<&TableState> {
        match &self.base {
            Some(Base::Table(t)) if t.migrated_from.is_none() => Some(t),
            _ => None,
        }
    }
}

/// The disk tier of one cache file.
#[derive(Debug)]
pub(crate) struct Disk {
    pub(crate) paths: Paths,
    registry: Arc<Migrations>,
    options: DiskOptions,
    cursor: Cursor,
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
    ///
    /// Without the lock, the cache file and the journal are read one after the other while a
    /// writer may fold between the two reads (the journal's records go into a new commit, then
    /// the journal goes): a reader that read the older commit and then no journal would miss
    /// acknowledged results. So the read is checked the way a sequence lock is: after the
    /// journal, the file's current commit must still be the one read; if a writer moved it,
    /// what changed is read again (the new commit's keys, the new journal), up to a bound.
    /// A fold writes its commit before it removes the journal, so a commit still current
    /// after the journal was read means no record the journal held was lost.
    pub(crate) fn read_updates(&mut self, locked: bool) -> Result<Incoming, Failure> {
        let mut cursor = std::mem::take(&mut self.cursor);
        let mut result = self.read_into(&mut cursor, locked);
        let mut tries = 0;
        while let Ok(inc) = &mut result {
            if !read_again(locked, tries, self.moved_since(&cursor)) {
                break;
            }
            tries += 1;
            match self.read_into(&mut cursor, locked) {
                Ok(later) => inc.absorb(later),
                Err(e) => result = Err(e),
            }
        }
        if let Ok(inc) = &mut result
            && let Some(why) = cursor.take_lost()
        {
            // What this process wrote to the journal may be gone: it is written again.
            inc.replaced = true;
            inc.events.push(Event::JournalLost {
                path: self.paths.journal.clone(),
                why,
            });
        }
        self.cursor = cursor;
        result
    }

    /// Whether the cache file is no longer what `cursor` read: another commit is current, the
    /// file was replaced, removed or created.
    fn moved_since(&self, cursor: &Cursor) -> bool {
        let Ok(meta) = fsio::stat(&self.paths.snapshot) else {
            return true;
        };
        let Some(meta) = meta else {
            return cursor.base.is_some();
        };
        let id = FileId::of(&meta);
        match &cursor.base {
            None => true,
            Some(Base::Legacy(s)) => s.id != id,
            Some(Base::Table(t)) => {
                if !t.id.same_file(&id) {
                    return true;
                }
                // The slots and commit as they are now: a few hundred bytes.
                match tablefile::open(Arc::clone(t.table.source().file()), &self.options.limits) {
                    Ok(now) => now.slot() != t.table.slot() || now.lineage() != t.table.lineage(),
                    Err(_) => true,
                }
            }
        }
    }

    /// Forgets what was read, so the next [`Disk::read_updates`] reads everything again.
    pub(crate) fn reset(&mut self) {
        self.cursor = Cursor::default();
    }

    /// The table as last read, if the cache file is one at this build's versions.
    pub(crate) fn table(&self) -> Option<Arc<TableFile>> {
        self.cursor.table().map(|t| Arc::clone(&t.table))
    }

    /// The file as lookups should read it now (after a write: the table's new commit, the
    /// journal's records), with `changed` as what changed for memory.
    pub(crate) fn view(&self, changed: Changed) -> View {
        View {
            table: self.table(),
            journal: self.cursor.journal_data.clone(),
            changed,
        }
    }

    /// Whether a snapshot was there at the last read.
    pub(crate) fn has_snapshot(&self) -> bool {
        self.cursor.base.is_some()
    }

    fn read_into(&self, cursor: &mut Cursor, locked: bool) -> Result<Incoming, Failure> {
        let mut inc = Incoming::default();
        let Some(meta) = fsio::stat(&self.paths.snapshot)? else {
            let had_table = cursor.table().is_some();
            *cursor = Cursor::default();
            if had_table {
                // Deleted on purpose (a reset): lookups stop reading it; nothing is written
                // back but what is recorded from now on.
                inc.view = Some(View {
                    table: None,
                    journal: JournalData::default(),
                    changed: Changed::All { faithful: true },
                });
            }
            // A journal without its snapshot: the snapshot was deleted to reset the cache.
            if locked && fsio::stat(&self.paths.journal)?.is_some() {
                self.remove_journal()?;
                inc.events.push(Event::StaleJournal {
                    path: self.paths.journal.clone(),
                });
            }
            return Ok(inc);
        };
        let id = FileId::of(&meta);
        let unchanged = match &cursor.base {
            Some(Base::Table(t)) => t.id.same_file(&id),
            Some(Base::Legacy(s)) => s.id == id,
            None => false,
        };
        // The same inode, and still a later commit of the table read: what changed. Anything
        // else (a new file, or bytes written over this one) is read afresh through the gate.
        let refreshed = unchanged
            && match &cursor.base {
                Some(Base::Table(_)) => self.refresh_table(cursor, id, &mut inc)?,
                _ => true,
            };
        if !refreshed && !self.load_base(cursor, locked, &mut inc)? {
            return Ok(inc);
        }
        if locked && let Some(t) = cursor.table() {
            self.keep_passed_over(&t.table, &mut inc)?;
        }
        let Some(base) = cursor.base.as_ref() else {
            return Ok(inc);
        };
        let journal_base = base.journal_base();
        #[cfg(test)]
        between_reads::run();
        self.read_journal(cursor, journal_base, locked, &mut inc)?;
        Ok(inc)
    }

    /// Reads the cache file afresh (it is new to this cursor, or replaced). `false`: there is
    /// nothing to read further (gone, or unusable).
    fn load_base(
        &self,
        cursor: &mut Cursor,
        locked: bool,
        inc: &mut Incoming,
    ) -> Result<bool, Failure> {
        let before = cursor.base.take();
        // The journal goes on applying to a rewrite of the same lineage (a compaction): it is
        // read whole again, keeping what this process wrote to it (see `journal_state.rs`).
        let journal = cursor.journal.take().map(|mut j| {
            j.rebased = true;
            j
        });
        cursor.journal_data = JournalData::default();
        // Another file than the one read before: unless it proves to be a faithful rewrite of
        // it (below), this process's results may be missing from it.
        inc.replaced |= before.is_some();
        let Some(file) = fsio::open_regular(&self.paths.snapshot)? else {
            return Ok(false);
        };
        // A file that is not tunecache's (a user's file given as the cache's path, a bundle) is
        // left alone, as a newer or another application's one is: never moved aside.
        let ours = tablefile::begins_as_cache(&file)
            .map_err(|e| StoreError::io("read", &self.paths.snapshot, e))?;
        if !ours {
            let not_ours = cache_format::FormatError::NotTunecache {
                what: "file",
                marker: "tunecache",
            };
            return Err(self.blocked(&self.paths.snapshot, not_ours.into()));
        }
        let is_table = tablefile::starts_as_table(&file)
            .map_err(|e| StoreError::io("read", &self.paths.snapshot, e))?;
        let loaded = if is_table {
            self.load_table(file, before.as_ref(), inc)?
        } else {
            drop(file);
            self.load_legacy(inc)?
        };
        match loaded {
            Loaded::Base(base) => {
                cursor.base = Some(base);
                cursor.journal = journal;
                Ok(true)
            }
            Loaded::Missing => Ok(false),
            Loaded::Unusable(cause) => {
                if locked {
                    self.quarantine_snapshot(&cause.to_string(), inc)?;
                } else {
                    inc.needs_rewrite = true;
                    inc.events.push(Event::Unusable {
                        path: self.paths.snapshot.clone(),
                        cause,
                    });
                }
                Ok(false)
            }
        }
    }

    fn blocked(&self, path: &Path, cause: Cause) -> Failure {
        Failure::Blocked(Blocked {
            path: path.to_owned(),
            cause,
        })
    }
}

/// What reading the cache file gave.
enum Loaded {
    Base(Base),
    Missing,
    Unusable(Cause),
}

use crate::tablefile;
