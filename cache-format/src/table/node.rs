//! Tree nodes: a 4-byte header, then records of a 48-byte key and a 16-byte block reference.
//!
//! ```text
//! kind: u8 ('L' leaf, 'I' internal)   height: u8 (0 for leaves)   count: u16 BE
//! count × [ key: 48 bytes | offset: u64 BE | len: u32 BE | crc: u32 BE ]
//! ```
//!
//! A leaf's records point at entries; an internal node's at its children, each under the
//! smallest key of the child's subtree (the first record's key routes nothing: every key
//! smaller than the second record's goes to the first child). Keys are strictly ascending.

use super::{BlockRef, TKey};
use crate::error::FormatError;

/// Most records in a leaf (a 4 KiB node).
pub(crate) const LEAF_MAX: usize = 64;
/// Most records in an internal node (an 8 KiB node).
pub(crate) const INTERNAL_MAX: usize = 128;
/// The tallest tree a reader follows (a leaf is height 0): 128⁹ × 64 entries is far beyond any
/// cache; a taller claim is damage.
pub(crate) const MAX_HEIGHT: u8 = 10;
/// The largest node block.
pub(crate) const NODE_MAX_BYTES: usize = 4 + INTERNAL_MAX * RECORD_LEN;

pub(crate) const RECORD_LEN: usize = 64;
const LEAF: u8 = b'L';
const INTERNAL: u8 = b'I';

/// A decoded node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Node {
    /// 0 for a leaf.
    pub(crate) height: u8,
    pub(crate) records: Vec<(TKey, BlockRef)>,
}

impl Node {
    pub(crate) fn is_leaf(&self) -> bool {
        self.height == 0
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + self.records.len() * RECORD_LEN);
        out.push(if self.is_leaf() { LEAF } else { INTERNAL });
        out.push(self.height);
        out.extend_from_slice(&(self.records.len() as u16).to_be_bytes());
        for (key, r) in &self.records {
            out.extend_from_slice(&key.0);
            out.extend_from_slice(&r.offset.to_be_bytes());
            out.extend_from_slice(&r.len.to_be_bytes());
            out.extend_from_slice(&r.crc.to_be_bytes());
        }
        out
    }

    /// Decodes a node whose checksum was verified; `at` names it in errors.
    pub(crate) fn decode(bytes: &[u8], at: u64) -> Result<Node, FormatError> {
        let bad = |detail: String| FormatError::Malformed {
            what: "tree node",
            offset: at,
            detail,
        };
        if bytes.len() < 4 {
            return Err(bad("shorter than a node header".into()));
        }
        let (kind, height) = (bytes[0], bytes[1]);
        let count = usize::from(u16::from_be_bytes([bytes[2], bytes[3]]));
        let max = match kind {
            LEAF if height == 0 => LEAF_MAX,
            INTERNAL if (1..=MAX_HEIGHT).contains(&height) => INTERNAL_MAX,
            _ => return Err(bad(format!("kind {kind:#04x} at height {height}"))),
        };
        if count == 0 || count > max {
            return Err(bad(format!("{count} records (1 to {max} allowed)")));
        }
        if bytes.len() != 4 + count * RECORD_LEN {
            return Err(bad(format!("{} bytes for {count} records", bytes.len())));
        }
        let mut records = Vec::with_capacity(count);
        for rec in bytes[4..].chunks_exact(RECORD_LEN) {
            let key = TKey(rec[..48].try_into().expect("48 bytes"));
            if records
                .last()
                .is_some_and(|(prev, _): &(TKey, BlockRef)| *prev >= key)
            {
                return Err(bad("keys out of order".into()));
            }
            records.push((
                key,
                BlockRef {
                    offset: u64::from_be_bytes(rec[48..56].try_into().expect("8 bytes")),
                    len: u32::from_be_bytes(rec[56..60].try_into().expect("4 bytes")),
                    crc: u32::from_be_bytes(rec[60..64].try_into().expect("4 bytes")),
                },
            ));
        }
        Ok(Node { height, records })
    }

    /// The index of the child whose subtree would hold `key` (internal nodes).
    pub(crate) fn route(&self, key: &TKey) -> usize {
        // The last record whose key is at most `key`; the first if none is.
        self.records
            .partition_point(|(k, _)| k <= key)
            .saturating_sub(1)
    }

    /// The record for `key` in a leaf.
    pub(crate) fn find(&self, key: &TKey) -> Option<&BlockRef> {
        self.records
            .binary_search_by(|(k, _)| k.cmp(key))
            .ok()
            .map(|i| &self.records[i].1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> TKey {
        TKey([n; 48])
    }

    fn r(n: u64) -> BlockRef {
        BlockRef {
            offset: n,
            len: 3,
            crc: 4,
        }
    }

    #[test]
    fn a_node_round_trips_and_routes() {
        let node = Node {
            height: 1,
            records: vec![(key(10), r(1)), (key(20), r(2)), (key(30), r(3))],
        };
        let back = Node::decode(&node.encode(), 0).expect("valid");
        assert_eq!(back, node);
        assert_eq!(node.route(&key(5)), 0, "below every key: the first child");
        assert_eq!(node.route(&key(10)), 0);
        assert_eq!(node.route(&key(25)), 1);
        assert_eq!(node.route(&key(200)), 2);
        let leaf = Node {
            height: 0,
            records: vec![(key(1), r(1)), (key(2), r(2))],
        };
        assert_eq!(leaf.find(&key(2)), Some(&r(2)));
        assert_eq!(leaf.find(&key(3)), None);
    }

    #[test]
    fn damaged_nodes_are_errors_not_panics() {
        let good = Node {
            height: 0,
            records: vec![(key(1), r(1)), (key(2), r(2))],
        }
        .encode();
        let mut unordered = good.clone();
        unordered[4..52].copy_from_slice(&[9; 48]);
        let mut too_tall = good.clone();
        too_tall[0] = b'I';
        too_tall[1] = 200;
        let mut empty = good.clone();
        empty[2..4].copy_from_slice(&[0, 0]);
        for bad in [
            &good[..3],
            &good[..good.len() - 1],
            &unordered[..],
            &too_tall[..],
            &empty[..],
        ] {
            assert!(Node::decode(bad, 0).is_err());
        }
    }
}
