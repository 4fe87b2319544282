//! Hostile tables, written from FORMAT.md ("Table file (format 4)") by hand, without the
//! project's writer: a valid table's bytes are taken, blocks appended, and a new commit made
//! current. What the writer never makes and a reader must survive: a tree whose nodes name one
//! child many times (a DAG whose naive walk visits 128^height leaves in a few kilobytes), and a
//! node that names itself with a checksum that matches (a cycle, by choosing four key bytes so
//! the node's CRC-32 is the one it holds).

use rmpv::Value;

const SLOT_A: usize = 16;
const SLOT_B: usize = 80;
const RECORD: usize = 64;

/// A block reference: offset, length, CRC-32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ref {
    /// From the start of the table.
    pub offset: u64,
    /// Bytes.
    pub len: u32,
    /// CRC-32 of the bytes.
    pub crc: u32,
}

/// A table's bytes with its current commit, to append to.
#[derive(Debug, Clone)]
pub struct Crafted {
    /// The file's bytes.
    pub bytes: Vec<u8>,
    /// The current commit's slot (`SLOT_A` or `SLOT_B` offset) and block.
    slot_at: usize,
    seq: u64,
    commit: Vec<(Value, Value)>,
}

fn be_u64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().expect("8 bytes"))
}

fn be_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().expect("4 bytes"))
}

fn field<'a>(map: &'a [(Value, Value)], name: &str) -> &'a Value {
    &map.iter()
        .find(|(k, _)| k.as_str() == Some(name))
        .unwrap_or_else(|| panic!("the commit has no {name}"))
        .1
}

fn set(map: &mut [(Value, Value)], name: &str, v: Value) {
    map.iter_mut()
        .find(|(k, _)| k.as_str() == Some(name))
        .unwrap_or_else(|| panic!("the commit has no {name}"))
        .1 = v;
}

fn ref_value(r: Ref) -> Value {
    Value::Array(vec![r.offset.into(), r.len.into(), r.crc.into()])
}

fn value_ref(v: &Value) -> Ref {
    let a = v.as_array().expect("a block reference");
    Ref {
        offset: a[0].as_u64().expect("offset"),
        len: a[1].as_u64().expect("len") as u32,
        crc: a[2].as_u64().expect("crc") as u32,
    }
}

impl Crafted {
    /// The table in `bytes` (as the project wrote it) at its newest commit.
    pub fn of(bytes: Vec<u8>) -> Crafted {
        let slot = |at: usize| {
            let s = &bytes[at..at + 64];
            let ok = crc32fast::hash(&s[..60]) == be_u32(&s[60..]) && be_u64(s) != 0;
            ok.then(|| (be_u64(s), at))
        };
        let (seq, slot_at) = [slot(SLOT_A), slot(SLOT_B)]
            .into_iter()
            .flatten()
            .max()
            .expect("a table with a commit");
        let s = &bytes[slot_at..slot_at + 64];
        let (offset, len) = (be_u64(&s[8..]) as usize, be_u32(&s[16..]) as usize);
        let commit = rmpv::decode::read_value(&mut &bytes[offset..offset + len])
            .expect("a commit block")
            .as_map()
            .expect("a map")
            .clone();
        Crafted {
            bytes,
            slot_at,
            seq,
            commit,
        }
    }

    /// The current root and its height.
    pub fn root(&self) -> (Ref, u8) {
        (
            value_ref(field(&self.commit, "root")),
            field(&self.commit, "height").as_u64().expect("height") as u8,
        )
    }

    /// The records of the node at `r`: each key and reference.
    pub fn records(&self, r: Ref) -> Vec<([u8; 48], Ref)> {
        let node = &self.bytes[r.offset as usize..r.offset as usize + r.len as usize];
        node[4..]
            .chunks_exact(RECORD)
            .map(|c| {
                (
                    c[..48].try_into().expect("48 bytes"),
                    Ref {
                        offset: be_u64(&c[48..]),
                        len: be_u32(&c[56..]),
                        crc: be_u32(&c[60..]),
                    },
                )
            })
            .collect()
    }

    /// Appends `block` and returns its reference.
    pub fn append(&mut self, block: &[u8]) -> Ref {
        let r = Ref {
            offset: self.bytes.len() as u64,
            len: block.len() as u32,
            crc: crc32fast::hash(block),
        };
        self.bytes.extend_from_slice(block);
        r
    }

    /// Makes `root` (at `height`) the tree of a new commit in the other slot.
    pub fn commit(&mut self, root: Ref, height: u8) {
        let prev_slot = &self.bytes[self.slot_at..self.slot_at + 64];
        let prev = Ref {
            offset: be_u64(&prev_slot[8..]),
            len: be_u32(&prev_slot[16..]),
            crc: be_u32(&prev_slot[20..]),
        };
        let mut commit = self.commit.clone();
        self.seq += 1;
        set(&mut commit, "seq", self.seq.into());
        set(&mut commit, "root", ref_value(root));
        set(&mut commit, "height", u64::from(height).into());
        set(&mut commit, "prev", ref_value(prev));
        set(&mut commit, "changes", Value::Nil);
        let mut block = Vec::new();
        rmpv::encode::write_value(&mut block, &Value::Map(commit.clone())).expect("encode");
        let c = self.append(&block);
        let mut slot = [0u8; 64];
        slot[..8].copy_from_slice(&self.seq.to_be_bytes());
        slot[8..16].copy_from_slice(&c.offset.to_be_bytes());
        slot[16..20].copy_from_slice(&c.len.to_be_bytes());
        slot[20..24].copy_from_slice(&c.crc.to_be_bytes());
        let crc = crc32fast::hash(&slot[..60]);
        slot[60..].copy_from_slice(&crc.to_be_bytes());
        self.slot_at = if self.slot_at == SLOT_A {
            SLOT_B
        } else {
            SLOT_A
        };
        self.bytes[self.slot_at..self.slot_at + 64].copy_from_slice(&slot);
        self.commit = commit;
    }
}

/// A node's bytes: `kind` (`b'L'` or `b'I'`), height, records.
pub fn node(kind: u8, height: u8, records: &[([u8; 48], Ref)]) -> Vec<u8> {
    let mut out = vec![kind, height];
    out.extend_from_slice(&(records.len() as u16).to_be_bytes());
    for (key, r) in records {
        out.extend_from_slice(key);
        out.extend_from_slice(&r.offset.to_be_bytes());
        out.extend_from_slice(&r.len.to_be_bytes());
        out.extend_from_slice(&r.crc.to_be_bytes());
    }
    out
}

/// The key after `k` (48 bytes, big-endian, plus one).
pub fn next_key(mut k: [u8; 48]) -> [u8; 48] {
    for b in k.iter_mut().rev() {
        let (v, carry) = b.overflowing_add(1);
        *b = v;
        if !carry {
            break;
        }
    }
    k
}

/// The table in `table` (of height 1 or more) turned into a DAG of `height` levels above its
/// first leaf: each level one internal node whose 128 records all name the level below, the
/// first leaf at the bottom. A walk that follows every record visits 128^height leaves; a
/// few kilobytes of file.
pub fn dag(table: Vec<u8>, height: u8) -> Vec<u8> {
    let mut t = Crafted::of(table);
    let (root, h) = t.root();
    assert!(h >= 1, "a table with an internal root");
    let mut below = root;
    for _ in 1..h {
        below = t.records(below)[0].1;
    }
    let leaf = t.records(below)[0].1;
    let leaf_keys = t.records(leaf);
    let first = leaf_keys[0].0;
    let mut last = leaf_keys[leaf_keys.len() - 1].0;
    let mut child = leaf;
    for level in 1..=height {
        // The first record files the level below under its own first key; the others come
        // after every key below, so the first naming lies within its record's range.
        let mut records = vec![(first, child)];
        for _ in 1..128 {
            last = next_key(last);
            records.push((last, child));
        }
        child = t.append(&node(b'I', level, &records));
    }
    t.commit(child, height);
    t.bytes
}

/// Sets `data[at..at + 4]` so that the CRC-32 (zlib) of `data` is `target` (CRC-32 is affine
/// over GF(2) in the data's bits: 32 unknown bits, 32 equations).
pub fn force_crc(data: &mut [u8], at: usize, target: u32) {
    data[at..at + 4].copy_from_slice(&[0; 4]);
    let base = crc32fast::hash(data);
    let columns: Vec<u32> = (0..32)
        .map(|bit| {
            data[at + bit / 8] = 1 << (bit % 8);
            let c = crc32fast::hash(data) ^ base;
            data[at + bit / 8] = 0;
            c
        })
        .collect();
    // Solve columns · x = target ^ base by Gaussian elimination over GF(2).
    let mut rows: Vec<(u32, u32)> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| (*c, 1u32 << i))
        .collect();
    let mut want = target ^ base;
    let mut x = 0u32;
    for bit in (0..32).rev() {
        let Some(p) = rows.iter().position(|(c, _)| c >> bit & 1 == 1) else {
            continue;
        };
        let pivot = rows.swap_remove(p);
        for r in &mut rows {
            if r.0 >> bit & 1 == 1 {
                r.0 ^= pivot.0;
                r.1 ^= pivot.1;
            }
        }
        if want >> bit & 1 == 1 {
            want ^= pivot.0;
            x ^= pivot.1;
        }
    }
    assert_eq!(
        want, 0,
        "the CRC can be forced through any 4 consecutive bytes"
    );
    // Bit i of x is bit i % 8 of byte i / 8: little-endian.
    data[at..at + 4].copy_from_slice(&x.to_le_bytes());
    assert_eq!(crc32fast::hash(data), target);
}

/// The table in `table` (of height 1 or more) with a new root: an internal node of height 1
/// whose second record names the node itself, its checksum made to match by four of its key
/// bytes. A reader that checks heights refuses it; one that follows references alone loops.
pub fn self_naming(table: Vec<u8>) -> Vec<u8> {
    let mut t = Crafted::of(table);
    let (root, h) = t.root();
    assert!(h >= 1, "a table with an internal root");
    let mut below = root;
    for _ in 1..h {
        below = t.records(below)[0].1;
    }
    let records = t.records(below);
    let at = t.bytes.len() as u64;
    let len = (4 + 2 * RECORD) as u32;
    let crc = 0x5eed_c0de;
    let second = records[1].0;
    let mut block = node(
        b'I',
        1,
        &[
            records[0],
            (
                second,
                Ref {
                    offset: at,
                    len,
                    crc,
                },
            ),
        ],
    );
    // Four bytes of the second key's end make the block's CRC the one it names itself with
    // (the key keeps its order: its first 40 bytes are unchanged and larger than the first's).
    let key_at = 4 + RECORD + 44;
    force_crc(&mut block, key_at, crc);
    let r = t.append(&block);
    assert_eq!(
        r,
        Ref {
            offset: at,
            len,
            crc
        }
    );
    t.commit(r, 1);
    t.bytes
}
