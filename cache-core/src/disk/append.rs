//! Appending one record without reading the cache: what a one-shot writer (`tunecache put`)
//! needs, at a cost that does not depend on the size of the table.

use std::sync::Arc;

use cache_format::{CacheData, FormatVersion, read_journal_header, scan_records};
use cache_migrate::Gate;

use super::{Base, Cursor, Disk, Failure, JournalState, TableState};
use crate::fsio::{self, FileId};
use crate::tablefile;

impl Disk {
    /// Under the lock: appends `batch` as one journal record after reading only the table's
    /// fixed start and commit and the journal's framing (checksums, no decoding). Returns
    /// `Ok(Err(why))`, having written nothing, when the file needs more than an append (no
    /// table yet, an older format, another schema, a damaged or stale journal, a fold due):
    /// the caller then takes the full path, which reads, repairs, migrates and folds.
    pub(crate) fn append_unread(
        &mut self,
        batch: &CacheData,
    ) -> Result<Result<(), &'static str>, Failure> {
        let limits = self.options.limits;
        let path = &self.paths.snapshot;
        let Some(file) = fsio::open_regular(path)? else {
            return Ok(Err("no cache file yet"));
        };
        let id = FileId::of(
            &file
                .metadata()
                .map_err(|e| crate::StoreError::io("inspect", path, e))?,
        );
        if !tablefile::starts_as_table(&file).map_err(|e| crate::StoreError::io("read", path, e))? {
            return Ok(Err("the file is of an older format"));
        }
        let Ok(table) = tablefile::open(Arc::new(file), &limits) else {
            return Ok(Err("the cache file cannot be read"));
        };
        let (app, schema) = (&table.head().app, table.head().schema);
        if !matches!(self.registry.gate(app, schema), Gate::Current) {
            return Ok(Err("the file is not at this build's versions"));
        }
        let lineage = table.lineage();
        let mut cursor = Cursor {
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
        let record = self.checked_record(batch)?;
        if let Some((bytes, id)) = fsio::read_with_id(&self.paths.journal, limits.max_file_bytes)? {
            let Ok(bytes) = bytes else {
                return Ok(Err("the journal is too large"));
            };
            let Ok((jformat, jheader, start)) = read_journal_header(&bytes, &limits) else {
                return Ok(Err("the journal's header cannot be read"));
            };
            if jheader.base != lineage
                || jformat != FormatVersion::CURRENT
                || jheader.app != *self.registry.app()
                || jheader.schema != self.registry.current()
            {
                return Ok(Err("the journal needs repair or rewriting"));
            }
            let scan = scan_records(&bytes, start, &limits);
            if !scan.damaged.is_empty() || scan.end != bytes.len() {
                return Ok(Err("the journal needs repair"));
            }
            if (bytes.len() + record.len()) as u64 > self.options.compact_min_bytes {
                return Ok(Err("a fold is due"));
            }
            let mut state = JournalState::new(id, jformat, jheader, &bytes[..start]);
            state.advance(&bytes[start..]);
            state.checked = Some(id);
            cursor.journal = Some(state);
        } else if record.len() as u64 > self.options.compact_min_bytes {
            return Ok(Err("a fold is due"));
        }
        self.cursor = cursor;
        self.append(&record)?;
        Ok(Ok(()))
    }
}
