//! Read-only inspection of a cache file and its journal, for `tunecache stats`, `list`,
//! `verify` and `export`: no lock, no repair, no migration, every problem listed.
//!
//! This is the one reader in cache-core that decodes without `upgrade()` (through
//! `cache_format::raw`): it shows the file as stored. It reports, as [`GateVerdict`], what the
//! version gate would do with it on load, so no one mistakes what it shows for what a load
//! would give.

use std::path::PathBuf;

use std::collections::{BTreeMap, HashSet};
use std::ops::ControlFlow;

use cache_format::raw::{
    decode_entry, entry_decodes, entry_fingerprint, walk_checked_payload, walk_payload,
};
use cache_format::{
    CacheData, Entry, Fingerprint, FormatVersion, Header, JournalHeader, Limits, Scope,
};
use cache_migrate::{Gate, MigrateError, Migrations};

mod ordered;
mod read;
mod table;

pub use ordered::{InKeyOrder, KeyedEntry};
pub use read::inspect;

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
    /// The snapshot file's bytes and where its payload (envelope and checksums verified) lies
    /// in them, walked entry by entry (a file of format 1 to 3).
    payload: Option<(Vec<u8>, std::ops::Range<usize>)>,
    /// The table (format 4), read a block at a time.
    table: Option<std::sync::Arc<crate::tablefile::TableFile>>,
    /// A file of an older format decoded whole, once [`Inspection::get`] asks.
    whole: std::sync::OnceLock<CacheData>,
    /// The entries of the current journal's records, decoded (a journal is small).
    journal_data: CacheData,
    /// Every entry, once [`Inspection::migrate_in_memory`] has turned them into what this
    /// build reads (then the payload is not walked any more).
    migrated: Option<CacheData>,
    /// The bounds the file was read with.
    limits: Limits,
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
        let bytes = cache_format::encode_payload(&self.data());
        let up =
            cache_migrate::upgrade(registry, FormatVersion::CURRENT, &app, from, &bytes, limits)?;
        self.migrated = Some(up.data);
        Ok(up.report)
    }

    fn payload_bytes(&self) -> Option<&[u8]> {
        self.payload
            .as_ref()
            .map(|(bytes, range)| &bytes[range.clone()])
    }

    /// Calls `visit` with every readable entry (the snapshot's, each merged with what the
    /// current journal records for its key, then the journal's new keys), one at a time, in
    /// constant memory beyond the journal's entries, until it returns `Break`. Returns the
    /// entries that could not be decoded, one line each (they are skipped).
    pub fn for_each_entry(
        &self,
        visit: impl FnMut(&Scope, &str, &Entry) -> ControlFlow<()>,
    ) -> Vec<String> {
        self.walk(visit).0
    }

    /// [`Inspection::for_each_entry`], also counting the entries the snapshot's payload
    /// holds (decodable or not) as it walks them.
    fn walk(
        &self,
        mut visit: impl FnMut(&Scope, &str, &Entry) -> ControlFlow<()>,
    ) -> (Vec<String>, u64) {
        if let Some(data) = &self.migrated {
            for (scope, ns, entry) in data.entries() {
                if visit(scope, ns, entry).is_break() {
                    break;
                }
            }
            return (Vec::new(), 0);
        }
        if self.table.is_some() {
            return self.walk_table(&mut visit);
        }
        let mut stored = 0u64;
        let mut problems = Vec::new();
        let mut overlaid: HashSet<(Fingerprint, String, Fingerprint)> = HashSet::new();
        let mut stopped = false;
        if let Some(payload) = self.payload_bytes() {
            let walked = walk_payload(
                payload,
                &self.limits,
                |scope, ns, bytes| match decode_entry(bytes, ns) {
                    Ok(mut entry) => {
                        stored += 1;
                        if !self.journal_data.is_empty()
                            && let Some(j) = self.journal_data.get(scope, ns, &entry.fingerprint())
                        {
                            entry.merge(j.clone());
                            overlaid.insert((
                                scope.fingerprint(),
                                ns.to_owned(),
                                entry.fingerprint(),
                            ));
                        }
                        let flow = visit(scope, ns, &entry);
                        stopped = flow.is_break();
                        flow
                    }
                    Err(e) => {
                        stored += 1;
                        problems.push(format!("{}: {e}", self.path.display()));
                        ControlFlow::Continue(())
                    }
                },
            );
            if let Err(e) = walked {
                problems.push(format!("{}: {e}", self.path.display()));
            }
        }
        if !stopped {
            for (scope, ns, entry) in self.journal_data.entries() {
                let key = (scope.fingerprint(), ns.to_owned(), entry.fingerprint());
                if !overlaid.contains(&key) && visit(scope, ns, entry).is_break() {
                    break;
                }
            }
        }
        (problems, stored)
    }

    /// How many entries each scope's namespaces hold (the snapshot's plus the journal's new
    /// keys), counted from the stored fingerprints without decoding the entries, and what
    /// stopped the count if the payload's structure is broken (one line; the counts are then
    /// those before the damage).
    pub fn counts(&self) -> (BTreeMap<Scope, BTreeMap<String, usize>>, Option<String>) {
        let mut counts: BTreeMap<Scope, BTreeMap<String, usize>> = BTreeMap::new();
        let mut add = |scope: &Scope, ns: &str, n: usize| {
            *counts
                .entry(scope.clone())
                .or_default()
                .entry(ns.to_owned())
                .or_default() += n;
        };
        if let Some(data) = &self.migrated {
            for (scope, ns, _) in data.entries() {
                add(scope, ns, 1);
            }
            return (counts, None);
        }
        if let Some(t) = &self.table {
            return self.counts_table(t);
        }
        let mut broken = None;
        // Journal keys the snapshot also holds are not new entries.
        let mut known: HashSet<(Fingerprint, String, Fingerprint)> = HashSet::new();
        if let Some(payload) = self.payload_bytes() {
            let mut run: Option<(Scope, String, usize)> = None;
            let walked = walk_payload(payload, &self.limits, |scope, ns, bytes| {
                match &mut run {
                    Some((s, n, count)) if s == scope && n == ns => *count += 1,
                    _ => {
                        if let Some((s, n, count)) = run.take() {
                            add(&s, &n, count);
                        }
                        run = Some((scope.clone(), ns.to_owned(), 1));
                    }
                }
                if !self.journal_data.is_empty()
                    && let Some(fp) = entry_fingerprint(bytes)
                    && self.journal_data.get(scope, ns, &fp).is_some()
                {
                    known.insert((scope.fingerprint(), ns.to_owned(), fp));
                }
                ControlFlow::Continue(())
            });
            if let Some((s, n, count)) = run.take() {
                add(&s, &n, count);
            }
            if let Err(e) = walked {
                broken = Some(format!("{}: {e}", self.path.display()));
            }
        }
        for (scope, ns, entry) in self.journal_data.entries() {
            if !known.contains(&(scope.fingerprint(), ns.to_owned(), entry.fingerprint())) {
                add(scope, ns, 1);
            }
        }
        (counts, broken)
    }

    /// The entries recorded for the key fingerprint `fp` in namespace `ns`, one per scope it
    /// was recorded in: only those entries are decoded.
    pub fn find(&self, ns: &str, fp: &Fingerprint) -> Vec<(Scope, Entry)> {
        self.find_checked(ns, fp).0
    }

    /// [`Inspection::find`], with a line for each entry of the key the file holds but that
    /// cannot be read (a damaged block: a miss, not an error), naming the file and the entry.
    pub fn find_checked(&self, ns: &str, fp: &Fingerprint) -> (Vec<(Scope, Entry)>, Vec<String>) {
        let mut problems = Vec::new();
        let found = self.find_inner(ns, fp, &mut problems);
        (found, problems)
    }

    fn find_inner(
        &self,
        ns: &str,
        fp: &Fingerprint,
        problems: &mut Vec<String>,
    ) -> Vec<(Scope, Entry)> {
        let mut found: Vec<(Scope, Entry)> = Vec::new();
        if let Some(data) = &self.migrated {
            for (scope, data) in data.scopes() {
                if let Some(e) = data.namespace(ns).and_then(|n| n.get(fp)) {
                    found.push((scope.clone(), e.clone()));
                }
            }
            return found;
        }
        if let Some(t) = &self.table {
            return self.find_table(t, ns, fp, problems);
        }
        if let Some(payload) = self.payload_bytes() {
            let _ = walk_payload(payload, &self.limits, |scope, name, bytes| {
                if name == ns
                    && entry_fingerprint(bytes).as_ref() == Some(fp)
                    && let Ok(entry) = decode_entry(bytes, ns)
                {
                    found.push((scope.clone(), entry));
                }
                ControlFlow::Continue(())
            });
        }
        for (scope, data) in self.journal_data.scopes() {
            if let Some(j) = data.namespace(ns).and_then(|n| n.get(fp)) {
                match found.iter_mut().find(|(s, _)| s == scope) {
                    Some((_, e)) => e.merge(j.clone()),
                    None => found.push((scope.clone(), j.clone())),
                }
            }
        }
        found
    }

    /// Whether the cache holds an entry for key `fp` of `ns` in the scope whose fingerprint is
    /// `scope`, as [`Inspection::find`] would find it, without reading the entry: one walk of
    /// the table's index (a file of an older format is decoded whole once, at the first call,
    /// and kept). For asking about many keys (say, which of a server's keys a cache lacks).
    pub fn holds(&self, scope: &Fingerprint, ns: &str, fp: &Fingerprint) -> bool {
        if let Some(data) = &self.migrated {
            return table::holds_data(data, scope, ns, fp);
        }
        if let Some(t) = &self.table {
            return self.holds_table(t, scope, ns, fp);
        }
        table::holds_data(self.whole.get_or_init(|| self.data()), scope, ns, fp)
    }

    /// The entry for key `fp` of `ns` in `scope`, if the cache has one: one lookup in a table
    /// (with the journal's records merged); a file of an older format is decoded whole once, at
    /// the first call, and kept.
    pub fn get(&self, scope: &Scope, ns: &str, fp: &Fingerprint) -> Option<Entry> {
        if let Some(data) = &self.migrated {
            return data.get(scope, ns, fp).cloned();
        }
        if let Some(t) = &self.table {
            let key = cache_format::table::TKey::of(scope, ns, fp);
            let mut found = t
                .get(&key)
                .ok()
                .flatten()
                .and_then(|b| t.decode_entry(&key, ns, &b).ok());
            if let Some(j) = self.journal_data.get(scope, ns, fp) {
                match &mut found {
                    Some(e) => e.merge(j.clone()),
                    None => found = Some(j.clone()),
                }
            }
            return found;
        }
        self.whole
            .get_or_init(|| self.data())
            .get(scope, ns, fp)
            .cloned()
    }

    /// Every readable entry, whole (for callers that need them all at once; the others walk
    /// them with [`Inspection::for_each_entry`]).
    pub fn data(&self) -> CacheData {
        if let Some(data) = &self.migrated {
            return data.clone();
        }
        let mut data = CacheData::new();
        self.for_each_entry(|scope, ns, entry| {
            data.insert(scope, ns, entry.clone());
            ControlFlow::Continue(())
        });
        data
    }

    /// Checks each stored entry as the decoder would, building it only when the quick check
    /// ([`cache_format::raw::entry_decodes`]: the written form, every rule checked in place)
    /// is not sure; counts the entries as [`Inspection::walk`] yields them (the snapshot's,
    /// then the journal's new keys). Returns the count, the problems, the entries stored and
    /// whether the payload's whole-payload checks (`check_payload`'s) were made and passed.
    fn check_stored_entries(&self) -> (usize, Vec<String>, u64, bool) {
        #[derive(Default)]
        struct Tally {
            entries: usize,
            stored: u64,
            problems: Vec<String>,
            overlaid: HashSet<(Fingerprint, String, Fingerprint)>,
            /// The walk made `check_payload`'s checks too, and they passed.
            payload_checked: bool,
        }
        let see =
            |t: &mut Tally, scope: &Scope, ns: &str, bytes: &[u8], fp: Option<Fingerprint>| {
                t.stored += 1;
                let fp = match fp {
                    Some(fp) => fp,
                    None => match decode_entry(bytes, ns) {
                        Ok(entry) => entry.fingerprint(),
                        Err(e) => {
                            t.problems.push(format!("{}: {e}", self.path.display()));
                            return ControlFlow::Continue(());
                        }
                    },
                };
                t.entries += 1;
                if !self.journal_data.is_empty() && self.journal_data.get(scope, ns, &fp).is_some()
                {
                    t.overlaid.insert((scope.fingerprint(), ns.to_owned(), fp));
                }
                ControlFlow::Continue(())
            };
        let mut t = Tally::default();
        if let Some(payload) = self.payload_bytes() {
            // One pass over the written (map) form, checking each entry and what
            // `check_payload` checks as it goes; anything else, damage included, is walked
            // again the general way, which names the problem.
            let fast = walk_checked_payload(payload, &self.limits, |scope, ns, bytes, facts| {
                see(&mut t, scope, ns, bytes, facts.map(|f| f.fingerprint))
            });
            t.payload_checked = fast.is_ok();
            if fast.is_err() {
                t = Tally::default();
                let walked = walk_payload(payload, &self.limits, |scope, ns, bytes| {
                    see(&mut t, scope, ns, bytes, entry_decodes(bytes))
                });
                if let Err(e) = walked {
                    t.problems.push(format!("{}: {e}", self.path.display()));
                }
            }
        }
        for (scope, ns, entry) in self.journal_data.entries() {
            if !t
                .overlaid
                .contains(&(scope.fingerprint(), ns.to_owned(), entry.fingerprint()))
            {
                t.entries += 1;
            }
        }
        (t.entries, t.problems, t.stored, t.payload_checked)
    }

    /// Decodes every entry and lists what is wrong with them: entries that do not decode, and
    /// a header whose entry count is not the payload's. What `verify` checks beyond the files'
    /// framing, in constant memory. Returns the number of readable entries too.
    pub fn check_entries(&self) -> (usize, Vec<String>) {
        if self.migrated.is_none()
            && let Some(t) = &self.table
        {
            return self.check_table(t);
        }
        let (entries, mut problems, stored, payload_checked) = if self.migrated.is_some() {
            let mut entries = 0usize;
            let (problems, stored) = self.walk(|_, _, _| {
                entries += 1;
                ControlFlow::Continue(())
            });
            (entries, problems, stored, false)
        } else {
            self.check_stored_entries()
        };
        if let (Some(payload), Some(header)) = (self.payload_bytes(), &self.snapshot.header) {
            // The whole-payload checks a loading reader makes (structure, nesting, the caps),
            // unless the walk over the entries made them already.
            if !payload_checked && let Err(e) = cache_format::check_payload(payload, &self.limits) {
                problems.push(format!("{}: {e}", self.path.display()));
            }
            if stored != header.entries {
                problems.push(format!(
                    "{}: the header counts {} entries, the payload holds {stored}",
                    self.path.display(),
                    header.entries
                ));
            }
        }
        (entries, problems)
    }
}
