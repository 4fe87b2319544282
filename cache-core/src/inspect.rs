//! Read-only inspection of a cache file and its journal, for `tunecache stats`, `list`,
//! `verify` and `export`: no lock, no repair, no migration, every problem listed.

use std::path::{Path, PathBuf};

use cache_format::{
    CacheData, FormatVersion, Header, JournalHeader, Limits, Tail, decode_payload,
    read_journal_header, read_snapshot, scan_records,
};

use crate::disk::Paths;
use crate::error::StoreError;

/// What was found in the snapshot file.
#[derive(Debug, Clone, Default)]
pub struct SnapshotInfo {
    /// Its size, if it exists.
    pub bytes: Option<u64>,
    /// The container format, if readable.
    pub format: Option<FormatVersion>,
    /// The header, if readable.
    pub header: Option<Header>,
}

/// What was found in the journal.
#[derive(Debug, Clone, Default)]
pub struct JournalInfo {
    /// Its size, if it exists.
    pub bytes: Option<u64>,
    /// The header, if readable.
    pub header: Option<JournalHeader>,
    /// Whether it belongs to an earlier snapshot (its records are already in the snapshot).
    pub stale: bool,
    /// Records that passed their checksum.
    pub records: usize,
    /// Records that failed it.
    pub damaged: usize,
    /// Incomplete bytes at the end (an interrupted append).
    pub torn_bytes: u64,
}

/// The result of [`inspect`].
#[derive(Debug, Clone)]
pub struct Inspection {
    /// The snapshot file.
    pub path: PathBuf,
    /// The journal file.
    pub journal_path: PathBuf,
    /// The snapshot.
    pub snapshot: SnapshotInfo,
    /// The journal.
    pub journal: JournalInfo,
    /// Every readable entry (snapshot plus current journal), all scopes, as stored.
    pub data: CacheData,
    /// Everything wrong, one line each; empty for a healthy cache.
    pub problems: Vec<String>,
    /// Things worth knowing that are not wrong (a stale journal, a torn tail).
    pub notes: Vec<String>,
}

/// Reads a cache file and its journal without locking or changing anything. Only an I/O
/// error (other than a missing file) is an `Err`; damage is listed in `problems`.
pub fn inspect(path: &Path, limits: &Limits) -> Result<Inspection, StoreError> {
    let paths = Paths::new(path.to_owned());
    let mut out = Inspection {
        path: paths.snapshot.clone(),
        journal_path: paths.journal.clone(),
        snapshot: SnapshotInfo::default(),
        journal: JournalInfo::default(),
        data: CacheData::new(),
        problems: Vec::new(),
        notes: Vec::new(),
    };
    let mut generation = None;
    if let Some(bytes) = read(&paths.snapshot, limits, &mut out.problems)? {
        out.snapshot.bytes = Some(bytes.len() as u64);
        match read_snapshot(&bytes, limits) {
            Ok(snap) => {
                out.snapshot.format = Some(snap.format);
                generation = Some(snap.header.generation);
                match snap.decode() {
                    Ok(data) => {
                        if data.len() as u64 != snap.header.entries {
                            out.problems.push(format!(
                                "{}: the header counts {} entries, the payload holds {}",
                                path.display(),
                                snap.header.entries,
                                data.len()
                            ));
                        }
                        out.data = data;
                    }
                    Err(e) => out.problems.push(format!("{}: {e}", path.display())),
                }
                out.snapshot.header = Some(snap.header);
            }
            Err(e) => out.problems.push(format!("{}: {e}", path.display())),
        }
    }
    let jpath = &paths.journal;
    if let Some(bytes) = read(jpath, limits, &mut out.problems)? {
        out.journal.bytes = Some(bytes.len() as u64);
        match read_journal_header(&bytes, limits) {
            Ok((_, header, start)) => {
                out.journal.stale = generation != Some(header.base);
                if out.journal.stale {
                    out.notes.push(format!(
                        "{}: stale (it extends an earlier snapshot); its records are ignored and it is removed at the next save",
                        jpath.display()
                    ));
                }
                if let Some(h) = &out.snapshot.header
                    && (h.app != header.app || h.schema != header.schema)
                    && !out.journal.stale
                {
                    out.notes.push(format!(
                        "{}: written for {} schema {}, the snapshot for {} schema {}",
                        jpath.display(),
                        header.app,
                        header.schema,
                        h.app,
                        h.schema
                    ));
                }
                let scan = scan_records(&bytes, start, limits);
                out.journal.records = scan.records.len();
                out.journal.damaged = scan.damaged.len();
                for d in &scan.damaged {
                    out.problems.push(format!(
                        "{}: record at offset {}: {}",
                        jpath.display(),
                        d.offset,
                        d.error
                    ));
                }
                if let Tail::Torn {
                    offset,
                    len,
                    interrupted,
                } = scan.tail
                {
                    out.journal.torn_bytes = len;
                    let line = format!(
                        "{}: {len} incomplete bytes at offset {offset}{}",
                        jpath.display(),
                        if interrupted {
                            " (an interrupted write; cut off at the next save)"
                        } else {
                            " that are not a record"
                        }
                    );
                    if interrupted {
                        out.notes.push(line);
                    } else {
                        out.problems.push(line);
                    }
                }
                if !out.journal.stale {
                    for range in &scan.records {
                        match decode_payload(&bytes[range.clone()], limits) {
                            Ok(data) => out.data.merge(data),
                            Err(e) => out.problems.push(format!(
                                "{}: record at offset {}: {e}",
                                jpath.display(),
                                range.start
                            )),
                        }
                    }
                }
                out.journal.header = Some(header);
            }
            Err(e) => out.problems.push(format!("{}: {e}", jpath.display())),
        }
    }
    Ok(out)
}

fn read(
    path: &Path,
    limits: &Limits,
    problems: &mut Vec<String>,
) -> Result<Option<Vec<u8>>, StoreError> {
    match std::fs::metadata(path) {
        Ok(m) if m.len() > limits.max_file_bytes => {
            problems.push(format!(
                "{}: {} bytes, over the limit of {} bytes",
                path.display(),
                m.len(),
                limits.max_file_bytes
            ));
            Ok(None)
        }
        Ok(_) => std::fs::read(path)
            .map(Some)
            .map_err(|e| StoreError::io("read", path, e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StoreError::io("inspect", path, e)),
    }
}
