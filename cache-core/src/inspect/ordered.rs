//! Every entry of an inspected cache in table-key order (scope fingerprint, namespace hash,
//! key fingerprint), as an iterator: what commands that walk two or more caches side by side
//! (`diff`, `merge`) and writers of new tables read. A table is walked a block at a time with
//! its journal's records merged in (held sorted: the journal is bounded); a file of an older
//! format, or one migrated in memory, is sorted whole.

use std::collections::BTreeMap;
use std::sync::Arc;

use cache_format::table::{Cursor, Directory, TKey};
use cache_format::{Entry, Fingerprint, Scope};

use super::Inspection;
use crate::tablefile::{FileBytes, TableFile};

/// One entry with its key, scope and namespace.
pub type KeyedEntry = (TKey, Scope, String, Entry);

/// See the module docs; made by [`Inspection::in_key_order`].
#[derive(Debug)]
pub struct InKeyOrder<'a> {
    table: Option<TableWalk<'a>>,
    rest: std::iter::Peekable<std::vec::IntoIter<KeyedEntry>>,
    problems: Vec<String>,
    path: String,
}

#[derive(Debug)]
struct TableWalk<'a> {
    t: &'a TableFile,
    dir: Arc<Directory>,
    cursor: Cursor<'a, FileBytes>,
    next: Option<KeyedEntry>,
    /// Entries read, by scope and namespace hash, to say at the end how many damage cost.
    read: BTreeMap<(Fingerprint, Fingerprint), u64>,
    /// Keys the table files (read or not).
    stored: u64,
    /// Whether the walk met damage.
    damaged: bool,
    /// Whether the end of the walk was reached and said.
    ended: bool,
}

impl Inspection {
    /// Every readable entry in table-key order (see the module docs). Entries that cannot be
    /// read are skipped and said by [`InKeyOrder::problems`].
    pub fn in_key_order(&self) -> InKeyOrder<'_> {
        let path = self.path.display().to_string();
        let mut problems = Vec::new();
        let by_key = |v: &mut Vec<KeyedEntry>| v.sort_by_key(|a| a.0);
        if self.migrated.is_none()
            && let Some(t) = &self.table
        {
            let mut journal: Vec<KeyedEntry> = self
                .journal_data
                .entries()
                .map(|(s, ns, e)| {
                    (
                        TKey::of(s, ns, &e.fingerprint()),
                        s.clone(),
                        ns.to_owned(),
                        e.clone(),
                    )
                })
                .collect();
            by_key(&mut journal);
            let table = match t.directory() {
                Ok(dir) => Some(TableWalk {
                    t,
                    dir,
                    cursor: t.cursor(&TKey([0; 48])),
                    next: None,
                    read: BTreeMap::new(),
                    stored: 0,
                    damaged: false,
                    ended: false,
                }),
                Err(e) => {
                    problems.push(format!(
                        "{path}: the directory: {e}; every entry of the table is lost"
                    ));
                    None
                }
            };
            return InKeyOrder {
                table,
                rest: journal.into_iter().peekable(),
                problems,
                path,
            };
        }
        let mut all: Vec<KeyedEntry> = Vec::new();
        problems.extend(self.for_each_entry(|s, ns, e| {
            all.push((
                TKey::of(s, ns, &e.fingerprint()),
                s.clone(),
                ns.to_owned(),
                e.clone(),
            ));
            std::ops::ControlFlow::Continue(())
        }));
        by_key(&mut all);
        InKeyOrder {
            table: None,
            rest: all.into_iter().peekable(),
            problems,
            path,
        }
    }
}

impl InKeyOrder<'_> {
    /// The entries that could not be read so far, one line each.
    pub fn problems(&self) -> &[String] {
        &self.problems
    }

    /// The number of keys the table files, readable or not, walked so far.
    pub fn stored(&self) -> u64 {
        self.table.as_ref().map_or(0, |w| w.stored)
    }

    /// The table's next readable entry, kept as `next` until taken. Damage is said (a lost
    /// part of the tree once, with the keys it held; an entry that cannot be read) and the
    /// walk goes on past it; at the end, what damage cost each namespace.
    fn peek_table(&mut self) -> Option<&KeyedEntry> {
        let walk = self.table.as_mut()?;
        while walk.next.is_none() {
            let Some(item) = walk.cursor.next_ref() else {
                if !walk.ended {
                    walk.ended = true;
                    let lost = lost_counts(walk);
                    self.problems
                        .extend(lost.into_iter().map(|l| format!("{}: {l}", self.path)));
                }
                return None;
            };
            let (key, r) = match item {
                Ok(item) => item,
                Err(lost) => {
                    walk.damaged = true;
                    self.problems.push(format!("{}: {lost}", self.path));
                    continue;
                }
            };
            walk.stored += 1;
            let (Some(ns), Some(s)) = (
                walk.dir.names.get(&key.namespace()),
                walk.dir.scopes.get(&key.scope()),
            ) else {
                walk.damaged = true;
                self.problems.push(format!(
                    "{}: the entry {key:?} is of a scope or namespace the directory does not list",
                    self.path
                ));
                continue;
            };
            let read = walk
                .t
                .entry_bytes(&r)
                .and_then(|b| Ok(walk.t.decode_entry(&key, ns, &b)?));
            match read {
                Ok(e) => {
                    *walk.read.entry((key.scope(), key.namespace())).or_default() += 1;
                    walk.next = Some((key, s.scope.clone(), ns.clone(), e));
                }
                Err(e) => {
                    walk.damaged = true;
                    self.problems.push(format!(
                        "{}: the entry {} of namespace {ns:?} at offset {}: {e}",
                        self.path,
                        key.key(),
                        r.offset
                    ));
                }
            }
        }
        walk.next.as_ref()
    }
}

/// After a walk that met damage: for each namespace of each scope, how many of the entries
/// the directory counts were not read.
fn lost_counts(walk: &TableWalk<'_>) -> Vec<String> {
    if !walk.damaged {
        return Vec::new();
    }
    let mut lines = Vec::new();
    for (scope_fp, s) in &walk.dir.scopes {
        for (ns, listed) in &s.counts {
            let read = walk.read.get(&(*scope_fp, *ns)).copied().unwrap_or(0);
            if read < *listed {
                lines.push(format!(
                    "{} of the {listed} entries of namespace {:?} in scope {} could not be read",
                    listed - read,
                    walk.dir.names.get(ns).map_or("?", String::as_str),
                    s.scope
                ));
            }
        }
    }
    lines
}

impl Iterator for InKeyOrder<'_> {
    type Item = KeyedEntry;

    fn next(&mut self) -> Option<KeyedEntry> {
        let table_key = self.peek_table().map(|k| k.0);
        let rest_key = self.rest.peek().map(|k| k.0);
        match (table_key, rest_key) {
            (None, None) => None,
            (Some(t), r) if r.is_none_or(|r| t <= r) => {
                let mut item = self.table.as_mut()?.next.take()?;
                if let Some((_, _, _, j)) = self.rest.next_if(|k| k.0 == t) {
                    item.3.merge(j);
                }
                Some(item)
            }
            _ => self.rest.next(),
        }
    }
}
