//! Reading a table: open (the fixed start and one commit), point lookups, ordered walks, and
//! the keys a run of commits changed. Every block is checked against the checksum its
//! referrer holds when it is read; nothing is read that the lookup or walk does not use.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use super::cursor::Cursor;
use super::head::{Slot, TableHead, read_head};
use super::node::{MAX_HEIGHT, NODE_MAX_BYTES, Node};
use super::wire::{COMMIT_MAX_BYTES, Commit, Directory};
use super::{BlockRef, ReadAt, TKey, checked};
use crate::error::FormatError;
use crate::model::Entry;
use crate::scan::{Limits, scan_value};

/// Why a table could not be read: its bytes are damaged or not a table (`Format`), or reading
/// them failed (`Io`: the caller's [`ReadAt`] said so; a read past the end is `Format`,
/// `Truncated`).
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// Damage, or not a table of a format this build reads.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// Reading failed.
    #[error("{0}")]
    Io(std::io::Error),
    /// An update would give the table more scopes or namespaces than its readers accept:
    /// nothing was committed.
    #[error("{0}; the table was not changed")]
    OverCaps(FormatError),
}

impl TableError {
    /// The format error, if this is one.
    pub fn as_format(&self) -> Option<&FormatError> {
        match self {
            TableError::Format(e) | TableError::OverCaps(e) => Some(e),
            TableError::Io(_) => None,
        }
    }
}

/// A commit a valid slot names that could not be read, so an older one was (see
/// [`Table::passed_over`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassedOver {
    /// Where its slot is ([`super::SLOT_A`] or [`super::SLOT_B`]).
    pub slot_at: u64,
    /// Its sequence number, as the slot says.
    pub seq: u64,
    /// Why it does not read back.
    pub problem: String,
}

/// Internal nodes kept decoded, at most this many (8 KiB each at most): enough for every
/// internal node of a million-entry table, so a lookup reads only its leaf and its entry.
const NODE_CACHE: usize = 512;

/// An open table, as of one commit. Readers share it across threads; each lookup reads its
/// own blocks. A later commit (another writer's) is seen by opening the table again.
#[derive(Debug)]
pub struct Table<R> {
    src: R,
    limits: Limits,
    head: TableHead,
    slot: Slot,
    /// Where `slot` is in the file ([`super::SLOT_A`] or [`super::SLOT_B`]).
    slot_at: u64,
    commit: Commit,
    /// The slot whose commit was found by its block (the slot fails its check).
    recovered: Option<u64>,
    /// A newer commit a valid slot names that does not read back.
    passed_over: Option<PassedOver>,
    dir: OnceLock<Arc<Directory>>,
    /// Internal nodes by offset. The lock is held only to look up or insert, never across a
    /// read.
    nodes: Mutex<HashMap<u64, Arc<Node>>>,
}

fn io_error(e: std::io::Error, what: &'static str, offset: u64, needed: u64) -> TableError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        TableError::Format(FormatError::Truncated {
            what,
            offset,
            needed,
            available: 0,
        })
    } else {
        TableError::Io(e)
    }
}

impl<R: ReadAt> Table<R> {
    /// Opens the table `src` holds: its fixed start and the newest commit whose slot and block
    /// check out (the other slot's, if the newest is damaged). Reads a few hundred bytes,
    /// whatever the number of entries.
    pub fn open(src: R, limits: &Limits) -> Result<Table<R>, TableError> {
        let size = src.size().map_err(TableError::Io)?;
        let mut want = size.min(4096);
        let head = loop {
            let mut buf = vec![0u8; want as usize];
            src.read_exact_at(&mut buf, 0)
                .map_err(|e| io_error(e, "table", 0, want))?;
            match read_head(&buf, limits)? {
                Ok(head) => break head,
                Err(needed) if needed > want && needed <= size => want = needed,
                Err(needed) => {
                    return Err(FormatError::Truncated {
                        what: "table",
                        offset: 0,
                        needed,
                        available: size,
                    }
                    .into());
                }
            }
        };
        // The size again, now that the slots are read: a fold appends its blocks before it
        // writes the slot, so every block a slot read here names lies within this size (a
        // size taken before the slots could miss a commit made in between).
        let size = src.size().map_err(TableError::Io)?;
        let mut last = None;
        let mut passed_over = None;
        for slot in head.newest_first() {
            match Self::read_commit(&src, limits, &head, &slot, size) {
                Ok(commit) => {
                    let slot_at = if head.slots[0] == Some(slot) {
                        super::SLOT_A
                    } else {
                        super::SLOT_B
                    };
                    let next =
                        super::recover::next_commit(&src, limits, &head, &slot, slot_at, size);
                    let recovered = next.as_ref().map(|(at, ..)| *at);
                    let (slot_at, slot, commit) = next.unwrap_or((slot_at, slot, commit));
                    return Ok(Table {
                        src,
                        limits: *limits,
                        head,
                        slot,
                        slot_at,
                        commit,
                        recovered,
                        passed_over,
                        dir: OnceLock::new(),
                        nodes: Mutex::new(HashMap::new()),
                    });
                }
                Err(e) => {
                    passed_over.get_or_insert_with(|| PassedOver {
                        slot_at: if head.slots[0] == Some(slot) {
                            super::SLOT_A
                        } else {
                            super::SLOT_B
                        },
                        seq: slot.seq,
                        problem: e.to_string(),
                    });
                    last = Some(e);
                }
            }
        }
        // One slot ever written, and damaged: the file's only commit, found by its block.
        if let Some((slot_at, slot, commit)) =
            super::recover::only_commit(&src, limits, &head, size)
        {
            return Ok(Table {
                src,
                limits: *limits,
                head,
                slot,
                slot_at,
                commit,
                recovered: Some(slot_at),
                passed_over,
                dir: OnceLock::new(),
                nodes: Mutex::new(HashMap::new()),
            });
        }
        Err(last.unwrap_or_else(|| {
            FormatError::invalid("table", "neither commit slot names a commit").into()
        }))
    }

    fn read_commit(
        src: &R,
        limits: &Limits,
        head: &TableHead,
        slot: &Slot,
        size: u64,
    ) -> Result<Commit, TableError> {
        let c = &slot.commit;
        if c.len > COMMIT_MAX_BYTES || c.offset < head.blocks_at || c.end() > size {
            return Err(FormatError::malformed(
                "commit",
                c.offset as usize,
                format!("a slot names {} bytes at {} of {size}", c.len, c.offset),
            )
            .into());
        }
        let bytes = read_block(src, "commit", c)?;
        let commit = Commit::decode(&bytes, limits)?;
        if commit.seq != slot.seq {
            return Err(FormatError::invalid(
                "commit",
                format!("slot {} names commit {}", slot.seq, commit.seq),
            )
            .into());
        }
        Ok(commit)
    }

    /// The fixed start: application, schema, lineage.
    pub fn head(&self) -> &TableHead {
        &self.head
    }

    /// The slot of the commit read.
    pub fn slot(&self) -> Slot {
        self.slot
    }

    /// Where the slot of the commit read is.
    pub fn slot_at(&self) -> u64 {
        self.slot_at
    }

    /// The slot (its offset) whose check fails but whose commit was found by its block and is
    /// the one read (see FORMAT.md, "Commit slots"); `None` when the slots are sound.
    pub fn recovered_slot(&self) -> Option<u64> {
        self.recovered
    }

    /// A newer commit than the one read, named by a valid slot, whose block does not read back
    /// (see FORMAT.md, "Commit slots"): damage, since a slot is written only after its commit
    /// is synced. `None` when the newest valid slot's commit is the one read.
    pub fn passed_over(&self) -> Option<&PassedOver> {
        self.passed_over.as_ref()
    }

    /// The table's lineage (see [`Commit::lineage`]).
    pub fn lineage(&self) -> u64 {
        self.commit.lineage
    }

    /// The commit read.
    pub fn commit(&self) -> &Commit {
        &self.commit
    }

    /// The bytes underneath.
    pub fn source(&self) -> &R {
        &self.src
    }

    /// The bounds it was opened with.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The directory (scopes, namespace names, counts), read at first use.
    pub fn directory(&self) -> Result<Arc<Directory>, TableError> {
        if let Some(d) = self.dir.get() {
            return Ok(Arc::clone(d));
        }
        let bytes = self.block("directory", &self.commit.dir, 64 << 20)?;
        let dir = Arc::new(Directory::decode(&bytes, &self.limits)?);
        Ok(Arc::clone(self.dir.get_or_init(|| dir)))
    }

    /// A block's bytes, checked; `max` bounds its length.
    fn block(&self, what: &'static str, r: &BlockRef, max: u64) -> Result<Vec<u8>, TableError> {
        if u64::from(r.len) > max || r.offset < self.head.blocks_at || r.end() > self.slot.end() {
            return Err(FormatError::malformed(
                what,
                r.offset as usize,
                format!(
                    "{} bytes at {} (the table ends at {})",
                    r.len,
                    r.offset,
                    self.slot.end()
                ),
            )
            .into());
        }
        read_block(&self.src, what, r)
    }

    /// The node at `r`, which must be at `height`.
    pub(crate) fn node(&self, r: &BlockRef, height: u8) -> Result<Arc<Node>, TableError> {
        if height > 0
            && let Some(n) = self
                .nodes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&r.offset)
        {
            return Ok(Arc::clone(n));
        }
        let bytes = self.block("tree node", r, NODE_MAX_BYTES as u64)?;
        let node = Node::decode(&bytes, r.offset)?;
        if node.height != height {
            return Err(FormatError::malformed(
                "tree node",
                r.offset as usize,
                format!("height {} where {height} was expected", node.height),
            )
            .into());
        }
        let node = Arc::new(node);
        if height > 0 {
            let mut cache = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
            if cache.len() >= NODE_CACHE {
                cache.clear();
            }
            cache.insert(r.offset, Arc::clone(&node));
        }
        Ok(node)
    }

    pub(crate) fn root(&self) -> Result<Option<Arc<Node>>, TableError> {
        match &self.commit.root {
            Some(r) => self.node(r, self.commit.height).map(Some),
            None => Ok(None),
        }
    }

    pub(crate) fn child(&self, parent: &Node, i: usize) -> Result<Arc<Node>, TableError> {
        self.node(&parent.records[i].1, parent.height - 1)
    }

    /// Where the entry for `key` is, if the table has it: the nodes on its path are read
    /// (internal ones are kept decoded), not the entry.
    pub fn locate(&self, key: &TKey) -> Result<Option<BlockRef>, TableError> {
        let Some(mut node) = self.root()? else {
            return Ok(None);
        };
        while !node.is_leaf() {
            let i = node.route(key);
            node = self.child(&node, i)?;
        }
        Ok(node.find(key).copied())
    }

    /// The stored bytes of the entry for `key`, checked against its checksum; `None` if the
    /// table lacks the key.
    pub fn get(&self, key: &TKey) -> Result<Option<Vec<u8>>, TableError> {
        match self.locate(key)? {
            Some(r) => self.entry_bytes(&r).map(Some),
            None => Ok(None),
        }
    }

    /// An entry's bytes, checked.
    pub fn entry_bytes(&self, r: &BlockRef) -> Result<Vec<u8>, TableError> {
        self.block("entry", r, self.limits.max_file_bytes)
    }

    /// Decodes an entry's bytes stored under `key` in namespace `ns` (named for errors): the
    /// bounded scan, the decoder's checks, and that it is the entry of the key it is filed
    /// under.
    pub fn decode_entry(&self, key: &TKey, ns: &str, bytes: &[u8]) -> Result<Entry, FormatError> {
        decode_entry_at(key, ns, bytes, &self.limits)
    }

    /// A cursor over the entries in key order, from the first key at or after `from`. It
    /// goes on past damage: a node that cannot be read, or is out of place, is one
    /// [`Lost`](super::Lost) item, and the walk carries on with the nodes after it.
    pub fn cursor(&self, from: &TKey) -> Cursor<'_, R> {
        Cursor::new(self, from)
    }

    /// Whether the commit `slot` names is this table's commit or one before it in its chain
    /// (the same block at the same place): a later commit of the table read then, not another
    /// table written over it. `None` if that history is more than `max_commits` back.
    pub fn descends_from(
        &self,
        slot: &Slot,
        max_commits: usize,
    ) -> Result<Option<bool>, TableError> {
        let mut at = self.slot.commit;
        let mut commit = self.commit.clone();
        for _ in 0..=max_commits {
            if commit.seq <= slot.seq {
                return Ok(Some(commit.seq == slot.seq && at == slot.commit));
            }
            let Some((prev, older)) = self.commit_before(&commit)? else {
                return Ok(Some(false));
            };
            at = prev;
            commit = older;
        }
        Ok(None)
    }

    /// The commit `commit` names as the one before it, and where it is; `None` for a first
    /// commit. A block over a commit's size, or a commit not older, is refused.
    fn commit_before(&self, commit: &Commit) -> Result<Option<(BlockRef, Commit)>, TableError> {
        let Some(prev) = commit.prev else {
            return Ok(None);
        };
        if prev.len > COMMIT_MAX_BYTES {
            return Err(FormatError::malformed(
                "commit",
                prev.offset as usize,
                "a previous commit over the size of a commit",
            )
            .into());
        }
        let bytes = self.block("commit", &prev, u64::from(COMMIT_MAX_BYTES))?;
        let older = Commit::decode(&bytes, &self.limits)?;
        if older.seq >= commit.seq {
            return Err(FormatError::invalid(
                "commit",
                format!(
                    "commit {} names {} as the one before it",
                    commit.seq, older.seq
                ),
            )
            .into());
        }
        Ok(Some((prev, older)))
    }

    /// The keys the commits after `seq` up to this table's wrote or removed, sorted; `None`
    /// if that history is not here to read (`seq` is from before this file's first commit, or
    /// more than `max_commits` back): a caller must then take everything as changed.
    pub fn changes_since(
        &self,
        seq: u64,
        max_commits: usize,
    ) -> Result<Option<BTreeSet<TKey>>, TableError> {
        let mut keys = BTreeSet::new();
        let mut commit = self.commit.clone();
        for _ in 0..=max_commits {
            if commit.seq == seq {
                return Ok(Some(keys));
            }
            if commit.seq < seq {
                return Ok(None);
            }
            let Some(changes) = &commit.changes else {
                return Ok(None);
            };
            let bytes = self.block("change list", changes, self.limits.max_file_bytes)?;
            keys.extend(decode_changes(&bytes, changes.offset)?);
            let Some((_, older)) = self.commit_before(&commit)? else {
                return Ok(None);
            };
            commit = older;
        }
        Ok(None)
    }
}

/// Reads the block `r` from `src` and checks it.
pub(crate) fn read_block<R: ReadAt + ?Sized>(
    src: &R,
    what: &'static str,
    r: &BlockRef,
) -> Result<Vec<u8>, TableError> {
    let mut buf = vec![0u8; r.len as usize];
    src.read_exact_at(&mut buf, r.offset)
        .map_err(|e| io_error(e, what, r.offset, u64::from(r.len)))?;
    checked(what, r, &buf)?;
    Ok(buf)
}

/// Decodes an entry's bytes filed under `key` (see [`Table::decode_entry`]).
pub(crate) fn decode_entry_at(
    key: &TKey,
    ns: &str,
    bytes: &[u8],
    limits: &Limits,
) -> Result<Entry, FormatError> {
    // An entry gets the nesting it has inside a payload (at 6: payload, scopes, scope,
    // namespaces, entry list), so what one format writes the other reads.
    if bytes.len() != scan_value(bytes, 0, "entry", limits.max_depth.saturating_sub(5))? {
        return Err(FormatError::malformed(
            "entry",
            0,
            "trailing bytes after the entry",
        ));
    }
    // The caps a payload's census applies inside an entry (its candidates, the fields of its
    // key and params): an entry a table holds is one a journal record could hold.
    crate::census::check_entry(bytes, limits)?;
    let entry = crate::stream::decode_entry(bytes, ns)?;
    if entry.candidates().len() as u64 > limits.max_candidates {
        return Err(FormatError::TooMany {
            what: "candidates of an entry",
            count: entry.candidates().len() as u64,
            limit: limits.max_candidates,
        });
    }
    if entry.fingerprint() != key.key() {
        return Err(FormatError::invalid(
            "entry",
            format!(
                "filed under key {} but holds the key {}",
                key.key(),
                entry.fingerprint()
            ),
        ));
    }
    Ok(entry)
}

/// The keys of a change-list block: a u32 count, then that many 48-byte keys, ascending.
pub(crate) fn decode_changes(bytes: &[u8], at: u64) -> Result<Vec<TKey>, FormatError> {
    let bad = |detail: &str| FormatError::Malformed {
        what: "change list",
        offset: at,
        detail: detail.to_owned(),
    };
    let count = bytes
        .get(..4)
        .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")) as usize)
        .ok_or_else(|| bad("shorter than its count"))?;
    if bytes.len() != 4 + count * 48 {
        return Err(bad("its length is not its count's"));
    }
    let keys: Vec<TKey> = bytes[4..]
        .chunks_exact(48)
        .map(|c| TKey(c.try_into().expect("48 bytes")))
        .collect();
    if keys.windows(2).any(|w| w[0] >= w[1]) {
        return Err(bad("keys out of order"));
    }
    Ok(keys)
}

/// A change-list block for `keys` (ascending, no repeats).
pub(crate) fn encode_changes<'a>(keys: impl ExactSizeIterator<Item = &'a TKey>) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + keys.len() * 48);
    out.extend_from_slice(&(keys.len() as u32).to_be_bytes());
    for k in keys {
        out.extend_from_slice(&k.0);
    }
    out
}

const _: () = assert!(MAX_HEIGHT < 16);
