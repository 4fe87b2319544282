//! Folding the journal into the table, under the lock: the journal's records and the batch,
//! each merged with what the table holds for its key, appended as one commit (the entries that
//! change, the nodes on their paths, a directory, the list of keys changed), synced, then the
//! slot written and synced; then the journal starts afresh. Its cost is that of the keys it
//! changes, whatever the size of the table.

use std::fs::{File, OpenOptions};
use std::sync::Arc;
use std::time::Instant;

use cache_format::table::{self as tbl, Change, Item, TableError, UpdateOutcome};
use cache_format::{CacheData, Entry, Limits};

use super::write::keyed;
use super::{Base, Disk, Event, Failure, TableState};
use crate::error::StoreError;
use crate::fsio::{self, FileId};
use crate::spill::Spill;
use crate::tablefile;

impl Disk {
    /// Folds the journal's records and `batch` into the table (see the module docs). `None`:
    /// `deadline` passed first, and nothing was written.
    pub(super) fn fold(
        &mut self,
        batch: FoldBatch<'_>,
        deadline: Option<Instant>,
    ) -> Result<Option<Vec<Event>>, Failure> {
        let state = self.cursor.table().cloned().expect("a fold needs a table");
        let journal = self.cursor.journal_data.to_data();
        let (model, spill) = match batch {
            FoldBatch::Model(data) => {
                let mut all = journal;
                all.merge(data.clone());
                (all, None)
            }
            FoldBatch::Spill(spill) => (journal, Some(spill)),
        };
        let keyed = fold_items(&model, spill);
        let items: Vec<Item<'_>> = keyed
            .iter()
            .map(|f| Item {
                key: f.key,
                scope: f.scope,
                ns: f.ns,
            })
            .collect();
        let path = self.paths.snapshot.clone();
        let (file, start) = self.open_for_fold(&state)?;
        let limits = self.options.limits;
        let mut damaged: Vec<String> = Vec::new();
        let mut decide = |i: usize, old: Result<Option<&[u8]>, &TableError>| {
            if i.is_multiple_of(256) && deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(TableError::Io(std::io::ErrorKind::TimedOut.into()));
            }
            let item = &keyed[i];
            let new = item.entry(spill, &limits)?;
            merged_change(&item.key, item.ns, &new, old, &limits, &mut damaged)
        };
        let mut at = start;
        let outcome = state.table.update(
            &items,
            &mut decide,
            &mut tablefile::appender(&file, &mut at),
        );
        let update = match outcome {
            Ok(UpdateOutcome::Changed(u)) => u,
            // Nothing changed: the journal's records are in the table already; nothing is
            // written (a re-import of the same entries changes no byte).
            Ok(UpdateOutcome::Unchanged) => return Ok(Some(Vec::new())),
            Err(TableError::Format(e)) => {
                let _ = file.set_len(start);
                // A damaged node is in the way: write everything readable as a new table.
                tracing::debug!(
                    "tunecache: a fold of {} met damage ({e}); rebuilding",
                    path.display()
                );
                let mut all = model;
                if let Some(spill) = spill {
                    all.merge(spill.to_data()?);
                }
                return self.rebuild(&all).map(Some);
            }
            // The table would hold more scopes or namespaces than a reader accepts: it stays as
            // it is ([`over_caps`] tells a writer, which keeps the entries in the journal).
            Err(TableError::OverCaps(e)) => {
                let _ = file.set_len(start).and_then(|()| file.sync_all());
                return Err(tablefile::format_error(&path, e).into());
            }
            Err(TableError::Io(e)) => {
                let _ = file.set_len(start).and_then(|()| file.sync_all());
                if e.kind() == std::io::ErrorKind::TimedOut {
                    return Ok(None);
                }
                return Err(StoreError::io("append to", &path, e).into());
            }
        };
        tablefile::finish_update(&path, &file, start, &update)?;
        drop(file);
        self.after_fold(&state)?;
        let mut events = Vec::new();
        if !damaged.is_empty() {
            events.push(Event::DamagedTable {
                path,
                problems: damaged.len(),
                first: damaged.swap_remove(0),
                kept: None,
            });
        }
        Ok(Some(events))
    }

    /// The table's file opened for writing, checked to be the one read, with whatever an
    /// interrupted append left after its last commit cut off; and where the fold appends.
    fn open_for_fold(&self, state: &TableState) -> Result<(File, u64), Failure> {
        let path = &self.paths.snapshot;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| StoreError::io("open", path, e))?;
        let meta = file
            .metadata()
            .map_err(|e| StoreError::io("inspect", path, e))?;
        if !state.id.same_file(&FileId::of(&meta)) {
            return Err(StoreError::io(
                "write",
                path,
                std::io::Error::other("the file was replaced since it was read; read again"),
            )
            .into());
        }
        let start = state.table.slot().end();
        if meta.len() > start {
            // An append cut short by a crash: nothing refers to it (we hold the lock).
            file.set_len(start)
                .map_err(|e| StoreError::io("truncate the torn tail of", path, e))?;
        }
        Ok((file, start))
    }

    /// After a fold: the cursor reads the new commit, and the journal, whose records are in
    /// the table now, goes (the next append starts a new one).
    fn after_fold(&mut self, state: &TableState) -> Result<(), Failure> {
        let path = &self.paths.snapshot;
        let table = tablefile::open(
            Arc::clone(state.table.source().file()),
            &self.options.limits,
        )
        .map_err(|e| tablefile::table_error(path, e))?;
        let id =
            FileId::of(&fsio::stat(path)?.ok_or_else(|| {
                StoreError::io("find", path, std::io::ErrorKind::NotFound.into())
            })?);
        self.cursor.base = Some(Base::Table(TableState {
            id,
            table: Arc::new(table),
            migrated_from: None,
        }));
        self.cursor.folded = self.cursor.journal.as_ref().map(|j| (j.nonce, id));
        self.remove_journal()?;
        self.cursor.journal = None;
        self.cursor.journal_data = super::JournalData::default();
        Ok(())
    }
}

/// What a fold does with one key: the table's entry (`old`) joined with `new`, unless that
/// changes nothing. An entry that cannot be read is replaced (and said in `damaged`); what is
/// written is checked as a reader would read it.
fn merged_change(
    key: &tbl::TKey,
    ns: &str,
    new: &Entry,
    old: Result<Option<&[u8]>, &TableError>,
    limits: &Limits,
    damaged: &mut Vec<String>,
) -> Result<Change, TableError> {
    let stored = match old {
        Ok(Some(bytes)) => match tbl::decode_entry(key, ns, bytes, limits) {
            Ok(e) => Some(e),
            Err(e) => {
                damaged.push(format!("the entry {} of {ns:?}: {e}", key.key()));
                None
            }
        },
        Ok(None) => None,
        Err(e) => {
            damaged.push(format!("the entry {} of {ns:?}: {e}", key.key()));
            None
        }
    };
    let merged = match &stored {
        Some(old) => {
            let mut merged = old.clone();
            merged.merge(Entry::clone(new));
            if merged == *old {
                return Ok(Change::Keep);
            }
            merged
        }
        None => Entry::clone(new),
    };
    let bytes = tbl::encode_entry(&merged);
    // What is written must be readable: an entry over a reader's bounds stays out.
    tbl::decode_entry(key, ns, &bytes, limits)?;
    Ok(Change::Put(bytes))
}

impl Disk {
    /// Whether entries taking `bytes` go into the table as a fold straight from their spill:
    /// the file is a table and they are more than the journal takes.
    pub(crate) fn takes_spill(&self, bytes: u64) -> bool {
        self.cursor.table().is_some() && bytes > self.options.compact_min_bytes
    }

    /// Folds the journal's records into the table as one commit (nothing when it has none).
    pub(crate) fn fold_journal(&mut self) -> Result<Vec<Event>, Failure> {
        if self.cursor.journal_data.is_empty() {
            return Ok(Vec::new());
        }
        Ok(self
            .fold(FoldBatch::Model(&CacheData::new()), None)?
            .expect("a fold without a deadline finishes"))
    }

    /// Whether the journal holds entries not folded into the table yet.
    pub(crate) fn journal_holds_entries(&self) -> bool {
        !self.cursor.journal_data.is_empty()
    }

    /// Folds a spill's entries (and the journal) into the table as one commit.
    pub(crate) fn fold_spilled(&mut self, spill: &Spill) -> Result<Vec<Event>, Failure> {
        Ok(self
            .fold(FoldBatch::Spill(spill), None)?
            .expect("a fold without a deadline finishes"))
    }

    /// Writes a spill's entries as the new table (a new lineage), streamed in key order, and
    /// removes the journal, under the lock.
    pub(crate) fn write_spilled(
        &mut self,
        spill: &Spill,
        events: Vec<Event>,
    ) -> Result<Vec<Event>, Failure> {
        let path = self.paths.snapshot.clone();
        let limits = self.options.limits;
        let builder = tbl::TableBuilder::new(self.registry.app(), self.registry.current(), None);
        let mut out = tablefile::NewTable::create(&path, builder)?;
        for (key, scope, ns, place) in spill.in_table_order() {
            let bytes = spill.bytes(place)?;
            tbl::decode_entry(&key, ns, &bytes, &limits)
                .map_err(|e| tablefile::format_error(&path, e))?;
            out.add(key, scope, ns, &bytes)?;
        }
        self.commit_new_table(out, events)
    }
}

/// What a fold takes in beside the journal.
#[derive(Debug, Clone, Copy)]
pub(crate) enum FoldBatch<'a> {
    /// Entries as the model (a save's batch).
    Model(&'a CacheData),
    /// Entries spilled (a large import), read one at a time.
    Spill(&'a Spill),
}

/// One key of a fold: the entry the journal (and a model batch) has for it, and where a
/// spilled batch's entry for it is.
struct FoldItem<'a> {
    key: tbl::TKey,
    scope: &'a cache_format::Scope,
    ns: &'a str,
    held: Option<&'a Entry>,
    spilled: Option<(u64, u32)>,
}

impl FoldItem<'_> {
    /// The entry this item brings: the held one joined with the spilled one.
    fn entry(&self, spill: Option<&Spill>, limits: &Limits) -> Result<Entry, TableError> {
        let spilled = match (self.spilled, spill) {
            (Some(place), Some(spill)) => {
                let bytes = spill
                    .bytes(place)
                    .map_err(|e| TableError::Io(std::io::Error::other(e.to_string())))?;
                Some(tbl::decode_entry(&self.key, self.ns, &bytes, limits)?)
            }
            _ => None,
        };
        Ok(match (self.held, spilled) {
            (Some(h), Some(mut s)) => {
                s.merge(h.clone());
                s
            }
            (Some(h), None) => h.clone(),
            (None, Some(s)) => s,
            (None, None) => unreachable!("an item brings an entry"),
        })
    }
}

/// The keys of `model` and of `spill` in key order, each once.
fn fold_items<'a>(model: &'a CacheData, spill: Option<&'a Spill>) -> Vec<FoldItem<'a>> {
    let held = keyed(model);
    let spilled = spill.map(Spill::in_table_order).unwrap_or_default();
    let mut out = Vec::with_capacity(held.len() + spilled.len());
    let (mut a, mut b) = (held.into_iter().peekable(), spilled.into_iter().peekable());
    loop {
        let take_a = match (a.peek(), b.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(x), Some(y)) => x.0 <= y.0,
        };
        if take_a {
            let (key, scope, ns, e) = a.next().expect("peeked");
            let spilled = b.next_if(|y| y.0 == key).map(|y| y.3);
            out.push(FoldItem {
                key,
                scope,
                ns,
                held: Some(e),
                spilled,
            });
        } else {
            let (key, scope, ns, place) = b.next().expect("peeked");
            out.push(FoldItem {
                key,
                scope,
                ns,
                held: None,
                spilled: Some(place),
            });
        }
    }
    out
}

/// Whether `e` is a table refused for holding more scopes or namespaces than a reader
/// accepts (a fold or a rebuild of it): the file was left as it was.
pub(crate) fn over_caps_error(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::Format {
            source: cache_format::FormatError::TooMany {
                what: "scopes" | "namespaces" | "namespaces over all scopes",
                ..
            },
            ..
        }
    )
}
