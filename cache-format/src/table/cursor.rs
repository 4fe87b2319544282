//! Walking a table in key order: the one walk every whole-cache command and writer uses. It
//! goes on past damage (a node that cannot be read or is out of place is one [`Lost`] item,
//! said once) and reads each node at most once, descending only into a node whose keys lie
//! within what its parent files it under, so a walk costs at most the file's size whatever
//! its bytes say.

use std::collections::HashSet;
use std::sync::Arc;

use super::node::Node;
use super::read::{Table, TableError};
use super::{BlockRef, ReadAt, TKey};
use crate::error::FormatError;

/// A part of a table's tree that a walk could not read: the node at `offset` and the keys
/// it would hold (from `from`, up to but not including `to`). Every entry under it is lost to
/// the walk; the walk goes on after it.
#[derive(Debug)]
pub struct Lost {
    /// Where the node is.
    pub offset: u64,
    /// The smallest key its parent files it under (`None`: the root).
    pub from: Option<TKey>,
    /// The key of the node after it (`None`: the end of the table).
    pub to: Option<TKey>,
    /// Why it could not be used.
    pub error: TableError,
}

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = if self.from.is_none() && self.to.is_none() {
            "the root node".to_owned()
        } else {
            "the tree node".to_owned()
        };
        write!(f, "{what} at offset {}", self.offset)?;
        match (&self.from, &self.to) {
            (Some(a), Some(b)) => write!(f, " (keys from {a:?} up to {b:?})")?,
            (Some(a), None) => write!(f, " (keys from {a:?} to the end)")?,
            (None, Some(b)) => write!(f, " (keys up to {b:?})")?,
            (None, None) => {}
        }
        write!(f, ": {}; the entries under it are lost", self.error)
    }
}

impl std::error::Error for Lost {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// One node on a cursor's path: the node, the next record to visit, and the keys its parent
/// allows under it (`lo` inclusive, `hi` exclusive).
#[derive(Debug)]
struct Frame {
    node: Arc<Node>,
    next: usize,
    hi: Option<TKey>,
}

/// A table's entries in key order (see [`Table::cursor`]): each item is a key and where its
/// entry is, or a [`Lost`] part of the tree. A walk reads each node at most once and only
/// descends into a node whose keys lie within what its parent files it under, so it costs
/// at most the file's size whatever the bytes say (a node named twice, a node naming itself
/// through a child: each is one `Lost`).
#[derive(Debug)]
pub struct Cursor<'a, R> {
    table: &'a Table<R>,
    /// Nodes are entered at the first record that can hold a key at or after this.
    from: TKey,
    stack: Vec<Frame>,
    /// Every node entered (by offset).
    seen: HashSet<u64>,
    /// Every node given out as lost (by offset): each is said once.
    reported: HashSet<u64>,
    /// A lost part found while entering a node, given out next.
    pending: Option<Lost>,
    /// Oddities that lose nothing (a node that starts after the key it is filed under).
    odd: Vec<String>,
}

impl<'a, R: ReadAt> Cursor<'a, R> {
    /// A cursor over `table` from the first key at or after `from` (see [`Table::cursor`]).
    pub(crate) fn new(table: &'a Table<R>, from: &TKey) -> Cursor<'a, R> {
        let mut cursor = Cursor {
            table,
            from: *from,
            stack: Vec::new(),
            seen: HashSet::new(),
            reported: HashSet::new(),
            pending: None,
            odd: Vec::new(),
        };
        if let Some(r) = table.commit().root {
            cursor.enter(r, table.commit().height, None, None);
        }
        cursor
    }

    /// Oddities found so far that lose no entry: a node whose first key is not the key its
    /// parent files it under (`verify` reports them).
    pub fn oddities(&self) -> &[String] {
        &self.odd
    }

    /// Reads the node at `r` (at `height`), filed under `lo` with the next sibling at `hi`,
    /// and pushes it positioned at the first record that can hold `from`; or keeps why it
    /// cannot be used as the next item.
    fn enter(&mut self, r: BlockRef, height: u8, lo: Option<TKey>, hi: Option<TKey>) {
        let lost = |error: TableError| Lost {
            offset: r.offset,
            from: lo,
            to: hi,
            error,
        };
        if self.seen.contains(&r.offset) {
            self.lose(lost(TableError::Format(FormatError::malformed(
                "tree node",
                r.offset as usize,
                "named a second time in one tree (a node has one parent)",
            ))));
            return;
        }
        self.seen.insert(r.offset);
        let node = match self.table.node(&r, height) {
            Ok(node) => node,
            Err(e) => {
                self.lose(lost(e));
                return;
            }
        };
        let (first, last) = (node.records[0].0, node.records[node.records.len() - 1].0);
        if lo.is_some_and(|lo| first < lo) || hi.is_some_and(|hi| last >= hi) {
            self.lose(lost(TableError::Format(FormatError::malformed(
                "tree node",
                r.offset as usize,
                format!(
                    "its keys {first:?} to {last:?} lie outside the range its parent files it under"
                ),
            ))));
            return;
        }
        if let Some(lo) = lo
            && first != lo
        {
            self.odd.push(format!(
                "the tree node at offset {} filed under {lo:?} starts at {first:?}",
                r.offset
            ));
        }
        let next = if node.is_leaf() {
            node.records.partition_point(|(k, _)| *k < self.from)
        } else {
            node.route(&self.from)
        };
        self.stack.push(Frame { node, next, hi });
    }

    /// Keeps `lost` as the next item, unless its node was given out before (a node named
    /// many times, as in a DAG, is said once).
    fn lose(&mut self, lost: Lost) {
        if self.reported.insert(lost.offset) {
            self.pending = Some(lost);
        }
    }

    /// The next key and its entry's place, a lost part of the tree, or `None` at the end.
    pub fn next_ref(&mut self) -> Option<Result<(TKey, BlockRef), Lost>> {
        loop {
            if let Some(lost) = self.pending.take() {
                return Some(Err(lost));
            }
            let frame = self.stack.last_mut()?;
            if frame.next >= frame.node.records.len() {
                self.stack.pop();
                continue;
            }
            let at = frame.next;
            frame.next += 1;
            let node = Arc::clone(&frame.node);
            if node.is_leaf() {
                return Some(Ok(node.records[at]));
            }
            let (lo, r) = node.records[at];
            let hi = node.records.get(at + 1).map(|(k, _)| *k).or(frame.hi);
            self.enter(r, node.height - 1, Some(lo), hi);
        }
    }
}

impl<R: ReadAt> Iterator for Cursor<'_, R> {
    type Item = Result<(TKey, BlockRef), Lost>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_ref()
    }
}
