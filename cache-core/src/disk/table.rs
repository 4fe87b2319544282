//! The table as the disk tier reads it: opened (its fixed start and one commit, checked
//! against the version gate), refreshed (a later commit of the same file: the keys it
//! changed), and looked up a key at a time.

use std::collections::BTreeSet;
use std::sync::Arc;

use cache_format::table::{TKey, TableError, namespace_hash};
use cache_format::{CacheData, Entry, Fingerprint, Scope};
use cache_migrate::{MigrateError, upgrade};

use super::{Base, Changed, Cursor, Disk, Event, Failure, Incoming, Loaded, TableState, View};
use crate::error::StoreError;
use crate::fsio::FileId;
use crate::tablefile::{self, TableFile};

/// How far back a refresh follows a table's commits to learn what changed; past it, every
/// key counts as changed.
const HISTORY: usize = 4096;

impl Disk {
    /// Opens the table in `file` as the cache file. `before`: what the cursor had read, to
    /// say what changed for memory.
    pub(super) fn load_table(
        &self,
        file: std::fs::File,
        before: Option<&Base>,
        inc: &mut Incoming,
    ) -> Result<Loaded, Failure> {
        let path = &self.paths.snapshot;
        let id = FileId::of(
            &file
                .metadata()
                .map_err(|e| StoreError::io("inspect", path, e))?,
        );
        let table = match tablefile::open(Arc::new(file), &self.options.limits) {
            Ok(t) => t,
            Err(TableError::Format(e @ cache_format::FormatError::NewerFormat { .. })) => {
                return Err(self.blocked(path, e.into()));
            }
            Err(TableError::Format(e) | TableError::OverCaps(e)) => {
                return Ok(Loaded::Unusable(e.into()));
            }
            Err(TableError::Io(e)) => return Err(StoreError::io("read", path, e).into()),
        };
        let (app, schema) = (table.head().app.clone(), table.head().schema);
        match self.registry.check(&app, schema) {
            Ok(()) => {}
            Err(e @ (MigrateError::Foreign { .. } | MigrateError::NewerSchema { .. })) => {
                return Err(self.blocked(path, e.into()));
            }
            Err(e) => return Ok(Loaded::Unusable(e.into())),
        }
        let table = Arc::new(table);
        if schema == self.registry.current() {
            let changed = changed_from(before, &table);
            if matches!(changed, Changed::All { faithful: true }) {
                // A rewrite of the file read before that holds all it held (a compaction).
                inc.replaced = false;
            }
            inc.view = Some(View {
                table: Some(Arc::clone(&table)),
                journal: super::JournalData::default(),
                changed,
            });
            return Ok(Loaded::Base(Base::Table(TableState {
                id,
                table,
                migrated_from: None,
            })));
        }
        // An older schema: its keys may change, so it is read whole and migrated (entry by
        // entry where the steps allow), and the next save writes it again at the current
        // schema.
        if let Some((data, report)) = super::table_migration::migrate_in_memory(
            &self.registry,
            schema,
            &table,
            &self.options.limits,
        ) {
            inc.data = data;
            inc.whole = true;
            inc.needs_rewrite = true;
            inc.events.push(Event::Migrated {
                path: path.clone(),
                report,
            });
            return Ok(Loaded::Base(Base::Table(TableState {
                id,
                table,
                migrated_from: Some(schema),
            })));
        }
        let raw = match read_whole(&table) {
            Ok(raw) => raw,
            Err(e) => return Ok(Loaded::Unusable(e.into())),
        };
        let up = match upgrade(
            &self.registry,
            cache_format::FormatVersion::V4,
            &app,
            schema,
            &cache_format::encode_payload(&raw),
            &self.options.limits,
        ) {
            Ok(up) => up,
            Err(e) => return Ok(Loaded::Unusable(e.into())),
        };
        inc.data = up.data;
        inc.whole = true;
        inc.needs_rewrite = true;
        if let Some(report) = up.report {
            inc.events.push(Event::Migrated {
                path: path.clone(),
                report,
            });
        }
        Ok(Loaded::Base(Base::Table(TableState {
            id,
            table,
            migrated_from: Some(schema),
        })))
    }

    /// The same file (inode) as the cursor's table: a newer commit, if any, and what it
    /// changed. `false`: the file's bytes are no longer a later commit of the table read (it
    /// was written over in place: another table, another schema, another format, damage), so
    /// it must be read afresh as a new file, through the gate like any open.
    pub(super) fn refresh_table(
        &self,
        cursor: &mut Cursor,
        id: FileId,
        inc: &mut Incoming,
    ) -> Result<bool, Failure> {
        let Some(Base::Table(state)) = &cursor.base else {
            return Ok(true);
        };
        let path = &self.paths.snapshot;
        let file = Arc::clone(state.table.source().file());
        let now = match tablefile::open(file, &self.options.limits) {
            Ok(t) => t,
            Err(TableError::Format(_) | TableError::OverCaps(_)) => return Ok(false),
            Err(TableError::Io(e)) => return Err(StoreError::io("read", path, e).into()),
        };
        let old = &state.table;
        if (&now.head().app, now.head().schema) != (&old.head().app, old.head().schema) {
            return Ok(false);
        }
        if now.lineage() != old.lineage() || now.commit().seq < old.commit().seq {
            // Another table written over this one's bytes: not its history.
            return Ok(false);
        }
        if state.migrated_from.is_some() || now.slot() == old.slot() {
            return Ok(true);
        }
        // Another commit under the same number, or a chain that does not pass through the
        // commit read: an older copy written over the file in place and written to since.
        match now.descends_from(&old.slot(), HISTORY) {
            Ok(Some(false)) => return Ok(false),
            Err(TableError::Io(e)) => return Err(StoreError::io("read", path, e).into()),
            Ok(_) | Err(_) => {}
        }
        let changed = match now.changes_since(old.commit().seq, HISTORY) {
            Ok(Some(keys)) => Changed::Keys(keys),
            _ => Changed::All { faithful: true },
        };
        let table = Arc::new(now);
        inc.view = Some(View {
            table: Some(Arc::clone(&table)),
            journal: cursor.journal_data.clone(),
            changed,
        });
        cursor.base = Some(Base::Table(TableState {
            id,
            table,
            migrated_from: None,
        }));
        Ok(true)
    }
}

/// What changed for memory when the table read now replaces what was read `before`.
fn changed_from(before: Option<&Base>, now: &TableFile) -> Changed {
    match before {
        None => Changed::All { faithful: true },
        Some(Base::Table(old)) => {
            // A rewrite of the same lineage that caught up with at least what this process
            // saw holds everything it held.
            let faithful = old.migrated_from.is_none()
                && now.commit().from.is_some_and(|from| {
                    from.lineage == old.table.lineage() && from.seq >= old.table.commit().seq
                });
            Changed::All { faithful }
        }
        Some(Base::Legacy(_)) => Changed::All { faithful: false },
    }
}

/// Every entry of `table`, decoded as stored (for a table at an older schema, which is then
/// migrated whole). A damaged block fails the read.
pub(crate) fn read_whole(table: &TableFile) -> Result<CacheData, cache_format::FormatError> {
    let mut data = CacheData::new();
    let report = cache_format::table::check_table(table, |scope, ns, entry| {
        data.insert(scope, ns, entry);
        std::ops::ControlFlow::Continue(())
    });
    match report.problems.first() {
        None => Ok(data),
        Some(first) => Err(cache_format::FormatError::Invalid {
            what: "table",
            detail: format!("{first} ({} problems)", report.problems.len()),
        }),
    }
}

/// The entry for key `fp` of namespace `ns` in `scope` as `view` has it: the table's (read
/// now: its path's nodes and the entry, each checked) joined with the journal's. A damaged
/// block is a miss: the error is returned beside what could be read, for the caller to
/// warn about once.
pub(crate) fn lookup(
    view: &View,
    scope: &Scope,
    ns: &str,
    fp: &Fingerprint,
) -> (Option<Entry>, Option<(TKey, TableError)>) {
    let mut found = None;
    let mut damage = None;
    if let Some(table) = &view.table {
        let key = TKey::new(&scope.fingerprint(), &namespace_hash(ns), fp);
        match table.get(&key) {
            Ok(Some(bytes)) => match table.decode_entry(&key, ns, &bytes) {
                Ok(entry) => found = Some(entry),
                Err(e) => damage = Some((key, e.into())),
            },
            Ok(None) => {}
            Err(e) => damage = Some((key, e)),
        }
    }
    if let Some(j) = view.journal.get(scope, ns, fp) {
        match &mut found {
            Some(e) => e.merge_from(&j),
            None => found = Some(j.into_owned()),
        }
    }
    (found, damage)
}

/// The keys of `scope` among `changed` as memory knows them: namespace hash and key.
pub(crate) fn scope_keys(
    changed: &BTreeSet<TKey>,
    scope: &Scope,
) -> BTreeSet<(Fingerprint, Fingerprint)> {
    let fp = scope.fingerprint();
    changed
        .range(TKey::scope_start(&fp)..)
        .take_while(|k| k.scope() == fp)
        .map(|k| (k.namespace(), k.key()))
        .collect()
}
