//! Read-only inspection of a cache file and its journal, for `tunecache stats`, `list`,
//! `verify` and `export`: no lock, no repair, no migration, every problem listed.
//!
//! This is the one reader in cache-core that decodes without `upgrade()` (through
//! `cache_format::raw`): it shows the file as stored. It reports, as [`GateVerdict`], what the
//! version gate would do with it on load, so no one mistakes what it shows for what a load
//! would give.

use std::path::{Path, PathBuf};

use cache_format::raw::{decode_payload, decode_snapshot};
use cache_format::{
    CacheData, FormatVersion, Header, JournalHeader, Limits, Tail, read_journal_header,
    read_snapshot, scan_records,
};
use cache_migrate::{Gate, MigrateError, Migrations};

use crate::disk::Paths;
use crate::error::StoreError;
use crate::fsio::{self, FileId};

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
    /// What the version gate of this build would do with the file, if its header was read.
    pub gate: Option<GateVerdict>,
}

/// What loading a file would do, by the version gate of the registry given to [`inspect`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateVerdict {
    /// No registry of the file's application was given, so no gate can be named.
    Unknown {
        /// The application in the header.
        app: String,
        /// The schema in the header.
        schema: u32,
    },
    /// At the current schema: loaded as stored.
    Current {
        /// The schema.
        schema: u32,
    },
    /// Older: a load migrates it.
    Migrates {
        /// The schema as stored.
        from: u32,
        /// The schema this build migrates it to.
        to: u32,
    },
    /// A load refuses it: another application's or a newer schema (left untouched), or no
    /// migration path (moved aside).
    Refused {
        /// The schema as stored.
        schema: u32,
        /// Why.
        error: MigrateError,
    },
}

impl GateVerdict {
    /// The verdict of `registry` (if any) for a file of `app` at `schema`.
    pub fn of(registry: Option<&Migrations>, app: &str, schema: u32) -> Self {
        let Some(registry) = registry.filter(|r| r.app() == app) else {
            return GateVerdict::Unknown {
                app: app.to_owned(),
                schema,
            };
        };
        match (registry.gate(app, schema), registry.check(app, schema)) {
            (_, Err(error)) => GateVerdict::Refused { schema, error },
            (Gate::Older(from), Ok(())) => GateVerdict::Migrates {
                from,
                to: registry.current(),
            },
            _ => GateVerdict::Current { schema },
        }
    }
}

impl std::fmt::Display for GateVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GateVerdict::Unknown { app, schema } => write!(
                f,
                "as stored, {app} schema {schema}; this build knows no migrations of {app}"
            ),
            GateVerdict::Current { schema } => {
                write!(f, "as stored, schema {schema}; current for this build")
            }
            GateVerdict::Migrates { from, to } => {
                write!(
                    f,
                    "as stored, schema {from}; this build migrates it to {to}"
                )
            }
            GateVerdict::Refused { schema, error } => {
                write!(
                    f,
                    "as stored, schema {schema}; this build refuses it: {error}"
                )
            }
        }
    }
}

impl Inspection {
    /// Turns [`Inspection::data`] into the entries as this build reads them: a file that a
    /// load migrates ([`GateVerdict::Migrates`]) is passed through `registry`'s steps, as a
    /// load would (the file is not changed). Returns what the steps did, or `None` when there
    /// was nothing to migrate (current, unknown or refused: the data stays as stored, and
    /// [`Inspection::gate`] says which).
    pub fn migrate_in_memory(
        &mut self,
        registry: &Migrations,
        limits: &Limits,
    ) -> Result<Option<cache_migrate::Report>, MigrateError> {
        let Some(GateVerdict::Migrates { from, .. }) = self.gate else {
            return Ok(None);
        };
        let Some(app) = self.snapshot.header.as_ref().map(|h| h.app.clone()) else {
            return Ok(None);
        };
        let bytes = cache_format::encode_payload(&self.data);
        let up =
            cache_migrate::upgrade(registry, FormatVersion::CURRENT, &app, from, &bytes, limits)?;
        self.data = up.data;
        Ok(up.report)
    }
}

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

fn inspect_once(
    paths: &Paths,
    limits: &Limits,
    registry: Option<&Migrations>,
) -> Result<Inspection, StoreError> {
    let path = &paths.snapshot;
    let mut out = Inspection {
        path: paths.snapshot.clone(),
        journal_path: paths.journal.clone(),
        snapshot: SnapshotInfo::default(),
        journal: JournalInfo::default(),
        data: CacheData::new(),
        problems: Vec::new(),
        notes: Vec::new(),
        gate: None,
    };
    let mut generation = None;
    if let Some(bytes) = read(&paths.snapshot, limits, &mut out.problems)? {
        out.snapshot.bytes = Some(bytes.len() as u64);
        match read_snapshot(&bytes, limits) {
            Ok(snap) => {
                out.snapshot.format = Some(snap.format);
                generation = Some(snap.header.generation);
                out.gate = Some(GateVerdict::of(
                    registry,
                    &snap.header.app,
                    snap.header.schema,
                ));
                match decode_snapshot(&snap) {
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
        Ok(_) => {
            let Some(file) = crate::fsio::open_regular(path)? else {
                return Ok(None);
            };
            // Bounded by the bytes actually read, not by what the metadata said.
            let mut bytes = Vec::new();
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
