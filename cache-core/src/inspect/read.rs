//! Reading a cache as stored for [`super::Inspection`]: the snapshot and journal as a
//! consistent pair, without lock or repair, every problem listed.

use std::path::Path;

use cache_format::raw::decode_payload;
use cache_format::table::{ReadAt as _, SLOT_A, SLOT_B};
use cache_format::{
    CacheData, Limits, Tail, read_journal_header, read_snapshot_framing, scan_records,
};
use cache_migrate::Migrations;

use super::{GateVerdict, Inspection, JournalInfo, SnapshotInfo};
use crate::disk::Paths;
use crate::error::StoreError;
use crate::fsio::{self, FileId};

/// Reads a cache file and its journal without locking or changing anything, as stored, and
/// names the gate `registry` would apply ([`Inspection::gate`]). Only an I/O error (other
/// than a missing file) is an `Err`; damage is listed in `problems`.
pub fn inspect(
    path: &Path,
    limits: &Limits,
    registry: Option<&Migrations>,
) -> Result<Inspection, StoreError> {
    // Snapshot and journal are read one after the other without the lock; a compaction in
    // between (a new snapshot holding the journal's records, the journal removed) would make
    // them an inconsistent pair and drop entries from what is shown. The snapshot file must be
    // the same one before and after: if not, read again.
    const ATTEMPTS: usize = 8;
    let paths = Paths::new(path.to_owned());
    let identity = |p: &Path| -> Result<Option<FileId>, StoreError> {
        Ok(fsio::stat(p)?.map(|m| FileId::of(&m)))
    };
    for _ in 1..ATTEMPTS {
        let before = identity(&paths.snapshot)?;
        let out = inspect_once(&paths, limits, registry)?;
        if identity(&paths.snapshot)? == before {
            return Ok(out);
        }
    }
    let mut out = inspect_once(&paths, limits, registry)?;
    out.notes.push(format!(
        "{}: the cache kept changing while it was read ({ATTEMPTS} tries); entries written meanwhile may be missing",
        out.path.display()
    ));
    Ok(out)
}

impl Inspection {
    /// Nothing read yet, for the cache at `paths`.
    fn empty(paths: &Paths, limits: &Limits) -> Inspection {
        Inspection {
            path: paths.snapshot.clone(),
            journal_path: paths.journal.clone(),
            snapshot: SnapshotInfo::default(),
            journal: JournalInfo::default(),
            payload: None,
            table: None,
            whole: std::sync::OnceLock::new(),
            journal_data: CacheData::new(),
            migrated: None,
            limits: *limits,
            problems: Vec::new(),
            notes: Vec::new(),
            gate: None,
        }
    }

    /// Takes `t` as the file read, its header and gate as what it says.
    fn set_table(&mut self, t: crate::tablefile::TableFile, registry: Option<&Migrations>) {
        let head = t.head();
        self.gate = Some(GateVerdict::of(registry, &head.app, head.schema));
        let scopes = t.directory().map_or(0, |d| d.scopes.len() as u64);
        self.snapshot.format = Some(cache_format::FormatVersion::V4);
        self.snapshot.header = Some(cache_format::Header {
            app: head.app.clone(),
            schema: head.schema,
            generation: t.lineage(),
            entries: t.commit().entries,
            scopes,
        });
        self.table = Some(std::sync::Arc::new(t));
    }

    /// The table inside a bundle at `path`, as stored (no journal).
    pub(crate) fn of_table(
        path: &Path,
        t: crate::tablefile::TableFile,
        limits: &Limits,
        registry: Option<&Migrations>,
    ) -> Inspection {
        let mut out = Inspection::empty(&Paths::new(path.to_owned()), limits);
        out.snapshot.bytes = t.source().size().ok();
        out.set_table(t, registry);
        out
    }

    /// Entries decoded from a snapshot inside a bundle at `path`, as stored.
    pub(crate) fn of_data(
        path: &Path,
        header: &cache_format::Header,
        format: cache_format::FormatVersion,
        data: CacheData,
        limits: &Limits,
        registry: Option<&Migrations>,
    ) -> Inspection {
        let mut out = Inspection::empty(&Paths::new(path.to_owned()), limits);
        out.snapshot.format = Some(format);
        out.snapshot.header = Some(header.clone());
        out.gate = Some(GateVerdict::of(registry, &header.app, header.schema));
        out.journal_data = data;
        out
    }
}

fn inspect_once(
    paths: &Paths,
    limits: &Limits,
    registry: Option<&Migrations>,
) -> Result<Inspection, StoreError> {
    let path = &paths.snapshot;
    let mut out = Inspection::empty(paths, limits);
    let mut generation = None;
    if let Some(file) = crate::fsio::open_regular(path)?
        && crate::tablefile::starts_as_table(&file).map_err(|e| StoreError::io("read", path, e))?
    {
        let size = file
            .metadata()
            .map_err(|e| StoreError::io("inspect", path, e))?
            .len();
        out.snapshot.bytes = Some(size);
        out.snapshot.format = Some(cache_format::FormatVersion::V4);
        match crate::tablefile::open(std::sync::Arc::new(file), limits) {
            Ok(t) => {
                generation = Some(t.lineage());
                table_problems(path, &t, &mut out.problems);
                let torn = crate::tablefile::torn_len(&t);
                if torn > 0 && t.passed_over().is_none() {
                    out.notes.push(format!(
                        "{}: {torn} bytes after the last commit (an interrupted or ongoing write; cut off at the next fold)",
                        path.display()
                    ));
                }
                out.set_table(t, registry);
            }
            Err(e) => out.problems.push(format!("{}: {e}", path.display())),
        }
    } else if let Some(bytes) = read(&paths.snapshot, limits, &mut out.problems)? {
        out.snapshot.bytes = Some(bytes.len() as u64);
        let mut range = None;
        // The envelope and checksums only: the payload is walked entry by entry later, each
        // entry checked as it goes (`verify` also scans it whole and checks the caps).
        match read_snapshot_framing(&bytes, limits) {
            Ok(snap) => {
                out.snapshot.format = Some(snap.format);
                generation = Some(snap.header.generation);
                out.gate = Some(GateVerdict::of(
                    registry,
                    &snap.header.app,
                    snap.header.schema,
                ));
                let payload = snap.payload_bytes();
                let start = payload.as_ptr() as usize - bytes.as_ptr() as usize;
                range = Some(start..start + payload.len());
                out.snapshot.header = Some(snap.header);
            }
            Err(e) => out.problems.push(format!("{}: {e}", path.display())),
        }
        // The file's bytes are kept, not copied: the payload is walked in place.
        out.payload = range.map(|r| (bytes, r));
    }
    read_journal_part(paths, limits, registry, generation, &mut out)?;
    Ok(out)
}

/// What a table's fixed start and newest commit say is damaged: a slot that fails its check, a
/// newer commit passed over, the newest commit's change list.
fn table_problems(path: &Path, t: &crate::tablefile::TableFile, problems: &mut Vec<String>) {
    for (i, at) in [SLOT_A, SLOT_B].into_iter().enumerate() {
        if !t.head().damaged[i] {
            continue;
        }
        let found = if t.recovered_slot() == Some(at) {
            format!(
                "; its commit {} was found whole by its block and is read",
                t.commit().seq
            )
        } else {
            String::new()
        };
        problems.push(format!(
            "{}: the commit slot at offset {at} fails its check (a torn write or \
             damage){found}; the next folds write the slots afresh",
            path.display()
        ));
    }
    if let Some(p) = t.passed_over() {
        let slot = if p.slot_at == SLOT_A { "A" } else { "B" };
        problems.push(format!(
            "{}: commit {} (slot {slot}) does not read back ({}); a slot is written \
             only after its commit is synced, so this is damage: commit {} is read \
             instead, and the next write keeps a copy of the file as it is",
            path.display(),
            p.seq,
            p.problem,
            t.commit().seq
        ));
    }
    // The newest commit's change list (what a reader that saw the commit before
    // learns from): a block like the others, checked like them.
    if t.commit().changes.is_some()
        && let Err(e) = t.changes_since(t.commit().seq - 1, 1)
    {
        problems.push(format!(
            "{}: the change list of commit {} does not read back ({e}); a reader \
             that last saw commit {} reads the whole table again",
            path.display(),
            t.commit().seq,
            t.commit().seq - 1
        ));
    }
}

/// The journal's part of [`inspect_once`]: its header, records and damage, checked against
/// the snapshot read before (its `generation`).
fn read_journal_part(
    paths: &Paths,
    limits: &Limits,
    registry: Option<&Migrations>,
    generation: Option<u64>,
    out: &mut Inspection,
) -> Result<(), StoreError> {
    let jpath = &paths.journal;
    if let Some(bytes) = read(jpath, limits, &mut out.problems)? {
        out.journal.bytes = Some(bytes.len() as u64);
        match read_journal_header(&bytes, limits) {
            Ok((_, header, start)) => {
                if out.gate.is_none() {
                    out.gate = Some(GateVerdict::of(registry, &header.app, header.schema));
                }
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
                            Ok(data) => out.journal_data.merge(data),
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
    Ok(())
}

fn read(
    path: &Path,
    limits: &Limits,
    problems: &mut Vec<String>,
) -> Result<Option<Vec<u8>>, StoreError> {
    crate::fsio::check_regular(path)?;
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
        Ok(m) => {
            let Some(file) = crate::fsio::open_regular(path)? else {
                return Ok(None);
            };
            // Bounded by the bytes actually read, not by what the metadata said.
            let mut bytes = Vec::with_capacity(m.len().min(limits.max_file_bytes) as usize + 1);
            std::io::Read::read_to_end(
                &mut std::io::Read::take(file, limits.max_file_bytes + 1),
                &mut bytes,
            )
            .map_err(|e| StoreError::io("read", path, e))?;
            if bytes.len() as u64 > limits.max_file_bytes {
                problems.push(format!(
                    "{}: over the limit of {} bytes",
                    path.display(),
                    limits.max_file_bytes
                ));
                return Ok(None);
            }
            Ok(Some(bytes))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StoreError::io("inspect", path, e)),
    }
}
