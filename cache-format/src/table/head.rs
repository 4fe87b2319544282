//! The fixed start of a table: marker, version, layout, the two commit slots and the header
//! (the application and its schema, which a table keeps for life).

use serde::{Deserialize, Serialize};

use super::BlockRef;
use crate::error::FormatError;
use crate::scan::{Limits, scan_value};

/// The first 12 bytes: a msgpack array header, the `tunecache` marker and format version 4,
/// so a reader of any format learns what the file is and its version before anything else
/// (and an older build stops at the version).
pub(crate) const TABLE_PREFIX: [u8; 12] = [
    0x96, 0xa9, b't', b'u', b'n', b'e', b'c', b'a', b'c', b'h', b'e', 0x04,
];

/// Bytes 12 to 16: the layout of a format 4 file.
pub(crate) const TABLE_MAGIC: [u8; 4] = *b"TBL1";

/// Offset of commit slot A.
pub const SLOT_A: u64 = 16;
/// Offset of commit slot B.
pub const SLOT_B: u64 = 80;
/// Length of a commit slot.
pub(crate) const SLOT_LEN: usize = 64;
/// Offset of the header's length.
pub(crate) const HEADER_AT: u64 = 144;

/// One commit slot: which commit is current, as of its sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// The commit's sequence number (1 for a table's first commit).
    pub seq: u64,
    /// The commit block.
    pub commit: BlockRef,
}

impl Slot {
    /// The length of the table as of this commit: everything up to the commit block's end.
    pub fn end(&self) -> u64 {
        self.commit.end()
    }
}

/// What a table's fixed start says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableHead {
    /// The application whose schema the entries follow.
    pub app: String,
    /// The application's schema version of the entries.
    pub schema: u32,
    /// The two slots, each `None` if empty or damaged.
    pub slots: [Option<Slot>; 2],
    /// Which slots are damaged: not all zero (never written), yet failing their check (a
    /// torn write, or damage since).
    pub damaged: [bool; 2],
    /// Where blocks start: just after the header.
    pub blocks_at: u64,
}

impl TableHead {
    /// The slots, newest first.
    pub fn newest_first(&self) -> Vec<Slot> {
        let mut slots: Vec<Slot> = self.slots.iter().flatten().copied().collect();
        slots.sort_by_key(|s| std::cmp::Reverse(s.seq));
        slots
    }

    /// The offset of the slot a writer overwrites next: the one not holding the newest commit.
    pub fn next_slot(&self) -> u64 {
        match self.slots {
            [Some(a), Some(b)] if a.seq > b.seq => SLOT_B,
            [Some(_), None] => SLOT_B,
            _ => SLOT_A,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct HeaderWire {
    app: String,
    schema: u32,
}

/// Whether `prefix` (a file's first bytes) starts a table.
pub fn is_table(prefix: &[u8]) -> bool {
    prefix.len() >= 16 && prefix[..12] == TABLE_PREFIX && prefix[12..16] == TABLE_MAGIC
}

/// The bytes a new table starts with: prefix, two empty slots, the header.
pub(crate) fn encode_head(app: &str, schema: u32) -> Vec<u8> {
    let header = rmp_serde::to_vec_named(&HeaderWire {
        app: app.to_owned(),
        schema,
    })
    .expect("encoding to a Vec cannot fail");
    let mut out = Vec::with_capacity(HEADER_AT as usize + 8 + header.len());
    out.extend_from_slice(&TABLE_PREFIX);
    out.extend_from_slice(&TABLE_MAGIC);
    out.resize(HEADER_AT as usize, 0);
    out.extend_from_slice(&(header.len() as u32).to_be_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(&crc32fast::hash(&header).to_be_bytes());
    out
}

/// A slot's 64 bytes: sequence number, the commit's offset, length and CRC-32, zeros, and the
/// CRC-32 of the first 60 bytes.
pub(crate) fn encode_slot(slot: &Slot) -> [u8; SLOT_LEN] {
    let mut out = [0u8; SLOT_LEN];
    out[..8].copy_from_slice(&slot.seq.to_be_bytes());
    out[8..16].copy_from_slice(&slot.commit.offset.to_be_bytes());
    out[16..20].copy_from_slice(&slot.commit.len.to_be_bytes());
    out[20..24].copy_from_slice(&slot.commit.crc.to_be_bytes());
    let crc = crc32fast::hash(&out[..60]);
    out[60..].copy_from_slice(&crc.to_be_bytes());
    out
}

fn decode_slot(bytes: &[u8]) -> Option<Slot> {
    let crc = u32::from_be_bytes(bytes[60..64].try_into().ok()?);
    if crc32fast::hash(&bytes[..60]) != crc || bytes[24..60].iter().any(|b| *b != 0) {
        return None;
    }
    let seq = u64::from_be_bytes(bytes[..8].try_into().ok()?);
    (seq > 0).then(|| Slot {
        seq,
        commit: BlockRef {
            offset: u64::from_be_bytes(bytes[8..16].try_into().expect("8 bytes")),
            len: u32::from_be_bytes(bytes[16..20].try_into().expect("4 bytes")),
            crc: u32::from_be_bytes(bytes[20..24].try_into().expect("4 bytes")),
        },
    })
}

/// Reads a table's fixed start from `bytes` (the file's first bytes: at least 148, and the
/// header after them). `Ok(Err(needed))`: `bytes` is too short, read `needed` bytes first.
pub(crate) fn read_head(
    bytes: &[u8],
    limits: &Limits,
) -> Result<Result<TableHead, u64>, FormatError> {
    if bytes.len() < 12 || bytes[..11] != TABLE_PREFIX[..11] {
        return Err(FormatError::NotTunecache {
            what: "file",
            marker: "tunecache",
        });
    }
    crate::version::FormatVersion::from_number(u64::from(bytes[11]))?;
    let min = HEADER_AT as usize + 4;
    if bytes.len() < min {
        return Ok(Err(min as u64));
    }
    if bytes[12..16] != TABLE_MAGIC {
        return Err(FormatError::malformed(
            "table",
            12,
            "a format 4 file whose layout is not TBL1",
        ));
    }
    let len = u64::from(u32::from_be_bytes(
        bytes[min - 4..min].try_into().expect("4 bytes"),
    ));
    if len > limits.max_header_bytes {
        return Err(FormatError::TooLarge {
            what: "header",
            len,
            limit: limits.max_header_bytes,
        });
    }
    let end = min + len as usize + 4;
    if bytes.len() < end {
        return Ok(Err(end as u64));
    }
    let header = &bytes[min..min + len as usize];
    let stored = u32::from_be_bytes(bytes[end - 4..end].try_into().expect("4 bytes"));
    let computed = crc32fast::hash(header);
    if stored != computed {
        return Err(FormatError::Checksum {
            what: "header",
            stored,
            computed,
        });
    }
    scan_value(header, 0, "header", limits.max_depth)?;
    let h: HeaderWire =
        rmp_serde::from_slice(header).map_err(|e| FormatError::invalid("header", e))?;
    if h.app.is_empty() {
        return Err(FormatError::invalid("header", "empty application name"));
    }
    let raw = |at: u64| &bytes[at as usize..at as usize + SLOT_LEN];
    let slots = [decode_slot(raw(SLOT_A)), decode_slot(raw(SLOT_B))];
    let damaged = [SLOT_A, SLOT_B].map(|at| raw(at).iter().any(|b| *b != 0));
    Ok(Ok(TableHead {
        app: h.app,
        schema: h.schema,
        damaged: [
            damaged[0] && slots[0].is_none(),
            damaged[1] && slots[1].is_none(),
        ],
        slots,
        blocks_at: end as u64,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_reads_back_and_asks_for_more_bytes_when_cut() {
        let mut bytes = encode_head("app", 3);
        let slot = Slot {
            seq: 7,
            commit: BlockRef {
                offset: 1000,
                len: 50,
                crc: 9,
            },
        };
        bytes[SLOT_B as usize..SLOT_B as usize + SLOT_LEN].copy_from_slice(&encode_slot(&slot));
        let head = read_head(&bytes, &Limits::default())
            .expect("valid")
            .expect("whole");
        assert_eq!((head.app.as_str(), head.schema), ("app", 3));
        assert_eq!(head.slots, [None, Some(slot)]);
        assert_eq!(head.next_slot(), SLOT_A);
        assert_eq!(head.blocks_at, bytes.len() as u64);
        for cut in [20, 147, bytes.len() - 1] {
            assert!(matches!(
                read_head(&bytes[..cut], &Limits::default()),
                Ok(Err(_))
            ));
        }
        // A flipped bit in a slot makes that slot empty, not the file unreadable.
        bytes[SLOT_B as usize + 3] ^= 1;
        let head = read_head(&bytes, &Limits::default())
            .expect("valid")
            .expect("whole");
        assert_eq!(head.slots, [None, None]);
        assert_eq!(head.damaged, [false, true], "slot A is empty, B damaged");
    }

    #[test]
    fn a_newer_version_is_refused_by_its_number() {
        let mut bytes = encode_head("app", 1);
        bytes[11] = 0x09;
        assert!(matches!(
            read_head(&bytes, &Limits::default()),
            Err(FormatError::NewerFormat { found: 9, .. })
        ));
    }
}
