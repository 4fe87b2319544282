//! The write half of the disk tier, always under the cache lock: append one journal record; or,
//! once the journal would pass its bound, *fold* it (and the batch) into the table as one
//! appended commit, whose cost is that of the keys it changes; or *rebuild* the table whole (a
//! new file written to a temporary, synced, renamed into place, the folder synced): the first
//! write of a cache, a file of an older format or schema, a rewrite asked for.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::sync::Arc;

use cache_format::table::{self as tbl, TKey, TableBuilder};
use cache_format::{
    CacheData, Entry, FormatError, FormatVersion, Scope, check_payload, encode_journal_header,
    encode_record, scan_records,
};

use super::{Base, Cursor, Disk, Event, Failure, JournalState, TableState};
use crate::error::StoreError;
use crate::fsio::{self, FileId};
use crate::tablefile::{self, NewTable};

impl Disk {
    /// Writes `batch` (under the lock, right after `read_updates(true)`): appends one journal
    /// record; folds the journal and the batch into the table once the journal would exceed
    /// its bound; rebuilds the table when there is none yet (or it is of an older format or
    /// schema), or when `rewrite` is set.
    pub(crate) fn write(
        &mut self,
        batch: &CacheData,
        rewrite: bool,
    ) -> Result<Vec<Event>, Failure> {
        if batch.is_empty() && !rewrite {
            return Ok(Vec::new());
        }
        if !rewrite && self.cursor.table().is_some() {
            let record = self.checked_record(batch)?;
            let journal_len = fsio::stat(&self.paths.journal)?.map_or(0, |m| m.len());
            if journal_len + record.len() as u64 <= self.options.compact_min_bytes {
                self.append(&record)?;
                return Ok(Vec::new());
            }
            // A writer with a budget (a command-line write) that cannot fold in time appends
            // instead: a later writer with time folds.
            let deadline = self
                .options
                .compaction_budget
                .and_then(|b| std::time::Instant::now().checked_add(b));
            match self.fold(super::fold::FoldBatch::Model(batch), deadline) {
                Ok(Some(events)) => return Ok(events),
                Ok(None) => tracing::info!(
                    "tunecache: folding the journal of {} into it would not finish within its budget; appended instead (a writer with more time folds)",
                    self.paths.snapshot.display()
                ),
                // The table would hold more scopes or namespaces than a reader accepts: the
                // entries stay readable in the journal, and a later fold takes them once the
                // file holds fewer (`tunecache gc` removes stale scopes).
                Err(Failure::Retry(e)) if super::fold::over_caps_error(&e) => {
                    tracing::warn!(
                        "tunecache: not folded into its table, kept in its journal: {e}"
                    );
                }
                Err(failure) => return Err(failure),
            }
            self.append(&record)?;
            return Ok(Vec::new());
        }
        self.rebuild(batch)
    }

    /// [`Disk::write`] for a merge of many entries (an import): an append if they fit the
    /// journal's bound, else a fold; never a fold given up for its budget.
    pub(crate) fn write_merging(
        &mut self,
        batch: &CacheData,
        rewrite: bool,
    ) -> Result<Vec<Event>, Failure> {
        self.write(batch, rewrite)
    }

    /// `batch` without the entries that merging into what the file holds (the table, and the
    /// journal as read: `journal`, a whole file's data for an older format) would not change.
    pub(crate) fn without_unchanged(&self, batch: CacheData, journal: &CacheData) -> CacheData {
        let view = self.view(super::Changed::Keys(Default::default()));
        let mut changed = CacheData::new();
        for (scope, sd) in batch.into_scopes() {
            for (ns, entries) in sd.into_namespaces() {
                for (fp, entry) in entries {
                    let stored = match &view.table {
                        Some(_) => super::lookup(&view, &scope, &ns, &fp).0,
                        None => journal.get(&scope, &ns, &fp).cloned(),
                    };
                    let same = stored.is_some_and(|old| {
                        let mut merged = old.clone();
                        merged.merge(entry.clone());
                        merged == old
                    });
                    if !same {
                        changed.insert(&scope, &ns, entry);
                    }
                }
            }
        }
        changed
    }

    /// `batch` encoded as one journal record, checked as a reader would check it: what is
    /// appended must be readable.
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

    /// Writes a new table holding everything on disk and `batch` (see the module docs), then
    /// removes the journal (its records are in the table).
    pub(super) fn rebuild(&mut self, batch: &CacheData) -> Result<Vec<Event>, Failure> {
        fsio::remove_stale_temporaries(&self.paths.snapshot);
        fsio::remove_stale_temporaries(&self.paths.journal);
        let retention = self.options.retention;
        match self.cursor.table().cloned() {
            Some(state) if retention == crate::retention::Retention::default() => {
                self.rebuild_from_table(&state, batch)
            }
            _ => {
                let all = match &self.cursor.base {
                    None => super::Incoming::default(),
                    Some(_) => self.read_all(true)?,
                };
                let mut data = all.data;
                data.merge(all.salvaged);
                data.merge(batch.clone());
                if retention != crate::retention::Retention::default() {
                    let (kept, by_age, by_size, _) = crate::retention::prune(
                        &data,
                        &self.registry,
                        retention.max_age,
                        retention.max_bytes,
                    );
                    if by_age + by_size > 0 {
                        tracing::info!(
                            "tunecache: rewriting {} dropped {by_age} entries for their age and {by_size} to keep it under its size limit",
                            self.paths.snapshot.display()
                        );
                    }
                    data = kept;
                }
                // A rewrite at the current schema keeps the table's lineage, so its journal
                // (if any is left) goes on applying.
                let lineage = self.cursor.table().map(|t| t.table.lineage());
                self.write_table_of(&data, all.events, lineage)
            }
        }
    }

    /// Reads everything on disk (all scopes) from scratch, without changing the cursor.
    pub(crate) fn read_all(&self, locked: bool) -> Result<super::Incoming, Failure> {
        let mut fresh = Cursor::default();
        let mut inc = self.read_into(&mut fresh, locked)?;
        // A table at the current versions is read a key at a time: here, every entry.
        if let Some(state) = fresh.table() {
            let data = super::table::read_whole(&state.table)
                .map_err(|e| tablefile::format_error(&self.paths.snapshot, e))?;
            let mut all = data;
            all.merge(fresh.journal_data.to_data());
            inc.data = all;
        }
        Ok(inc)
    }

    /// The table rewritten with the journal and `batch` merged in, entry bytes copied as they
    /// are where nothing changes them; its lineage is kept.
    fn rebuild_from_table(
        &mut self,
        state: &TableState,
        batch: &CacheData,
    ) -> Result<Vec<Event>, Failure> {
        let path = self.paths.snapshot.clone();
        let mut changes = self.cursor.journal_data.to_data();
        changes.merge(batch.clone());
        let table = &state.table;
        let mut builder = TableBuilder::new(
            self.registry.app(),
            self.registry.current(),
            Some(table.lineage()),
        );
        builder.rewritten_from(tbl::Rewritten {
            lineage: table.lineage(),
            seq: table.commit().seq,
        });
        let mut out = NewTable::create(&path, builder)?;
        let copied = copy_merged(table, &changes, &mut out, &self.options.limits);
        let (mut events, lost) = match copied {
            Ok(()) => (Vec::new(), None),
            Err(Copy::Store(e)) => return Err(e.into()),
            Err(Copy::Damaged) => {
                // Damage in the way: everything readable, entry by entry, with a copy of the
                // file as it was kept aside.
                drop(out);
                return self.rebuild_salvaging(state, batch);
            }
        };
        let _ = &mut events;
        let _: Option<()> = lost;
        out.finish()?;
        self.after_new_table(events)
    }

    /// A rewrite of a table with damaged blocks: every entry that can still be read (the rest
    /// are lost, and a copy of the file as it was is kept beside it), with the journal and
    /// `batch` merged in.
    fn rebuild_salvaging(
        &mut self,
        state: &TableState,
        batch: &CacheData,
    ) -> Result<Vec<Event>, Failure> {
        let path = self.paths.snapshot.clone();
        let mut data = CacheData::new();
        let report = tbl::check_table(&state.table, |scope, ns, entry| {
            data.insert(scope, ns, entry);
            std::ops::ControlFlow::Continue(())
        });
        data.merge(self.cursor.journal_data.to_data());
        data.merge(batch.clone());
        let mut identity = Vec::new();
        for p in &report.problems {
            identity.extend_from_slice(p.as_bytes());
        }
        let kept = self.keep_copy(&path, "damaged", &identity)?;
        let mut events = vec![Event::DamagedTable {
            path: path.clone(),
            problems: report.problems.len(),
            first: report.problems.first().cloned().unwrap_or_default(),
            kept,
        }];
        events.extend(self.write_table_of(&data, Vec::new(), Some(state.table.lineage()))?);
        Ok(events)
    }

    /// Writes `data` as the new table (lineage `lineage`, or a new one) and removes the
    /// journal, under the lock. `data` must be everything on disk plus what is new.
    pub(crate) fn write_table_of(
        &mut self,
        data: &CacheData,
        events: Vec<Event>,
        lineage: Option<u64>,
    ) -> Result<Vec<Event>, Failure> {
        let path = self.paths.snapshot.clone();
        let limits = self.options.limits;
        // What is written must be readable: an entry over a reader's bounds is refused here,
        // and the file on disk is left as it was.
        let mut sorted: Vec<(TKey, &Scope, &str, &Entry)> = keyed(data);
        sorted.sort_by_key(|(key, ..)| *key);
        let builder = TableBuilder::new(self.registry.app(), self.registry.current(), lineage);
        let mut out = NewTable::create(&path, builder)?;
        for (key, scope, ns, entry) in sorted {
            let bytes = tbl::encode_entry(entry);
            tbl::decode_entry(&key, ns, &bytes, &limits)
                .map_err(|e| tablefile::format_error(&path, e))?;
            out.add(key, scope, ns, &bytes)?;
        }
        self.commit_new_table(out, events)
    }

    /// Puts a new table in place (backups first, if a migrated file is being replaced), then
    /// the journal goes and the cursor reads the new table.
    pub(crate) fn commit_new_table(
        &mut self,
        out: NewTable,
        mut events: Vec<Event>,
    ) -> Result<Vec<Event>, Failure> {
        let migrated = self
            .cursor
            .base
            .as_ref()
            .is_some_and(|b| b.migrated_from().is_some());
        // The backup is taken only once the new bytes are ready, and given up if they cannot
        // be put in place: a failed migration leaves no copy behind.
        let backups = if migrated && self.options.backup_on_migrate {
            self.back_up()?
        } else {
            Vec::new()
        };
        if let Err(e) = out.finish() {
            for b in &backups {
                if let Event::Backup { path } = b {
                    let _ = fs::remove_file(path);
                }
            }
            return Err(e.into());
        }
        events.extend(backups);
        self.after_new_table(events)
    }

    /// After a new table was renamed into place: the journal goes, the cursor reads the table.
    fn after_new_table(&mut self, events: Vec<Event>) -> Result<Vec<Event>, Failure> {
        self.remove_journal()?;
        let path = &self.paths.snapshot;
        let file = fsio::open_regular(path)?
            .ok_or_else(|| StoreError::io("find", path, std::io::ErrorKind::NotFound.into()))?;
        let id = FileId::of(
            &file
                .metadata()
                .map_err(|e| StoreError::io("inspect", path, e))?,
        );
        let table = tablefile::open(Arc::new(file), &self.options.limits)
            .map_err(|e| tablefile::table_error(path, e))?;
        self.cursor = Cursor {
            base: Some(Base::Table(TableState {
                id,
                table: Arc::new(table),
                migrated_from: None,
            })),
            journal: None,
            journal_data: super::JournalData::default(),
            lost: Default::default(),
            folded: None,
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
        let base = self
            .cursor
            .base
            .as_ref()
            .expect("append happens only when a snapshot exists")
            .journal_base();
        if self.cursor.journal.is_none() {
            // No journal for this snapshot yet (or a stale one was removed): start one.
            let header = cache_format::JournalHeader {
                app: self.registry.app().to_owned(),
                schema: self.registry.current(),
                base,
                nonce: fsio::nonce(),
            };
            let bytes = encode_journal_header(&header);
            fsio::write_atomic(&path, &bytes)?;
            let id = FileId::of(&fsio::stat(&path)?.ok_or_else(|| {
                StoreError::io("find", &path, std::io::ErrorKind::NotFound.into())
            })?);
            let mut state = JournalState::new(id, FormatVersion::CURRENT, header, &bytes);
            state.checked = Some(id);
            self.cursor.journal = Some(state);
        }
        let j = self.cursor.journal.as_mut().expect("just ensured");
        if j.schema != self.registry.current() || j.app != self.registry.app() {
            // An older journal is still bound to this snapshot; it is rewritten at the next
            // rebuild. Appending current-schema records to it would mislabel them.
            return Err(Failure::Retry(StoreError::io(
                "append to",
                &path,
                std::io::Error::other("the journal has an older schema; a rewrite is pending"),
            )));
        }
        let mut file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| StoreError::io("open", &path, e))?;
        let before = j.offset;
        // The journal as this write left it: if it is another by the time the sync returns,
        // someone else wrote meanwhile, and the next locked read checks it whole.
        let mut after_write = None;
        let written = file.write_all(record).and_then(|()| {
            after_write = file.metadata().ok().map(|m| FileId::of(&m));
            #[cfg(test)]
            super::between_reads::run();
            file.sync_data()
        });
        if let Err(e) = written {
            // Leave no partial record behind (we hold the lock, nobody else appends).
            let _ = file.set_len(before).and_then(|()| file.sync_all());
            return Err(Failure::Retry(StoreError::io("append to", &path, e)));
        }
        j.advance(record);
        // Under the lock, nobody else appends between the read before this save and now: the
        // journal is what this process read and wrote, unless it changed during the sync.
        if let Ok(Some(meta)) = fsio::stat(&path) {
            j.id = FileId::of(&meta);
            if after_write == Some(j.id) {
                j.checked = Some(j.id);
            }
        }
        // Lookups through this cursor see what was appended.
        if self.cursor.table().is_some()
            && let Some(r) = scan_records(record, 0, &self.options.limits)
                .records
                .first()
            && let Ok(data) =
                cache_format::raw::decode_payload(&record[r.clone()], &self.options.limits)
        {
            if let Some(j) = self.cursor.journal.as_mut() {
                j.wrote.merge(data.clone());
            }
            self.cursor.journal_data = self.cursor.journal_data.with(data);
        }
        Ok(())
    }
}

/// Each entry of `data` with its table key, scope and namespace, in key order.
pub(super) fn keyed(data: &CacheData) -> Vec<(TKey, &Scope, &str, &Entry)> {
    let mut v: Vec<(TKey, &Scope, &str, &Entry)> = data
        .entries()
        .map(|(s, ns, e)| (TKey::of(s, ns, &e.fingerprint()), s, ns, e))
        .collect();
    v.sort_by_key(|(key, ..)| *key);
    v
}

/// Why a copy of a table stopped.
enum Copy {
    /// A block of the table is damaged.
    Damaged,
    /// Writing the new one failed.
    Store(StoreError),
}

/// Copies every entry of `table` into `out` in key order with `changes` merged in (an entry
/// both have is decoded, merged and encoded; one only the table has is copied as stored, its
/// checksum checked by the read).
fn copy_merged(
    table: &tablefile::TableFile,
    changes: &CacheData,
    out: &mut NewTable,
    limits: &cache_format::Limits,
) -> Result<(), Copy> {
    let dir = table.directory().map_err(|_| Copy::Damaged)?;
    let mut pending = keyed(changes).into_iter().peekable();
    let mut cursor = table.cursor(&TKey([0; 48]));
    let put = |out: &mut NewTable, key: TKey, scope: &Scope, ns: &str, e: &Entry| {
        let bytes = tbl::encode_entry(e);
        tbl::decode_entry(&key, ns, &bytes, limits)
            .map_err(|e| Copy::Store(tablefile::format_error(Path::new("(new table)"), e)))?;
        out.add(key, scope, ns, &bytes).map_err(Copy::Store)
    };
    loop {
        let next = cursor.next_ref().transpose().map_err(|_| Copy::Damaged)?;
        // Changes before the table's next key (or after its last) go first.
        while let Some((k, scope, ns, e)) = pending.peek().copied() {
            if next.is_some_and(|(t, _)| t <= k) {
                break;
            }
            put(out, k, scope, ns, e)?;
            pending.next();
        }
        let Some((key, r)) = next else {
            return Ok(());
        };
        let bytes = table.entry_bytes(&r).map_err(|_| Copy::Damaged)?;
        let ns = dir.names.get(&key.namespace()).ok_or(Copy::Damaged)?;
        let scope = &dir.scopes.get(&key.scope()).ok_or(Copy::Damaged)?.scope;
        match pending.next_if(|(k, ..)| *k == key) {
            Some((_, _, _, change)) => {
                let mut merged = table
                    .decode_entry(&key, ns, &bytes)
                    .map_err(|_| Copy::Damaged)?;
                merged.merge(Entry::clone(change));
                put(out, key, scope, ns, &merged)?;
            }
            None => out.add(key, scope, ns, &bytes).map_err(Copy::Store)?,
        }
    }
}

use std::path::Path;
