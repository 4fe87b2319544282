//! Offline migration without the model: the snapshot migrated entry by entry from its bytes
//! into a new snapshot's ([`cache_migrate::upgrade_streamed`]), the journal merged in.

use cache_format::read_snapshot_framing;
use cache_migrate::Report;

use super::{Base, Cursor, Disk, Failure, Incoming, SnapState};
use crate::fsio::read_with_id;

/// A migration made by [`Disk::migrate_streamed`], not yet written.
#[derive(Debug)]
pub(crate) struct StreamedMigration {
    /// The migrated entries, encoded.
    pub(crate) snapshot: cache_format::SnapshotBuilder,
    /// What the steps did.
    pub(crate) report: Report,
    /// Entries after the migration.
    pub(crate) entries: u64,
    /// Whether an operation added fields (the write checks the reader's bounds in any case).
    pub(crate) grew: bool,
}

impl Disk {
    /// Migrates the snapshot entry by entry from its bytes into a new snapshot's, never
    /// holding the decoded model ([`cache_migrate::upgrade_streamed`]): for an offline
    /// migration of a large file. Only a format 3 snapshot at an older schema
    /// whose steps are all declarative takes this path. The journal beside it is then read
    /// as a repair-free read reads it (migrated, a stale one ignored) and merged in; `None`
    /// for anything else, including any damage in either file and anything the streamed path
    /// declines, and the caller reads the usual way, which reports it. The cursor is left as
    /// a read of that snapshot would leave it, so writing the result keeps a backup if asked.
    pub(crate) fn migrate_streamed(&mut self) -> Result<Option<StreamedMigration>, Failure> {
        let limits = self.options.limits;
        // A table is not read here (its own path walks it in place): its first bytes say so.
        if let Some(file) = crate::fsio::open_regular(&self.paths.snapshot)? {
            let mut prefix = [0u8; 16];
            use std::os::unix::fs::FileExt as _;
            if file.read_exact_at(&mut prefix, 0).is_ok() && cache_format::table::is_table(&prefix)
            {
                return Ok(None);
            }
        }
        let Some((Ok(bytes), id)) = read_with_id(&self.paths.snapshot, limits.max_file_bytes)?
        else {
            return Ok(None);
        };
        let Ok(snap) = read_snapshot_framing(&bytes, &limits) else {
            return Ok(None);
        };
        let (app, schema) = (snap.header.app.as_str(), snap.header.schema);
        if !snap.format.is_current_payload()
            || schema >= self.registry.current()
            || self.registry.check(app, schema).is_err()
        {
            return Ok(None);
        }
        let generation = snap.header.generation;
        let Some(streamed) =
            cache_migrate::upgrade_streamed(&self.registry, schema, snap.payload_bytes(), &limits)
        else {
            return Ok(None);
        };
        // The old bytes go before the new ones are put together.
        drop(bytes);
        let mut cursor = Cursor {
            base: Some(Base::Legacy(SnapState {
                id,
                generation,
                migrated_from: Some(schema),
            })),
            ..Cursor::default()
        };
        // The journal's records (usually few) as the usual read takes them; any damage, or a
        // journal that cannot be used, is left to that read.
        let mut journal = Incoming::default();
        self.read_journal(&mut cursor, generation, false, &mut journal)?;
        if !journal.events.is_empty() || !journal.salvaged.is_empty() {
            return Ok(None);
        }
        let mut snapshot = streamed.snapshot;
        for (scope, ns, entry) in journal.data.entries() {
            if snapshot.merge(scope, ns, entry.clone()).is_err() {
                return Ok(None);
            }
        }
        self.cursor = cursor;
        let mut report = streamed.report;
        report.steps.extend(super::legacy::table_steps());
        Ok(Some(StreamedMigration {
            entries: snapshot.len(),
            snapshot,
            report,
            grew: streamed.grew,
        }))
    }
}

impl Disk {
    /// Writes the entries of `built` as the new table (a new lineage) and removes the journal,
    /// under the lock; backups first if the file being replaced was migrated.
    pub(crate) fn write_built(
        &mut self,
        built: &cache_format::SnapshotBuilder,
        events: Vec<super::Event>,
    ) -> Result<Vec<super::Event>, Failure> {
        let path = self.paths.snapshot.clone();
        let limits = self.options.limits;
        let builder = cache_format::table::TableBuilder::new(
            self.registry.app(),
            self.registry.current(),
            None,
        );
        let mut out = crate::tablefile::NewTable::create(&path, builder)?;
        built.try_for_each_in_table_order(|key, scope, ns, bytes| {
            cache_format::table::decode_entry(&key, ns, bytes, &limits)
                .map_err(|e| crate::tablefile::format_error(&path, e))?;
            out.add(key, scope, ns, bytes)
        })?;
        self.commit_new_table(out, events)
    }
}
