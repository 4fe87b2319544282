//! The write half of the disk tier, always under the cache lock: append one journal record,
//! or compact everything into a new snapshot (written to a temporary file, synced, renamed,
//! the directory synced), keeping a backup of a migrated file when asked.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::time::Instant;

use cache_format::{
    CacheData, FormatError, FormatVersion, check_payload, encode_journal_header, encode_record,
    encode_snapshot, read_snapshot, scan_records,
};

use super::{Cursor, Disk, Event, Failure, Incoming, JournalState, SnapState};
use crate::error::StoreError;
use crate::fsio::{self, FileId};

impl Disk {
    /// Writes `batch` (under the lock, right after `read_updates(true)`): appends one journal
    /// record, or compacts everything into a new snapshot when there is no snapshot yet, when
    /// `rewrite` is set, or when the journal has grown past its share of the snapshot.
    pub(crate) fn write(
        &mut self,
        batch: &CacheData,
        rewrite: bool,
    ) -> Result<Vec<Event>, Failure> {
        self.write_inner(batch, rewrite, None)
    }

    /// [`Disk::write`] for a caller that has just read everything (`known`: a read from a
    /// fresh cursor under the lock): a compaction uses it instead of reading again.
    pub(crate) fn write_knowing(
        &mut self,
        batch: &CacheData,
        rewrite: bool,
        known: Incoming,
    ) -> Result<Vec<Event>, Failure> {
        self.write_inner(batch, rewrite, Some(known))
    }

    fn write_inner(
        &mut self,
        batch: &CacheData,
        rewrite: bool,
        mut known: Option<Incoming>,
    ) -> Result<Vec<Event>, Failure> {
        if batch.is_empty() && !rewrite {
            return Ok(Vec::new());
        }
        let snapshot_len = self.cursor.snapshot.as_ref().map(|s| s.id.len);
        // A required compaction never appends: the record is not encoded for nothing.
        let record = if batch.is_empty() || snapshot_len.is_none() || rewrite {
            Vec::new()
        } else {
            self.checked_record(batch)?
        };
        let journal_len = fsio::stat(&self.paths.journal)?.map_or(0, |m| m.len());
        let budget = snapshot_len.map_or(0, |len| {
            self.options
                .compact_min_bytes
                .max((len as f64 * self.options.compact_ratio) as u64)
        });
        let wants_compaction =
            snapshot_len.is_none() || rewrite || journal_len + record.len() as u64 > budget;
        if wants_compaction {
            let required = snapshot_len.is_none() || rewrite;
            let estimate = snapshot_len.unwrap_or(0) + journal_len + record.len() as u64;
            match fs4::available_space(&self.paths.dir) {
                // Not enough room for a new snapshot beside the old one: keep appending.
                Ok(free) if free < estimate + (1 << 20) && !required => {}
                _ => {
                    let deadline = match self.options.compaction_budget {
                        Some(budget) if !required => Instant::now().checked_add(budget),
                        _ => None,
                    };
                    // A compaction reads everything, then encodes, checks and writes it:
                    // about three reads. One that cannot fit the budget is not started.
                    let bytes = estimate as f64;
                    let hopeless = match (self.options.compaction_budget, self.read_cost.get()) {
                        (Some(budget), Some(cost)) if !required => {
                            3.0 * cost * bytes > budget.as_secs_f64()
                        }
                        _ => false,
                    };
                    if !hopeless
                        && let Some(events) = self.compact(batch, deadline, known.take())?
                    {
                        return Ok(events);
                    }
                    tracing::info!(
                        "tunecache: the compaction of {} would not finish within its budget; appended instead (a writer with more time compacts)",
                        self.paths.snapshot.display()
                    );
                }
            }
        }
        self.append(&record)?;
        Ok(Vec::new())
    }

    /// `batch` encoded as one journal record, checked as a reader would check it: what is
    /// appended must be readable (see `write_snapshot`).
    pub(super) fn checked_record(&self, batch: &CacheData) -> Result<Vec<u8>, StoreError> {
        let record = encode_record(batch);
        let limits = &self.options.limits;
        let scan = scan_records(&record, 0, limits);
        let checked = match (scan.records.first(), scan.damaged.first()) {
            (Some(payload), _) => check_payload(&record[payload.clone()], limits),
            (None, Some(damage)) => Err(damage.error.clone()),
            (None, None) => Err(FormatError::Invalid {
                what: "journal record",
                detail: "this build encoded a record it cannot read back".into(),
            }),
        };
        checked.map_err(|source| StoreError::Format {
            path: self.paths.journal.clone(),
            source,
        })?;
        Ok(record)
    }

    /// Compacts; `None` if `deadline` passed first (then nothing was written).
    fn compact(
        &mut self,
        batch: &CacheData,
        deadline: Option<Instant>,
        known: Option<Incoming>,
    ) -> Result<Option<Vec<Event>>, Failure> {
        let all = match known {
            Some(all) => all,
            None => self.read_all(true)?,
        };
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
        let mut data = all.data;
        data.merge(all.salvaged);
        data.merge(batch.clone());
        let retention = self.options.retention;
        if retention != crate::gc::Retention::default() {
            let (kept, by_age, by_size, _) = crate::gc::prune(
                &data,
                &self.registry,
                retention.max_age,
                retention.max_bytes,
            );
            if by_age + by_size > 0 {
                tracing::info!(
                    "tunecache: compacting {} dropped {by_age} entries for their age and {by_size} to keep it under its size limit",
                    self.paths.snapshot.display()
                );
            }
            data = kept;
        }
        self.write_snapshot_by(&data, all.events, deadline)
    }

    /// Replaces the snapshot with `data` and removes the journal (under the lock). `data`
    /// must be everything on disk (as a read from a fresh cursor returns) plus what is new.
    pub(crate) fn write_snapshot(
        &mut self,
        data: &CacheData,
        events: Vec<Event>,
    ) -> Result<Vec<Event>, Failure> {
        let written = self.write_snapshot_by(data, events, None)?;
        Ok(written.expect("without a deadline the snapshot is written or fails"))
    }

    /// [`Disk::write_snapshot`], given up (`None`, nothing written) if `deadline` passes
    /// before the new bytes are ready.
    fn write_snapshot_by(
        &mut self,
        data: &CacheData,
        events: Vec<Event>,
        deadline: Option<Instant>,
    ) -> Result<Option<Vec<Event>>, Failure> {
        let bytes = encode_snapshot(self.registry.app(), self.registry.current(), data);
        self.write_encoded_by(bytes, events, deadline)
    }

    /// [`Disk::write_snapshot`] of a snapshot already encoded (at the registry's application
    /// and current schema), e.g. by a [`cache_format::SnapshotBuilder`].
    pub(crate) fn write_encoded_snapshot(
        &mut self,
        bytes: Vec<u8>,
        events: Vec<Event>,
    ) -> Result<Vec<Event>, Failure> {
        let written = self.write_encoded_by(bytes, events, None)?;
        Ok(written.expect("without a deadline the snapshot is written or fails"))
    }

    fn write_encoded_by(
        &mut self,
        bytes: Vec<u8>,
        mut events: Vec<Event>,
        deadline: Option<Instant>,
    ) -> Result<Option<Vec<Event>>, Failure> {
        let late = || deadline.is_some_and(|d| Instant::now() >= d);
        fsio::remove_stale_temporaries(&self.paths.snapshot);
        fsio::remove_stale_temporaries(&self.paths.journal);
        let migrated = self
            .cursor
            .snapshot
            .as_ref()
            .is_some_and(|s| s.migrated_from.is_some());
        if late() {
            return Ok(None);
        }
        // What is written must be readable: a header or a payload shape over the limits is
        // refused here, and the file on disk is left as it was.
        let header = read_snapshot(&bytes, &self.options.limits)
            .map_err(|source| StoreError::Format {
                path: self.paths.snapshot.clone(),
                source,
            })?
            .header;
        if late() {
            return Ok(None);
        }
        // The backup is taken only once the new bytes are known to be good, and given up if
        // they cannot be written: a failed migration leaves no copy behind (the original is
        // still in place, so the copy would only pile up, one per attempt).
        let backups = if migrated && self.options.backup_on_migrate {
            self.back_up()?
        } else {
            Vec::new()
        };
        if let Err(e) = fsio::write_atomic(&self.paths.snapshot, &bytes) {
            for b in &backups {
                if let Event::Backup { path } = b {
                    let _ = fs::remove_file(path);
                }
            }
            return Err(e.into());
        }
        events.extend(backups);
        self.remove_journal()?;
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
        Ok(Some(events))
    }

    /// Whether a snapshot was there at the last read.
    pub(crate) fn has_snapshot(&self) -> bool {
        self.cursor.snapshot.is_some()
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
            let backup = fsio::aside(original, &format!(".bak.{stamp}"));
            if fs::hard_link(original, &backup).is_err()
                && let Err(e) = fs::copy(original, &backup)
            {
                // A partial copy and the copies made so far are removed with the error.
                let _ = fs::remove_file(&backup);
                for done in &events {
                    if let Event::Backup { path } = done {
                        let _ = fs::remove_file(path);
                    }
                }
                return Err(StoreError::io("back up", original, e));
            }
            events.push(Event::Backup { path: backup });
        }
        Ok(events)
    }

    pub(super) fn append(&mut self, record: &[u8]) -> Result<(), Failure> {
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
            fsio::write_atomic(&path, &bytes)?;
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
