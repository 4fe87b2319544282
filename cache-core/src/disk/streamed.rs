//! Offline migration without the model: the snapshot migrated entry by entry from its bytes
//! into a new snapshot's ([`cache_migrate::upgrade_streamed`]), the journal merged in.

use cache_format::{FormatVersion, read_snapshot_framing};
use cache_migrate::Report;

use super::{Cursor, Disk, Failure, Incoming, SnapState};
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
    /// migration of a large file. Only a snapshot at the current format and an older schema
    /// whose steps are all declarative takes this path. The journal beside it is then read
    /// as a repair-free read reads it (migrated, a stale one ignored) and merged in; `None`
    /// for anything else, including any damage in either file and anything the streamed path
    /// declines, and the caller reads the usual way, which reports it. The cursor is left as
    /// a read of that snapshot would leave it, so writing the result keeps a backup if asked.
    pub(crate) fn migrate_streamed(&mut self) -> Result<Option<StreamedMigration>, Failure> {
        let limits = self.options.limits;
        let Some((Ok(bytes), id)) = read_with_id(&self.paths.snapshot, limits.max_file_bytes)?
        else {
            return Ok(None);
        };
        let Ok(snap) = read_snapshot_framing(&bytes, &limits) else {
            return Ok(None);
        };
        let (app, schema) = (snap.header.app.as_str(), snap.header.schema);
        if snap.format != FormatVersion::CURRENT
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
            snapshot: Some(SnapState {
                id,
                generation,
                migrated_from: Some(schema),
            }),
            journal: None,
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
        Ok(Some(StreamedMigration {
            entries: snapshot.len(),
            snapshot,
            report: streamed.report,
            grew: streamed.grew,
        }))
    }
}
