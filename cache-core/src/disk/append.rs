//! Appending one record without reading the cache: what a one-shot writer (`tunecache put`)
//! needs, at a cost that does not depend on the size of the snapshot.

use std::io::Read;

use cache_format::{CacheData, FormatVersion, peek_header, read_journal_header, scan_records};
use cache_migrate::Gate;

use super::{Cursor, Disk, Failure, JournalState, SnapState};
use crate::fsio::{self, FileId};

impl Disk {
    /// Under the lock: appends `batch` as one journal record after reading only the
    /// snapshot's header and the journal's framing (checksums, no decoding). Returns
    /// `Ok(Err(why))`, having written nothing, when the file needs more than an append (no
    /// snapshot yet, another format or schema, a damaged or stale journal, a compaction due):
    /// the caller then takes the full path, which reads, repairs, migrates and compacts.
    pub(crate) fn append_unread(
        &mut self,
        batch: &CacheData,
    ) -> Result<Result<(), &'static str>, Failure> {
        let limits = self.options.limits;
        let Some(meta) = fsio::stat(&self.paths.snapshot)? else {
            return Ok(Err("no cache file yet"));
        };
        let Some(file) = fsio::open_regular(&self.paths.snapshot)? else {
            return Ok(Err("no cache file yet"));
        };
        let mut prefix = Vec::new();
        file.take(limits.max_header_bytes + 64)
            .read_to_end(&mut prefix)
            .map_err(|e| crate::StoreError::io("read", &self.paths.snapshot, e))?;
        let Ok((format, header)) = peek_header(&prefix, &limits) else {
            return Ok(Err("the snapshot's header cannot be read"));
        };
        if format != FormatVersion::CURRENT
            || !matches!(
                self.registry.gate(&header.app, header.schema),
                Gate::Current
            )
        {
            return Ok(Err("the file is not at this build's versions"));
        }
        let snapshot_len = meta.len();
        let mut cursor = Cursor {
            snapshot: Some(SnapState {
                id: FileId::of(&meta),
                generation: header.generation,
                migrated_from: None,
            }),
            journal: None,
        };
        if let Some((bytes, id)) = fsio::read_with_id(&self.paths.journal, limits.max_file_bytes)? {
            let Ok(bytes) = bytes else {
                return Ok(Err("the journal is too large"));
            };
            let Ok((jformat, jheader, start)) = read_journal_header(&bytes, &limits) else {
                return Ok(Err("the journal's header cannot be read"));
            };
            if jheader.base != header.generation
                || jformat != FormatVersion::CURRENT
                || jheader.app != header.app
                || jheader.schema != header.schema
            {
                return Ok(Err("the journal needs repair or rewriting"));
            }
            let scan = scan_records(&bytes, start, &limits);
            if !scan.damaged.is_empty() || scan.end != bytes.len() {
                return Ok(Err("the journal needs repair"));
            }
            let budget = self
                .options
                .compact_min_bytes
                .max((snapshot_len as f64 * self.options.compact_ratio) as u64);
            if bytes.len() as u64 > budget {
                return Ok(Err("a compaction is due"));
            }
            let mut state = JournalState::new(id, jformat, jheader, &bytes[..start]);
            state.offset = bytes.len() as u64;
            cursor.journal = Some(state);
        }
        let record = self.checked_record(batch)?;
        self.cursor = cursor;
        self.append(&record)?;
        Ok(Ok(()))
    }
}
