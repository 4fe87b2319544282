//! Offline migration of a table at an older schema without the model: its entries walked in
//! place (every block checked), each passed through the declarative steps
//! ([`cache_migrate::EntryMigration`]) into a [`Spill`] (an index in memory, the bytes in an
//! unnamed file beside the cache past 32 MiB), the journal's records merged in, then written as
//! a new table in key order. Memory: the spill's index (about a hundred bytes an entry), not
//! the entries; the whole read took about six times the file.

use std::ops::ControlFlow;
use std::sync::Arc;

use cache_migrate::{EntryMigration, Report};

use super::{Base, Cursor, Disk, Failure, Incoming, TableState};
use crate::error::StoreError;
use crate::fsio::{self, FileId};
use crate::spill::Spill;
use crate::tablefile;

/// A migration made by [`Disk::migrate_table_streamed`], not yet written.
#[derive(Debug)]
pub(crate) struct TableMigration {
    /// The migrated entries.
    pub(crate) spill: Spill,
    /// What the steps did.
    pub(crate) report: Report,
}

impl Disk {
    /// Migrates the table entry by entry (see the module docs), for an offline migration of a
    /// large file. Only a table at an older schema of this application whose steps are all
    /// declarative takes this path; `None` for anything else, including damage in the table or
    /// its journal, keys that collide after the steps and entries a default pushed past a
    /// reader's bounds (the usual read reports each). The cursor is left as a read of that
    /// table would leave it, so writing the result keeps a backup if asked.
    pub(crate) fn migrate_table_streamed(&mut self) -> Result<Option<TableMigration>, Failure> {
        let path = self.paths.snapshot.clone();
        let Some(file) = fsio::open_regular(&path)? else {
            return Ok(None);
        };
        let meta = file
            .metadata()
            .map_err(|e| StoreError::io("inspect", &path, e))?;
        let id = FileId::of(&meta);
        let Ok(table) = tablefile::open(Arc::new(file), &self.options.limits) else {
            return Ok(None);
        };
        let (app, schema) = (table.head().app.clone(), table.head().schema);
        if schema >= self.registry.current() || self.registry.check(&app, schema).is_err() {
            return Ok(None);
        }
        let registry = Arc::clone(&self.registry);
        let Some(mut steps) = EntryMigration::new(&registry, schema) else {
            return Ok(None);
        };
        let mut spill = Spill::new(&fsio::parent_dir(&path));
        let (mut declined, mut failed) = (false, None);
        let walked = cache_format::table::check_table(&table, |scope, ns, entry| {
            match steps.migrate(ns, entry) {
                None => declined = true,
                Some(None) => return ControlFlow::Continue(()),
                Some(Some((ns, entry))) => {
                    if spill.holds(scope, &ns, &entry.fingerprint()) {
                        // Two keys became one: the view's path reports the collision.
                        declined = true;
                    } else if let Err(e) = spill.merge(scope, &ns, entry) {
                        failed = Some(e);
                    }
                }
            }
            if declined || failed.is_some() {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        if let Some(e) = failed {
            return Err(e.into());
        }
        if declined || !walked.problems.is_empty() {
            return Ok(None);
        }
        if steps.grew() && !self.within_bounds(&spill)? {
            return Ok(None);
        }
        let table = Arc::new(table);
        let mut cursor = Cursor {
            base: Some(Base::Table(TableState {
                id,
                table: Arc::clone(&table),
                migrated_from: Some(schema),
            })),
            ..Cursor::default()
        };
        // The journal's records (migrated as the usual read migrates them); any damage, or a
        // journal that cannot be used, is left to that read.
        let mut journal = Incoming::default();
        self.read_journal(&mut cursor, table.lineage(), false, &mut journal)?;
        if !journal.events.is_empty() || !journal.salvaged.is_empty() {
            return Ok(None);
        }
        for (scope, ns, entry) in journal.data.entries() {
            spill.merge(scope, ns, entry.clone())?;
        }
        self.cursor = cursor;
        Ok(Some(TableMigration {
            spill,
            report: steps.report(),
        }))
    }

    /// Whether every entry of `spill` is within a reader's bounds.
    fn within_bounds(&self, spill: &Spill) -> Result<bool, StoreError> {
        for (key, _, ns, place) in spill.in_table_order() {
            let bytes = spill.bytes(place)?;
            if cache_format::table::decode_entry(&key, ns, &bytes, &self.options.limits).is_err() {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// Every entry of `table` (at schema `from`, older than `registry`'s) migrated entry by entry
/// into the model, with the report: what a `Cache` opening it holds, without the whole-payload
/// view (about a third of the memory). `None` where the typed path declines (a step that is
/// not declarative, damage, keys that collide, an entry a default pushed past a reader's
/// bounds): the view's path then answers, and reports it.
pub(super) fn migrate_in_memory(
    registry: &cache_migrate::Migrations,
    from: u32,
    table: &crate::tablefile::TableFile,
    limits: &cache_format::Limits,
) -> Option<(cache_format::CacheData, Report)> {
    let mut steps = EntryMigration::new(registry, from)?;
    let mut out = cache_format::CacheData::new();
    let mut declined = false;
    let walked = cache_format::table::check_table(table, |scope, ns, entry| {
        match steps.migrate(ns, entry) {
            None => declined = true,
            Some(None) => {}
            Some(Some((ns, entry))) => {
                if out.get(scope, &ns, &entry.fingerprint()).is_some() {
                    declined = true;
                } else {
                    out.insert(scope, &ns, entry);
                }
            }
        }
        if declined {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    if declined || !walked.problems.is_empty() {
        return None;
    }
    if steps.grew() {
        for (scope, ns, entry) in out.entries() {
            crate::check::check_entry(scope, ns, entry, limits).ok()?;
        }
    }
    Some((out, steps.report()))
}
