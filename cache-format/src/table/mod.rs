//! The table file (format 4): a cache file that opens in constant time.
//!
//! A table is a copy-on-write B+tree appended to one file, in the manner of LMDB and CouchDB,
//! with LevelDB's habit of checking each block's checksum when the block is read:
//!
//! ```text
//! 0     12  96 a9 "tunecache" 04     the marker and format version, as in every format
//! 12     4  "TBL1"                   the table layout
//! 16    64  commit slot A            (the only bytes ever written twice)
//! 80    64  commit slot B
//! 144    4  header length H (u32, big-endian)
//! 148    H  header: {"app", "schema"} (msgpack), then its CRC-32 (u32)
//! ...       blocks, appended: entries, tree nodes, directories, change lists, commits
//! ```
//!
//! Opening reads the first 148 + H bytes and the commit a slot names: nothing that grows
//! with the number of entries. A lookup reads the nodes on its key's path (each checked
//! against the checksum its parent holds) and the entry (checked against the checksum its
//! leaf holds). A writer appends new blocks (never changing one already written), syncs, then
//! points the older slot at its new commit and syncs again, so a reader sees either the
//! previous commit or the new one, whole. FORMAT.md, "Table file (format 4)", is the normative
//! description; this module reads and writes it without doing any I/O itself: reads go
//! through [`ReadAt`], which the caller implements (cache-core with `pread`), and writers get
//! bytes to append.

mod build;
mod check;
mod cursor;
mod head;
mod node;
mod read;
mod recover;
mod update;
mod wire;

use sha2::{Digest, Sha256};

pub use build::{TableBuilder, table_bytes};
pub use check::{CheckReport, check_table};
pub use cursor::{Cursor, Lost};
#[allow(
    unused_imports,
    reason = "the layout's constants, for the crate's own modules"
)]
pub(crate) use head::{
    HEADER_AT, SLOT_LEN, TABLE_MAGIC, TABLE_PREFIX, TableHead, encode_head, encode_slot, read_head,
};
pub use head::{SLOT_A, SLOT_B, Slot, is_table};
#[allow(
    unused_imports,
    reason = "the node bounds, for the crate's own modules"
)]
pub(crate) use node::{INTERNAL_MAX, LEAF_MAX, MAX_HEIGHT, NODE_MAX_BYTES};
pub use read::{PassedOver, Table, TableError};
pub use update::{Change, Decide, Item, Update, UpdateOutcome};
pub use wire::{Commit, DirScope, Directory, Dropped, Rewritten};

use crate::error::FormatError;
use crate::fingerprint::Fingerprint;

/// Domain tag of namespace hashes (the middle part of a [`TKey`]).
pub const NAMESPACE_TAG: &[u8] = b"tunecache/namespace/1\0";

/// The 16-byte hash of a namespace name under which its entries are ordered in a table: the
/// first 16 bytes of SHA-256(`tunecache/namespace/1\0` + the name's UTF-8 bytes).
pub fn namespace_hash(name: &str) -> Fingerprint {
    let mut h = Sha256::new();
    h.update(NAMESPACE_TAG);
    h.update(name.as_bytes());
    let full = h.finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&full[..16]);
    Fingerprint(out)
}

/// An entry's bytes as a table stores them: the entry map, exactly as in a payload.
pub fn encode_entry(entry: &crate::model::Entry) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    crate::wire::encode_entry_into(&mut out, entry);
    out
}

/// Decodes an entry's stored bytes filed under `key` in namespace `ns`, with every check a
/// reader makes: the bounded scan (an entry gets the nesting it has inside a payload), the
/// decoder's rules, the candidate cap, and that it holds the key it is filed under. A writer
/// checks what it is about to write with it.
pub fn decode_entry(
    key: &TKey,
    ns: &str,
    bytes: &[u8],
    limits: &crate::scan::Limits,
) -> Result<crate::model::Entry, FormatError> {
    read::decode_entry_at(key, ns, bytes, limits)
}

/// Whether a table's reader accepts `bytes` as the entry filed under `key` in namespace `ns`
/// ([`decode_entry`]'s checks), without building the entry when the quick check
/// (`fastcheck`, within the bounds an entry of a payload has) can tell; otherwise the
/// decoder's answer, with its message. A writer checks what it is about to write with it.
pub fn check_entry(
    key: &TKey,
    ns: &str,
    bytes: &[u8],
    limits: &crate::scan::Limits,
) -> Result<(), FormatError> {
    let bounds = crate::fastcheck::Bounds::in_payload(limits);
    match crate::fastcheck::entry_facts_prefix(bytes, &bounds) {
        Some((facts, len)) if len == bytes.len() && facts.fingerprint == key.key() => Ok(()),
        _ => decode_entry(key, ns, bytes, limits).map(|_| ()),
    }
}

/// A table's key: the scope's fingerprint, the namespace's hash and the key's fingerprint,
/// 48 bytes compared bytewise. The entries of one scope are contiguous, and within it those
/// of one namespace.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TKey(pub [u8; 48]);

impl TKey {
    /// The key of entry `key` of namespace `ns` (its [`namespace_hash`]) in scope `scope`.
    pub fn new(scope: &Fingerprint, ns: &Fingerprint, key: &Fingerprint) -> TKey {
        let mut out = [0u8; 48];
        out[..16].copy_from_slice(&scope.0);
        out[16..32].copy_from_slice(&ns.0);
        out[32..].copy_from_slice(&key.0);
        TKey(out)
    }

    /// The key of the entry `key` of namespace `ns` in `scope`.
    pub fn of(scope: &crate::model::Scope, ns: &str, key: &Fingerprint) -> TKey {
        TKey::new(&scope.fingerprint(), &namespace_hash(ns), key)
    }

    /// The smallest key of a scope (every key of it is at least this).
    pub fn scope_start(scope: &Fingerprint) -> TKey {
        TKey::new(scope, &Fingerprint([0; 16]), &Fingerprint([0; 16]))
    }

    /// The smallest key of a scope's namespace.
    pub fn namespace_start(scope: &Fingerprint, ns: &Fingerprint) -> TKey {
        TKey::new(scope, ns, &Fingerprint([0; 16]))
    }

    /// The scope's fingerprint.
    pub fn scope(&self) -> Fingerprint {
        Fingerprint(self.0[..16].try_into().expect("16 bytes"))
    }

    /// The namespace's hash.
    pub fn namespace(&self) -> Fingerprint {
        Fingerprint(self.0[16..32].try_into().expect("16 bytes"))
    }

    /// The key's fingerprint.
    pub fn key(&self) -> Fingerprint {
        Fingerprint(self.0[32..].try_into().expect("16 bytes"))
    }
}

impl std::fmt::Debug for TKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}/{}",
            self.scope().to_hex(),
            self.namespace().to_hex(),
            self.key().to_hex()
        )
    }
}

/// Where a block is: its offset from the start of the table, its length and the CRC-32 of
/// its bytes. Whoever points at a block holds its checksum, so a block is checked against
/// what its parent expects, and a damaged block damages only what lies under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockRef {
    /// Offset from the start of the table.
    pub offset: u64,
    /// Length in bytes.
    pub len: u32,
    /// CRC-32 (zlib) of the bytes.
    pub crc: u32,
}

impl BlockRef {
    /// The reference to `bytes` written at `offset`.
    pub fn of(offset: u64, bytes: &[u8]) -> BlockRef {
        BlockRef {
            offset,
            len: u32::try_from(bytes.len()).expect("blocks are under 4 GiB"),
            crc: crc32fast::hash(bytes),
        }
    }

    /// Where the block ends.
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(u64::from(self.len))
    }
}

/// Read access to a table's bytes at any offset: a file read with `pread` (cache-core), a
/// region of one (a table inside a bundle), or bytes in memory (tests, a bundle being built).
pub trait ReadAt: Send + Sync {
    /// Fills `buf` with the bytes at `offset`; an error if they are not all there.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
    /// The number of bytes there are now.
    fn size(&self) -> std::io::Result<u64>;
}

impl ReadAt for Vec<u8> {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        read_slice(self, buf, offset)
    }
    fn size(&self) -> std::io::Result<u64> {
        Ok(self.len() as u64)
    }
}

impl ReadAt for [u8] {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        read_slice(self, buf, offset)
    }
    fn size(&self) -> std::io::Result<u64> {
        Ok(self.len() as u64)
    }
}

impl<T: ReadAt + ?Sized> ReadAt for std::sync::Arc<T> {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        (**self).read_exact_at(buf, offset)
    }
    fn size(&self) -> std::io::Result<u64> {
        (**self).size()
    }
}

fn read_slice(bytes: &[u8], buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    let start = usize::try_from(offset).map_err(std::io::Error::other)?;
    let src = start
        .checked_add(buf.len())
        .and_then(|end| bytes.get(start..end))
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
    buf.copy_from_slice(src);
    Ok(())
}

/// A block's bytes checked against its reference: the length and the CRC-32.
pub(crate) fn checked<'a>(
    what: &'static str,
    block: &BlockRef,
    bytes: &'a [u8],
) -> Result<&'a [u8], FormatError> {
    if bytes.len() as u64 != u64::from(block.len) {
        return Err(FormatError::malformed(
            what,
            block.offset as usize,
            format!("{} bytes where {} were expected", bytes.len(), block.len),
        ));
    }
    let computed = crc32fast::hash(bytes);
    if computed != block.crc {
        return Err(FormatError::Checksum {
            what,
            stored: block.crc,
            computed,
        });
    }
    Ok(bytes)
}
