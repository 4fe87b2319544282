//! A commit whose slot fails its check, found by its block. A fold syncs every block it
//! appends, the commit block last, before it writes the slot; so when a slot is damaged (a torn
//! slot write, or a bit flipped since) and the file ends with a complete commit block whose
//! sequence number follows the newest valid slot's and whose `prev` is that slot's commit, the
//! commit is whole and safe to adopt. Without this, a reader would fall back one commit and the
//! next fold would cut the newer commit off for good.

use super::head::{SLOT_A, SLOT_B, Slot, TableHead};
use super::read::read_block;
use super::wire::{COMMIT_MAX_BYTES, Commit};
use super::{BlockRef, ReadAt};
use crate::scan::Limits;

/// The commit after `base` (the newest commit a valid slot names, in the slot at `base_at`)
/// whose slot is the damaged other one: its slot as it would read, and the commit. `None` when
/// the other slot is not damaged, or no such commit ends the file.
pub(crate) fn next_commit<R: ReadAt + ?Sized>(
    src: &R,
    limits: &Limits,
    head: &TableHead,
    base: &Slot,
    base_at: u64,
    size: u64,
) -> Option<(u64, Slot, Commit)> {
    let other = if base_at == SLOT_A { SLOT_B } else { SLOT_A };
    if !head.damaged[usize::from(other == SLOT_B)] {
        return None;
    }
    let accept = |c: &Commit| c.seq == base.seq + 1 && c.prev == Some(base.commit);
    let (slot, commit) = tail_commit(src, limits, head, base.end(), size, accept)?;
    Some((other, slot, commit))
}

/// The only commit of a table written in one go (an import, a merge, a rewrite: one slot ever
/// written), when that slot is damaged and the other was never written: the commit block that
/// ends the file, with no commit before it, whose blocks read back and whose CRC-32 the
/// damaged slot still records. Its slot as it would read, and where. Without this, one flipped bit of the slot made every entry of the file unusable.
pub(crate) fn only_commit<R: ReadAt + ?Sized>(
    src: &R,
    limits: &Limits,
    head: &TableHead,
    size: u64,
) -> Option<(u64, Slot, Commit)> {
    // One slot damaged, the other never written (all zero): FORMAT.md's case, and no other.
    if head.slots != [None, None] || head.damaged[0] == head.damaged[1] {
        return None;
    }
    let at = if head.damaged[0] { SLOT_A } else { SLOT_B };
    let first = |c: &Commit| c.prev.is_none();
    let (slot, commit) = tail_commit(src, limits, head, head.blocks_at, size, first)?;
    // The block's own bytes have no checksum but the slot's: the damaged slot must still
    // hold it (its CRC field intact; the damage elsewhere in the slot). A block damaged as
    // well (its CRC differs), or damage in the slot's CRC field, is not adopted: a commit
    // whose root, counts or lineage are wrong would lose entries silently.
    let recorded = recorded_crc(src, at)?;
    (recorded == slot.commit.crc).then_some((at, slot, commit))
}

/// The commit CRC-32 a slot's bytes record (bytes 20 to 24), read whatever the slot's own
/// check says.
fn recorded_crc<R: ReadAt + ?Sized>(src: &R, at: u64) -> Option<u32> {
    let mut crc = [0u8; 4];
    src.read_exact_at(&mut crc, at + 20).ok()?;
    Some(u32::from_be_bytes(crc))
}

/// The commit block that ends the file after `from`, that `accept` takes and whose directory,
/// root and change list read back: its slot as it would read, and the commit.
fn tail_commit<R: ReadAt + ?Sized>(
    src: &R,
    limits: &Limits,
    head: &TableHead,
    from: u64,
    size: u64,
    accept: impl Fn(&Commit) -> bool,
) -> Option<(Slot, Commit)> {
    if size <= from {
        return None;
    }
    // The commit block is the last thing a fold appends: it ends the file.
    let window = (size - from).min(u64::from(COMMIT_MAX_BYTES));
    let start = size - window;
    let mut tail = vec![0u8; window as usize];
    src.read_exact_at(&mut tail, start).ok()?;
    for at in 0..tail.len() {
        // A commit block is a msgpack map.
        if !matches!(tail[at], 0x80..=0x8f | 0xde | 0xdf) {
            continue;
        }
        // One msgpack value, and the file's end is its end.
        let ends = crate::scan::scan_value(&tail[at..], 0, "commit", limits.max_depth);
        if ends.ok() != Some(tail.len() - at) {
            continue;
        }
        let Ok(commit) = Commit::decode(&tail[at..], limits) else {
            continue;
        };
        if !accept(&commit) {
            continue;
        }
        let offset = start + at as u64;
        let reads_back = |r: &BlockRef| {
            r.offset >= head.blocks_at && r.end() <= offset && read_block(src, "block", r).is_ok()
        };
        let whole = reads_back(&commit.dir)
            && commit.root.as_ref().is_none_or(reads_back)
            && commit.changes.as_ref().is_none_or(reads_back);
        if !whole {
            continue;
        }
        let slot = Slot {
            seq: commit.seq,
            commit: BlockRef::of(offset, &tail[at..]),
        };
        return Some((slot, commit));
    }
    None
}
