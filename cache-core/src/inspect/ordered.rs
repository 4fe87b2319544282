//! Every entry of an inspected cache in table-key order (scope fingerprint, namespace hash,
//! key fingerprint), as an iterator: what commands that walk two or more caches side by side
//! (`diff`, `merge`) and writers of new tables read. A table is walked a block at a time with
//! its journal's records merged in (held sorted: the journal is bounded); a file of an older
//! format, or one migrated in memory, is sorted whole.

use std::sync::Arc;

use cache_format::table::{Cursor, Directory, TKey};
use cache_format::{Entry, Scope};

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
            let table = match (t.directory(), t.cursor(&TKey([0; 48]))) {
                (Ok(dir), Ok(cursor)) => Some(TableWalk {
                    t,
                    dir,
                    cursor,
                    next: None,
                }),
                (Err(e), _) | (_, Err(e)) => {
                    problems.push(format!("{path}: {e}"));
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

    /// The table's next readable entry, kept as `next` until taken.
    fn peek_table(&mut self) -> Option<&KeyedEntry> {
        let walk = self.table.as_mut()?;
        while walk.next.is_none() {
            let (key, r) = match walk.cursor.next_ref()? {
                Ok(item) => item,
                Err(e) => {
                    self.problems.push(format!("{}: {e}", self.path));
                    return None;
                }
            };
            let (Some(ns), Some(s)) = (
                walk.dir.names.get(&key.namespace()),
                walk.dir.scopes.get(&key.scope()),
            ) else {
                continue;
            };
            let read = walk
                .t
                .entry_bytes(&r)
                .and_then(|b| Ok(walk.t.decode_entry(&key, ns, &b)?));
            match read {
                Ok(e) => walk.next = Some((key, s.scope.clone(), ns.clone(), e)),
                Err(e) => self.problems.push(format!(
                    "{}: the entry {} of namespace {ns:?} at offset {}: {e}",
                    self.path,
                    key.key(),
                    r.offset
                )),
            }
        }
        walk.next.as_ref()
    }
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
