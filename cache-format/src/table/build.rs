//! Building a table from entries in key order, in one pass and in bounded memory: entries are
//! written as they come, a leaf after every 64 of them, an internal node after every 128
//! nodes below it, and at the end the directory and the first commit. The caller appends the
//! bytes it is given as they are ready, then writes slot A; the same entries always give the
//! same bytes.

use sha2::{Digest, Sha256};

use super::head::{SLOT_A, Slot, encode_head, encode_slot};
use super::node::{INTERNAL_MAX, LEAF_MAX, Node};
use super::wire::{Commit, Directory, Dropped, Rewritten};
use super::{BlockRef, TKey, namespace_hash};
use crate::error::FormatError;
use crate::model::{Entry, Scope};

/// A table being built (see the module docs).
#[derive(Debug)]
pub struct TableBuilder {
    /// Bytes ready to append, starting at `written`.
    out: Vec<u8>,
    written: u64,
    /// Records waiting for their node, per height (0: leaf records).
    levels: Vec<Vec<(TKey, BlockRef)>>,
    dir: Directory,
    entries: u64,
    live: u64,
    last: Option<TKey>,
    lineage: Option<u64>,
    digest: Sha256,
    from: Option<Rewritten>,
    dropped: Option<Dropped>,
}

impl TableBuilder {
    /// A new table of `app` at `schema`. `lineage`: the one to keep (a rewrite); `None`: the
    /// digest of the entries (a table built afresh).
    pub fn new(app: &str, schema: u32, lineage: Option<u64>) -> TableBuilder {
        let out = encode_head(app, schema);
        TableBuilder {
            written: 0,
            levels: vec![Vec::new()],
            dir: Directory::default(),
            entries: 0,
            live: 0,
            last: None,
            lineage,
            digest: Sha256::new(),
            from: None,
            dropped: None,
            out,
        }
    }

    /// Records which file and commit this table is a rewrite of.
    pub fn rewritten_from(&mut self, from: Rewritten) {
        self.from = Some(from);
    }

    /// Marks the table a rewrite that left entries out on purpose (see [`Dropped`]).
    pub fn dropped(&mut self, dropped: Dropped) {
        self.dropped = Some(dropped);
    }

    /// Whether a reader with `limits` accepts the directory of the table built so far (its
    /// scopes and namespaces within the caps): a writer checks before [`TableBuilder::finish`],
    /// so it never puts in place a table its readers refuse.
    pub fn check_caps(&self, limits: &crate::scan::Limits) -> Result<(), FormatError> {
        self.dir.check_caps(limits)
    }

    /// The table's length so far (bytes handed out and pending).
    pub fn len(&self) -> u64 {
        self.written + self.out.len() as u64
    }

    /// Whether no entry was added yet.
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// Entries added.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// Adds `entry` of namespace `ns` in `scope`, encoded.
    pub fn add_entry(&mut self, scope: &Scope, ns: &str, entry: &Entry) -> Result<(), FormatError> {
        let key = TKey::new(
            &scope.fingerprint(),
            &namespace_hash(ns),
            &entry.fingerprint(),
        );
        let mut bytes = Vec::with_capacity(256);
        crate::wire::encode_entry_into(&mut bytes, entry);
        self.add(key, scope, ns, &bytes)
    }

    /// Adds an entry's encoded bytes under `key`, which must be greater than every key added
    /// before and made of `scope`'s fingerprint and `ns`'s hash.
    pub fn add(
        &mut self,
        key: TKey,
        scope: &Scope,
        ns: &str,
        entry: &[u8],
    ) -> Result<(), FormatError> {
        if self.last.is_some_and(|last| last >= key) {
            return Err(FormatError::invalid(
                "table",
                format!("entries out of key order ({key:?})"),
            ));
        }
        if key.scope() != scope.fingerprint() || key.namespace() != namespace_hash(ns) {
            return Err(FormatError::invalid(
                "table",
                format!("the key {key:?} is not of scope {scope} and namespace {ns:?}"),
            ));
        }
        self.last = Some(key);
        self.digest.update(key.0);
        self.digest.update(entry);
        let r = self.append(entry);
        self.dir.add(scope, &key.namespace(), ns, 1);
        self.entries += 1;
        self.push(0, key, r);
        Ok(())
    }

    fn append(&mut self, bytes: &[u8]) -> BlockRef {
        let r = BlockRef::of(self.len(), bytes);
        self.out.extend_from_slice(bytes);
        self.live += bytes.len() as u64;
        r
    }

    /// Adds a record at `height` (0: an entry's), writing the nodes that fill up.
    fn push(&mut self, height: usize, key: TKey, r: BlockRef) {
        if self.levels.len() <= height {
            self.levels.push(Vec::new());
        }
        self.levels[height].push((key, r));
        let max = if height == 0 { LEAF_MAX } else { INTERNAL_MAX };
        if self.levels[height].len() == max {
            self.flush_level(height);
        }
    }

    fn flush_level(&mut self, height: usize) {
        let records = std::mem::take(&mut self.levels[height]);
        let first = records[0].0;
        let node = Node {
            height: height as u8,
            records,
        };
        let r = self.append(&node.encode());
        self.push(height + 1, first, r);
    }

    /// The bytes ready to append if there are at least `at_least` of them (else none).
    pub fn take_output_if(&mut self, at_least: usize) -> Vec<u8> {
        if self.out.len() < at_least.max(1) {
            return Vec::new();
        }
        self.take_output()
    }

    /// Bytes ready to append now (the caller writes them in order).
    pub fn take_output(&mut self) -> Vec<u8> {
        let out = std::mem::take(&mut self.out);
        self.written += out.len() as u64;
        out
    }

    /// Ends the table: the last nodes, the directory and the first commit. Returns the bytes
    /// still to append and the 64 bytes of slot A, to write at [`SLOT_A`] once they are.
    pub fn finish(mut self) -> (Vec<u8>, [u8; 64], Commit) {
        let mut height = 0;
        let root = loop {
            let above_empty = self.levels[height + 1..].iter().all(Vec::is_empty);
            let here = self.levels[height].len();
            if here == 0 && above_empty {
                break None;
            }
            if here == 1 && above_empty && height > 0 {
                let (_, r) = self.levels[height][0];
                break Some((r, (height - 1) as u8));
            }
            if here > 0 {
                self.flush_level(height);
            }
            height += 1;
        };
        let dir = self.dir.encode();
        let dir = self.append(&dir);
        let lineage = self.lineage.unwrap_or_else(|| {
            let d = std::mem::take(&mut self.digest).finalize();
            u64::from_be_bytes(d[..8].try_into().expect("8 bytes"))
        });
        let commit = Commit {
            seq: 1,
            lineage,
            prev: None,
            root: root.map(|(r, _)| r),
            height: root.map_or(0, |(_, h)| h),
            entries: self.entries,
            dir,
            changes: None,
            live: self.live,
            from: self.from,
            dropped: self.dropped,
        };
        let bytes = commit.encode();
        let r = BlockRef::of(self.len(), &bytes);
        self.out.extend_from_slice(&bytes);
        let slot = encode_slot(&Slot { seq: 1, commit: r });
        (self.out, slot, commit)
    }
}

/// A whole table of `data` as bytes in memory (tests, small files, golden samples).
pub fn table_bytes(
    app: &str,
    schema: u32,
    lineage: Option<u64>,
    data: &crate::model::CacheData,
) -> Vec<u8> {
    let mut sorted: Vec<(TKey, &Scope, &str, &Entry)> = data
        .entries()
        .map(|(s, ns, e)| {
            (
                TKey::new(&s.fingerprint(), &namespace_hash(ns), &e.fingerprint()),
                s,
                ns,
                e,
            )
        })
        .collect();
    sorted.sort_by_key(|(key, ..)| *key);
    let mut b = TableBuilder::new(app, schema, lineage);
    for (_, s, ns, e) in sorted {
        b.add_entry(s, ns, e)
            .expect("the keys of a CacheData are distinct and of their own scopes and namespaces");
    }
    let mut bytes = b.take_output();
    let (rest, slot, _) = b.finish();
    bytes.extend_from_slice(&rest);
    bytes[SLOT_A as usize..SLOT_A as usize + 64].copy_from_slice(&slot);
    bytes
}
