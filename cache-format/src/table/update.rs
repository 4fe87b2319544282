//! Changing a table by appending (copy-on-write): the entries a batch changes, then new
//! copies of the nodes on their paths, bottom-up, then a directory, the list of keys changed
//! and a commit. Nothing already written is touched; the caller appends the bytes, syncs,
//! writes the slot it is given, and syncs again. A batch of `k` keys writes its entries and at
//! most `k` leaves and their ancestors, whatever the size of the table.

use super::head::{SLOT_A, SLOT_B, Slot, encode_slot};
use super::node::{INTERNAL_MAX, LEAF_MAX, Node};
use super::read::{Table, TableError, encode_changes};
use super::wire::Commit;
use super::{BlockRef, ReadAt, TKey};
use crate::error::FormatError;
use crate::model::Scope;

/// One key of a batch: its table key, and its scope and namespace (for the directory, when
/// the key is new).
#[derive(Debug, Clone, Copy)]
pub struct Item<'a> {
    /// The key.
    pub key: TKey,
    /// Its scope.
    pub scope: &'a Scope,
    /// Its namespace's name.
    pub ns: &'a str,
}

/// Says what becomes of the key at an index of a batch, given its stored bytes (`Ok(None)`:
/// absent; `Err`: stored but unreadable).
pub type Decide<'a> =
    dyn FnMut(usize, Result<Option<&[u8]>, &TableError>) -> Result<Change, TableError> + 'a;

/// What becomes of one key of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Stays as it is (or stays absent).
    Keep,
    /// Gets these entry bytes.
    Put(Vec<u8>),
    /// Is removed.
    Delete,
}

/// What [`Table::update`] made: bytes to append at [`Update::at`], then the slot to write.
#[derive(Debug)]
pub struct Update {
    /// Where the bytes go: the end of the table as of the commit it was opened at.
    pub at: u64,
    /// Bytes still to append after those handed to the sink.
    pub bytes: Vec<u8>,
    /// The slot to write once the bytes are durable, and where.
    pub slot: [u8; 64],
    /// The slot's offset.
    pub slot_at: u64,
    /// The new commit.
    pub commit: Commit,
    /// Keys put or removed.
    pub changed: usize,
}

/// What [`Table::update`] did.
#[derive(Debug)]
pub enum UpdateOutcome {
    /// Nothing changed: no bytes to write.
    Unchanged,
    /// A new commit to write.
    Changed(Box<Update>),
}

/// The appended bytes of an update, handed to the sink in pieces of about this size.
const FLUSH_AT: usize = 4 << 20;

struct Writer<'s> {
    out: Vec<u8>,
    /// The table offset of `out[0]`.
    at: u64,
    sink: &'s mut dyn FnMut(&[u8]) -> std::io::Result<()>,
    live_added: u64,
    /// Internal nodes written by this update that hold one record, by offset, with it: the
    /// new root may be one, and a root with one child is replaced by the child.
    single: std::collections::HashMap<u64, BlockRef>,
}

impl Writer<'_> {
    fn append(&mut self, bytes: &[u8]) -> Result<BlockRef, TableError> {
        let r = BlockRef::of(self.at + self.out.len() as u64, bytes);
        self.out.extend_from_slice(bytes);
        self.live_added += bytes.len() as u64;
        if self.out.len() >= FLUSH_AT {
            (self.sink)(&self.out).map_err(TableError::Io)?;
            self.at += self.out.len() as u64;
            self.out.clear();
        }
        Ok(r)
    }

    fn node(&mut self, node: &Node) -> Result<(TKey, BlockRef), TableError> {
        let first = node.records[0].0;
        let r = self.append(&node.encode())?;
        if node.height > 0 && node.records.len() == 1 {
            self.single.insert(r.offset, node.records[0].1);
        }
        Ok((first, r))
    }

    /// `records` as nodes of `height`, as even as possible, none over the maximum.
    fn nodes(
        &mut self,
        height: u8,
        records: Vec<(TKey, BlockRef)>,
    ) -> Result<Vec<(TKey, BlockRef)>, TableError> {
        let max = if height == 0 { LEAF_MAX } else { INTERNAL_MAX };
        let n = records.len().div_ceil(max);
        let mut out = Vec::with_capacity(n);
        let mut rest = records.into_iter();
        for i in 0..n {
            let take = (rest.len()).div_ceil(n - i);
            let records: Vec<_> = rest.by_ref().take(take).collect();
            out.push(self.node(&Node { height, records })?);
        }
        Ok(out)
    }
}

/// Per batch: how the entry count, the directory and the live bytes move.
struct Tally<'a> {
    items: &'a [Item<'a>],
    entries: i64,
    live_removed: u64,
    changed: Vec<TKey>,
    dir: super::wire::Directory,
}

/// A subtree's new records for its parent; `None`: unchanged.
type Replaced = Option<Vec<(TKey, BlockRef)>>;

impl<R: ReadAt> Table<R> {
    /// Applies a batch: for each of `items` (ascending keys, no repeats), `decide` is given
    /// the key's index in `items` and its stored bytes (`Ok(None)`: absent; `Err`: stored but
    /// unreadable) and says what becomes of it. Appended bytes go to `sink` as they pile up
    /// (about 4 MiB at a time); the rest and the slot come back in the [`Update`].
    pub fn update(
        &self,
        items: &[Item<'_>],
        decide: &mut Decide<'_>,
        sink: &mut dyn FnMut(&[u8]) -> std::io::Result<()>,
    ) -> Result<UpdateOutcome, TableError> {
        if items.windows(2).any(|w| w[0].key >= w[1].key) {
            return Err(FormatError::invalid("update", "keys not ascending").into());
        }
        let at = self.slot().end();
        let mut w = Writer {
            out: Vec::new(),
            at,
            sink,
            live_added: 0,
            single: std::collections::HashMap::new(),
        };
        let mut t = Tally {
            items,
            entries: 0,
            live_removed: 0,
            changed: Vec::new(),
            dir: (*self.directory()?).clone(),
        };
        let commit = self.commit();
        let root = match (self.root()?, commit.root) {
            (Some(node), Some(r)) => {
                match self.update_node(&node, r, 0..items.len(), &mut t, &mut w, decide)? {
                    None => return Ok(UpdateOutcome::Unchanged),
                    Some(records) => self.grow(records, commit.height, &mut w, &mut t)?,
                }
            }
            _ => {
                let leaf = Node {
                    height: 0,
                    records: Vec::new(),
                };
                let dummy = BlockRef {
                    offset: 0,
                    len: 0,
                    crc: 0,
                };
                match self.update_leaf(&leaf, dummy, 0..items.len(), &mut t, &mut w, decide)? {
                    None => return Ok(UpdateOutcome::Unchanged),
                    Some(records) => self.grow(records, 0, &mut w, &mut t)?,
                }
            }
        };
        if t.changed.is_empty() {
            return Ok(UpdateOutcome::Unchanged);
        }
        t.dir.prune_names();
        // More scopes or namespaces than a reader accepts: refused before the commit (what was
        // appended is past the committed end, and the caller cuts it off).
        t.dir
            .check_caps(self.limits())
            .map_err(TableError::OverCaps)?;
        let dir = w.append(&t.dir.encode())?;
        t.live_removed += u64::from(commit.dir.len);
        let changes = w.append(&encode_changes(t.changed.iter()))?;
        // The change list is history, not state: it does not count as live.
        w.live_added -= u64::from(changes.len);
        let this = self.slot().commit;
        let new = Commit {
            seq: commit.seq + 1,
            lineage: commit.lineage,
            prev: Some(this),
            root: root.map(|(r, _)| r),
            height: root.map_or(0, |(_, h)| h),
            entries: commit.entries.saturating_add_signed(t.entries),
            dir,
            changes: Some(changes),
            live: (commit.live + w.live_added).saturating_sub(t.live_removed),
            from: commit.from,
            dropped: commit.dropped,
        };
        let bytes = new.encode();
        let r = BlockRef::of(w.at + w.out.len() as u64, &bytes);
        w.out.extend_from_slice(&bytes);
        let slot = encode_slot(&Slot {
            seq: new.seq,
            commit: r,
        });
        Ok(UpdateOutcome::Changed(Box::new(Update {
            at: w.at,
            bytes: w.out,
            slot,
            slot_at: if self.slot_at() == SLOT_A {
                SLOT_B
            } else {
                SLOT_A
            },
            commit: new,
            changed: t.changed.len(),
        })))
    }

    /// The root above `records` (the new top level, at `height`): new levels while there is
    /// more than one record, then down while the root has a single child. `None`: no entries.
    fn grow(
        &self,
        mut records: Vec<(TKey, BlockRef)>,
        mut height: u8,
        w: &mut Writer<'_>,
        t: &mut Tally<'_>,
    ) -> Result<Option<(BlockRef, u8)>, TableError> {
        while records.len() > 1 {
            height += 1;
            if height >= super::MAX_HEIGHT {
                return Err(FormatError::invalid("update", "the tree would grow too tall").into());
            }
            records = w.nodes(height, records)?;
        }
        let Some((_, mut root)) = records.pop() else {
            return Ok(None);
        };
        // A root with one child is that child (after removals).
        while height > 0 {
            let child = match w.single.get(&root.offset) {
                Some(child) => *child,
                None if root.offset >= self.slot().end() => break,
                None => {
                    let bytes = super::read::read_block(self.source(), "tree node", &root)?;
                    let node = Node::decode(&bytes, root.offset)?;
                    if node.records.len() != 1 {
                        break;
                    }
                    node.records[0].1
                }
            };
            t.live_removed += u64::from(root.len);
            root = child;
            height -= 1;
        }
        Ok(Some((root, height)))
    }

    fn update_node(
        &self,
        node: &Node,
        r: BlockRef,
        items: std::ops::Range<usize>,
        t: &mut Tally<'_>,
        w: &mut Writer<'_>,
        decide: &mut Decide<'_>,
    ) -> Result<Replaced, TableError> {
        if node.is_leaf() {
            return self.update_leaf(node, r, items, t, w, decide);
        }
        let mut records: Vec<(TKey, BlockRef)> = Vec::with_capacity(node.records.len() + 8);
        let mut changed = false;
        let mut start = items.start;
        for (i, rec) in node.records.iter().enumerate() {
            // The items routed to child `i`: below the next child's key.
            let end = match node.records.get(i + 1) {
                Some((next, _)) => {
                    start + t.items[start..items.end].partition_point(|it| it.key < *next)
                }
                None => items.end,
            };
            if start == end {
                records.push(*rec);
                continue;
            }
            let child = self.child(node, i)?;
            match self.update_node(&child, rec.1, start..end, t, w, decide)? {
                None => records.push(*rec),
                Some(replaced) => {
                    changed = true;
                    records.extend(replaced);
                }
            }
            start = end;
        }
        if !changed {
            return Ok(None);
        }
        t.live_removed += u64::from(r.len);
        if records.is_empty() {
            return Ok(Some(Vec::new()));
        }
        w.nodes(node.height, records).map(Some)
    }

    fn update_leaf(
        &self,
        node: &Node,
        r: BlockRef,
        items: std::ops::Range<usize>,
        t: &mut Tally<'_>,
        w: &mut Writer<'_>,
        decide: &mut Decide<'_>,
    ) -> Result<Replaced, TableError> {
        let mut records: Vec<(TKey, BlockRef)> =
            Vec::with_capacity(node.records.len() + items.len());
        let mut old = node.records.iter().peekable();
        let mut changed = false;
        for i in items {
            let item = t.items[i];
            while let Some(rec) = old.next_if(|(k, _)| *k < item.key) {
                records.push(*rec);
            }
            let stored = old.next_if(|(k, _)| *k == item.key).copied();
            let change = match &stored {
                Some((_, at)) => match self.entry_bytes(at) {
                    Ok(bytes) => decide(i, Ok(Some(&bytes)))?,
                    Err(e) => decide(i, Err(&e))?,
                },
                None => decide(i, Ok(None))?,
            };
            match (change, stored) {
                (Change::Keep, Some(rec)) => records.push(rec),
                (Change::Keep | Change::Delete, None) => {}
                (Change::Put(bytes), stored) => {
                    let new = w.append(&bytes)?;
                    records.push((item.key, new));
                    changed = true;
                    t.changed.push(item.key);
                    match stored {
                        Some((_, old)) => t.live_removed += u64::from(old.len),
                        None => {
                            t.entries += 1;
                            t.dir.add(item.scope, &item.key.namespace(), item.ns, 1);
                        }
                    }
                }
                (Change::Delete, Some((_, old))) => {
                    changed = true;
                    t.changed.push(item.key);
                    t.live_removed += u64::from(old.len);
                    t.entries -= 1;
                    t.dir.add(item.scope, &item.key.namespace(), item.ns, -1);
                }
            }
        }
        records.extend(old.copied());
        if !changed {
            return Ok(None);
        }
        if r.len > 0 {
            t.live_removed += u64::from(r.len);
        }
        if records.is_empty() {
            return Ok(Some(Vec::new()));
        }
        w.nodes(0, records).map(Some)
    }
}
