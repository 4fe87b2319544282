//! Reading the journal: only the bytes appended since the last read, each record through the
//! version gate; damage skipped (and, under the lock, a copy kept), a torn tail cut, a stale
//! journal removed. For a table, the journal's records are also kept merged: lookups read them
//! beside the table's.

use std::fs::OpenOptions;
use std::sync::Arc;

use cache_format::{CacheData, FormatError, Tail, read_journal_header, scan_records};
use cache_migrate::{MigrateError, upgrade};

use super::{Base, Cursor, Disk, Event, Failure, Incoming, JournalState, View};
use crate::error::StoreError;
use crate::fsio::{self, FileId, read_range, read_with_id};

impl Disk {
    /// Reads a journal whatever its base (to rescue the records of one whose snapshot is
    /// unusable).
    pub(super) fn read_journal_any_base(
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

    /// Reads what the journal gained since the cursor's offset (all of it if it is new or
    /// replaced). `base`: what the journal must name to extend the cache file. A journal that
    /// lost what was read of it (see `journal_state.rs`) is noted in the cursor.
    pub(super) fn read_journal(
        &self,
        cursor: &mut Cursor,
        base: u64,
        locked: bool,
        inc: &mut Incoming,
    ) -> Result<(), Failure> {
        let path = &self.paths.journal;
        let Some(meta) = fsio::stat(path)? else {
            if let Some(j) = cursor.journal.take() {
                cursor.note_lost(&j, "it was removed");
                self.journal_restarted(cursor, inc);
            }
            return Ok(());
        };
        let id = FileId::of(&meta);
        let continuing = cursor.journal.as_ref().is_some_and(|j| {
            j.id.same_file(&id)
                && id.len >= j.offset
                && !j.rebased
                && !(locked && j.needs_check(&id))
        });
        if continuing {
            // Read the header again and the new bytes, even when the length is the one read:
            // a journal removed and created anew can get the old one's inode number back and
            // reach that same length, and only its header (a nonce per journal) tells it
            // apart. A different header means the journal was replaced: read it whole.
            let j = cursor.journal.as_ref().expect("checked above");
            let read = read_range(
                path,
                j.header.len() as u64,
                j.offset,
                self.options.limits.max_file_bytes,
            );
            if let Ok((head, tail)) = read
                && head == j.header
            {
                if tail.is_empty() {
                    return Ok(());
                }
                return self.apply_records(cursor, &tail, locked, inc);
            }
        }
        let prior = cursor.journal.take();
        let Some((bytes, id)) = read_with_id(path, self.options.limits.max_file_bytes)? else {
            if let Some(j) = prior {
                cursor.note_lost(&j, "it was removed");
                self.journal_restarted(cursor, inc);
            }
            return Ok(());
        };
        // A file that is not a journal (someone's file at the journal's name) is left alone,
        // as one at the cache's path is: never moved aside.
        let prefix = match &bytes {
            Ok(b) => b[..b.len().min(32)].to_vec(),
            Err(_) => fsio::read_prefix(path, 32)?,
        };
        if !crate::tablefile::begins_as_journal(&prefix) {
            let not_ours = FormatError::NotTunecache {
                what: "journal",
                marker: "tunecache-journal",
            };
            return Err(self.blocked(path, not_ours.into()));
        }
        // The journal read before, still whole under what was appended since: only the new
        // bytes are applied (all of them again under a new table, whose lookups need them),
        // and what this process wrote to it stays noted. Anything else lost what was read.
        let mut carried = None;
        if let Some(mut j) = prior {
            match &bytes {
                Ok(b) if j.is_prefix_of(b) && !j.rebased => {
                    j.id = id;
                    let offset = j.offset as usize;
                    cursor.journal = Some(j);
                    return self.apply_records(cursor, &b[offset..], locked, inc);
                }
                Ok(b) if j.is_prefix_of(b) => carried = Some(j.wrote),
                _ => {
                    let now = bytes.as_deref().ok();
                    cursor.note_lost(&j, j.why_lost(now));
                    // The same journal, damaged or cut: what this process wrote to it and
                    // is still there stays noted (checked again if it is damaged later).
                    if now.is_some_and(|b| b.starts_with(&j.header)) {
                        carried = Some(j.wrote);
                    }
                    self.journal_restarted(cursor, inc);
                }
            }
        }
        let started = match bytes {
            Ok(b) => self.start_journal(cursor, &b, id, base, locked, inc),
            Err(e) => self.journal_unusable(e.into(), locked, inc),
        };
        if let (Some(wrote), Some(j)) = (carried, cursor.journal.as_mut()) {
            j.wrote = wrote;
        }
        started
    }

    /// Reads a journal new to the cursor (`bytes`, all of it) through the gate: a stale one
    /// removed (under the lock), a newer or foreign one left alone, records applied.
    fn start_journal(
        &self,
        cursor: &mut Cursor,
        bytes: &[u8],
        id: FileId,
        base: u64,
        locked: bool,
        inc: &mut Incoming,
    ) -> Result<(), Failure> {
        let path = &self.paths.journal;
        let (format, header, start) = match read_journal_header(bytes, &self.options.limits) {
            Ok(h) => h,
            Err(e @ FormatError::NewerFormat { .. }) => {
                return Err(self.blocked(path, e.into()));
            }
            Err(e) => return self.journal_unusable(e.into(), locked, inc),
        };
        if header.base != base {
            // Stale: written against an earlier snapshot that already absorbed it, or
            // another cache file's.
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

    /// The journal is a new one (or gone): lookups forget the old one's records, which a fold
    /// put into the table.
    fn journal_restarted(&self, cursor: &mut Cursor, inc: &mut Incoming) {
        if cursor.journal_data.is_empty() {
            return;
        }
        cursor.journal_data = super::JournalData::default();
        self.publish_journal(cursor, inc);
    }

    /// Lookups of a table see the journal's records as `cursor` has them now.
    fn publish_journal(&self, cursor: &Cursor, inc: &mut Incoming) {
        let Some(table) = cursor.table() else {
            return;
        };
        match &mut inc.view {
            Some(view) => view.journal = cursor.journal_data.clone(),
            None => {
                inc.view = Some(View {
                    table: Some(Arc::clone(&table.table)),
                    journal: cursor.journal_data.clone(),
                    changed: super::Changed::Keys(Default::default()),
                })
            }
        }
    }

    /// Applies the records in `bytes` (which start at the cursor's offset).
    fn apply_records(
        &self,
        cursor: &mut Cursor,
        bytes: &[u8],
        locked: bool,
        inc: &mut Incoming,
    ) -> Result<(), Failure> {
        let table_based = matches!(&cursor.base, Some(Base::Table(t)) if t.migrated_from.is_none());
        let j = cursor
            .journal
            .as_mut()
            .expect("journal state is set before records are read");
        let scan = scan_records(bytes, 0, &self.options.limits);
        // Where the damage is (absolute offsets), which names the copy kept of it.
        let mut damage_at: Vec<u64> = scan.damaged.iter().map(|d| j.offset + d.offset).collect();
        let mut read = CacheData::new();
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
                    read.merge(up.data);
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
        j.advance(&bytes[..scan.end]);
        if let Ok(Some(meta)) = fsio::stat(path) {
            j.id = FileId::of(&meta);
            if locked {
                // Read under the lock from a journal whose earlier bytes were checked.
                j.checked = Some(j.id);
            }
        }

        if table_based && !read.is_empty() {
            cursor.journal_data = cursor.journal_data.with(read.clone());
            self.publish_journal(cursor, inc);
        }
        inc.data.merge(read);
        Ok(())
    }
}
