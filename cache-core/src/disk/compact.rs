//! Rewriting a table in the background (a compaction), once the bytes its folds left behind
//! outweigh what it holds: the table as of one commit is copied into a new file without the
//! lock (its blocks never change, so nobody waits for the copy), then, under the lock, the
//! commits made meanwhile are applied to the copy as one more commit and the copy is renamed
//! over the file. The lock is held only for that catch-up, whose cost is what changed during
//! the copy. The lineage is kept, so the journal goes on applying; a reader that had the old
//! file open goes on reading it. A copy that cannot be put in place (the file was replaced
//! meanwhile, the lock stayed busy, the cache is closing) is dropped, and nothing changes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cache_format::table::{self as tbl, Change, Item, TKey, TableBuilder, UpdateOutcome};

use super::{Disk, DiskOptions, Paths};
use crate::error::StoreError;
use crate::fsio::{self, FileId};
use crate::lock::CacheLock;
use crate::tablefile::{self, NewTable, TableFile};

/// How far back the catch-up follows the file's commits; past it the copy is dropped.
const CATCH_UP: usize = 1 << 16;

/// A rewrite to run (see the module docs).
#[derive(Debug)]
pub(crate) struct Compaction {
    paths: Paths,
    app: String,
    schema: u32,
    options: DiskOptions,
    table: Arc<TableFile>,
    id: FileId,
    /// The journal this process folded into `table` just before, if it did (see
    /// `tbl::Dropped::journal`).
    folded: Option<u64>,
}

/// How a compaction ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Compacted {
    /// The rewritten table is in place.
    Done {
        /// Entries a retention limit dropped.
        dropped: usize,
        /// Of them, those dropped for their age.
        by_age: usize,
    },
    /// Nothing changed, for this reason.
    Dropped(&'static str),
}

/// The entries a retention limit drops from a rewrite.
#[derive(Debug, Default)]
pub(crate) struct Drops {
    /// Their keys.
    pub(crate) keys: std::collections::HashSet<TKey>,
    /// How many of them went for their age (the rest for the size limit).
    pub(crate) by_age: usize,
    /// The estimated size of the table without them (`None`: no limit was applied).
    pub(crate) bytes_after: Option<u64>,
}

impl Disk {
    /// A rewrite of the table under `retention` whether or not one is due (`tunecache gc`):
    /// `None` when the file is not a table.
    pub(crate) fn rewrite_with(
        &self,
        retention: crate::retention::Retention,
    ) -> Option<Compaction> {
        let state = self.cursor.table()?;
        let mut options = self.options;
        options.retention = retention;
        options.compaction_budget = None;
        Some(Compaction {
            paths: self.paths.clone(),
            app: self.registry.app().to_owned(),
            schema: self.registry.current(),
            options,
            table: Arc::clone(&state.table),
            id: state.id,
            folded: self.folded_into(state),
        })
    }

    /// The nonce of the journal this process's last fold emptied, if that fold made the table
    /// as `state` holds it.
    fn folded_into(&self, state: &super::TableState) -> Option<u64> {
        let (nonce, id) = self.cursor.folded?;
        (id == state.id).then_some(nonce)
    }

    /// A rewrite of the table, if one is due: the bytes no commit refers to any more passed
    /// `ratio` times the live ones and `min_bytes` (the builder's `compaction`), or a retention
    /// limit's size is passed.
    pub(crate) fn compaction_due(&self) -> Option<Compaction> {
        let state = self.cursor.table()?;
        let t = &state.table;
        let live = t.commit().live;
        let overhead = t.head().blocks_at + u64::from(t.slot().commit.len);
        let dead = t.slot().end().saturating_sub(live + overhead);
        let o = &self.options;
        let garbage =
            dead > 0 && dead as f64 > o.compact_ratio * live as f64 && dead > o.compact_min_bytes;
        let over_size = o
            .retention
            .max_bytes
            .is_some_and(|max| live + overhead > max);
        (garbage || over_size).then(|| Compaction {
            paths: self.paths.clone(),
            app: self.registry.app().to_owned(),
            schema: self.registry.current(),
            options: self.options,
            table: Arc::clone(t),
            id: state.id,
            folded: self.folded_into(state),
        })
    }
}

impl Compaction {
    /// Entries in the table to be copied.
    pub(crate) fn entries(&self) -> u64 {
        self.table.commit().entries
    }

    /// Runs the rewrite; `stop` says to give up (the cache is closing), and `lock_timeout`
    /// bounds the wait for the lock before the catch-up.
    pub(crate) fn run(
        self,
        stop: &AtomicBool,
        lock_timeout: Duration,
    ) -> Result<Compacted, StoreError> {
        let (written, drops) = match self.copy(stop)? {
            Ok(copied) => copied,
            Err(why) => return Ok(Compacted::Dropped(why)),
        };
        let _lock = match CacheLock::acquire(&self.paths.lock, &self.paths.dir, lock_timeout) {
            Ok(lock) => lock,
            Err(StoreError::LockTimeout { .. }) => {
                return Ok(Compacted::Dropped("the lock stayed busy"));
            }
            Err(e) => return Err(e),
        };
        self.install(written, drops)
    }

    /// [`Compaction::run`] for a caller that holds the lock already (`tunecache gc`): the copy
    /// and the install, with nothing to catch up with.
    pub(crate) fn run_locked(self) -> Result<Compacted, StoreError> {
        let stop = AtomicBool::new(false);
        let (written, drops) = match self.copy(&stop)? {
            Ok(copied) => copied,
            Err(why) => return Ok(Compacted::Dropped(why)),
        };
        self.install(written, drops)
    }

    /// The copy (see the module docs), without the lock: the new file and what retention
    /// dropped from it, or why it was given up.
    fn copy(
        &self,
        stop: &AtomicBool,
    ) -> Result<Result<(tablefile::Written, Drops), &'static str>, StoreError> {
        let started = std::time::Instant::now();
        let budget = self.options.compaction_budget;
        let give_up =
            || stop.load(Ordering::Relaxed) || budget.is_some_and(|b| started.elapsed() > b);
        let closing = "the cache is closing, or the rewrite ran past its budget";
        let path = self.paths.snapshot.clone();
        let t = &self.table;
        let from = tbl::Rewritten {
            lineage: t.lineage(),
            seq: t.commit().seq,
        };
        let drops = self.retention_drops(stop)?;
        let mut builder = TableBuilder::new(&self.app, self.schema, Some(t.lineage()));
        builder.rewritten_from(from);
        if !drops.keys.is_empty() {
            builder.dropped(tbl::Dropped {
                entries: drops.keys.len() as u64,
                journal: self.folded,
            });
        }
        let mut out = NewTable::create(&path, builder)?;
        let dir = t
            .directory()
            .map_err(|e| tablefile::table_error(&path, e))?;
        for (n, item) in t.cursor(&TKey([0; 48])).enumerate() {
            if n % 4096 == 0 && give_up() {
                return Ok(Err(closing));
            }
            // A damaged block stops the copy: the next fold meets it and rewrites what is
            // readable, keeping a copy of the damage.
            let (key, r) = item.map_err(|lost| tablefile::table_error(&path, lost.error))?;
            if drops.keys.contains(&key) {
                continue;
            }
            let bytes = t
                .entry_bytes(&r)
                .map_err(|e| tablefile::table_error(&path, e))?;
            let (Some(ns), Some(s)) = (
                dir.names.get(&key.namespace()),
                dir.scopes.get(&key.scope()),
            ) else {
                return Ok(Err("an entry of a scope the directory lacks"));
            };
            out.add(key, &s.scope, ns, &bytes)?;
        }
        let written = out.written()?;
        if give_up() {
            return Ok(Err(closing));
        }
        Ok(Ok((written, drops)))
    }

    /// Under the lock: checks that the file is still the one copied, applies the commits made
    /// during the copy, and puts the copy in place.
    fn install(
        &self,
        mut written: tablefile::Written,
        drops: Drops,
    ) -> Result<Compacted, StoreError> {
        let path = &self.paths.snapshot;
        let t = &self.table;
        // The file must still be the one copied, perhaps with more commits.
        let Some(meta) = fsio::stat(path)? else {
            return Ok(Compacted::Dropped("the cache file was removed"));
        };
        if !self.id.same_file(&FileId::of(&meta)) {
            return Ok(Compacted::Dropped("the cache file was replaced meanwhile"));
        }
        let now = tablefile::open(Arc::clone(t.source().file()), &self.options.limits)
            .map_err(|e| tablefile::table_error(path, e))?;
        if now.lineage() != t.lineage() {
            return Ok(Compacted::Dropped("the cache file was rewritten in place"));
        }
        if now.commit().seq != t.commit().seq {
            let Some(changed) = now
                .changes_since(t.commit().seq, CATCH_UP)
                .map_err(|e| tablefile::table_error(path, e))?
            else {
                return Ok(Compacted::Dropped("too many commits to catch up with"));
            };
            self.catch_up(&mut written, &now, &changed)?;
        }
        written.commit()?;
        Ok(Compacted::Done {
            dropped: drops.keys.len(),
            by_age: drops.by_age,
        })
    }

    /// The keys a retention limit drops, from a first walk (each entry decoded for its time).
    pub(crate) fn retention_drops(&self, stop: &AtomicBool) -> Result<Drops, StoreError> {
        let retention = self.options.retention;
        if retention == crate::retention::Retention::default() {
            return Ok(Drops::default());
        }
        let t = &self.table;
        let path = &self.paths.snapshot;
        let dir = t.directory().map_err(|e| tablefile::table_error(path, e))?;
        let mut keys = Vec::new();
        let mut items = Vec::new();
        for (n, item) in t.cursor(&TKey([0; 48])).enumerate() {
            if n % 4096 == 0 && stop.load(Ordering::Relaxed) {
                break;
            }
            let (key, r) = item.map_err(|lost| tablefile::table_error(path, lost.error))?;
            let Some(ns) = dir.names.get(&key.namespace()) else {
                continue;
            };
            let bytes = t
                .entry_bytes(&r)
                .map_err(|e| tablefile::table_error(path, e))?;
            let Ok(entry) = t.decode_entry(&key, ns, &bytes) else {
                continue;
            };
            keys.push(key);
            items.push((key.scope(), entry.recorded_at(), u64::from(r.len)));
        }
        let fixed = t.head().blocks_at + u64::from(t.commit().dir.len) + 1024;
        let (drops, by_age, bytes_after) = crate::retention::plan_drops(&items, fixed, &retention);
        Ok(Drops {
            keys: drops.into_iter().map(|i| keys[i]).collect(),
            by_age,
            bytes_after: Some(bytes_after),
        })
    }

    /// Applies the commits made during the copy (the keys `changed`, as `now` has them) to the
    /// copy, as one more commit.
    fn catch_up(
        &self,
        written: &mut tablefile::Written,
        now: &TableFile,
        changed: &std::collections::BTreeSet<TKey>,
    ) -> Result<(), StoreError> {
        let path = &self.paths.snapshot;
        let dir = now
            .directory()
            .map_err(|e| tablefile::table_error(path, e))?;
        let file = written.file()?;
        let copy = tablefile::open(Arc::clone(&file), &self.options.limits)
            .map_err(|e| tablefile::table_error(path, e))?;
        let copy_dir = copy
            .directory()
            .map_err(|e| tablefile::table_error(path, e))?;
        let known: Vec<(TKey, cache_format::Scope, String)> = changed
            .iter()
            .filter_map(|k| {
                let scope = dir
                    .scopes
                    .get(&k.scope())
                    .or_else(|| copy_dir.scopes.get(&k.scope()))?
                    .scope
                    .clone();
                let ns = dir
                    .names
                    .get(&k.namespace())
                    .or_else(|| copy_dir.names.get(&k.namespace()))?
                    .clone();
                Some((*k, scope, ns))
            })
            .collect();
        let items: Vec<Item<'_>> = known
            .iter()
            .map(|(key, scope, ns)| Item {
                key: *key,
                scope,
                ns,
            })
            .collect();
        let mut decide =
            |i: usize, _old: Result<Option<&[u8]>, &tbl::TableError>| match now.get(&known[i].0)? {
                Some(bytes) => Ok(Change::Put(bytes)),
                None => Ok(Change::Delete),
            };
        let start = copy.slot().end();
        let mut at = start;
        let outcome = copy
            .update(
                &items,
                &mut decide,
                &mut tablefile::appender(&file, &mut at),
            )
            .map_err(|e| tablefile::table_error(path, e))?;
        if let UpdateOutcome::Changed(update) = outcome {
            tablefile::finish_update(path, &file, start, &update)?;
        }
        Ok(())
    }
}
