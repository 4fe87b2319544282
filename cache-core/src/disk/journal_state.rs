//! What this process knows of the journal it reads and appends to, and how it tells a journal
//! that lost what this process wrote to it (removed, cut short, replaced, an older copy put
//! back, damaged where this process already read) from one a fold emptied on purpose.
//!
//! Each journal state keeps what this process appended to it (merged) and a running CRC-32 of
//! the bytes read and written. A journal that goes, or is no longer the one read, is checked
//! once the read ends (after the re-reads a fold racing an unlocked read causes): whatever this
//! process wrote to it that the file as now read (table and current journal) does not hold was
//! lost, and is written again. A fold moves records into the table, so it is never a loss. A
//! locked read that finds the journal touched by someone else since this process's own append
//! or check (its length, modification or change time; the last cannot be set back) reads it
//! whole and compares the prefix, so a journal written over in place is caught before the next
//! save, not only one cut short or removed. What this process wrote stays noted while the
//! journal does: across a table renamed in (a compaction keeps the journal) and across damage
//! found in others' records.

use cache_format::{CacheData, FormatVersion};

use super::{Cursor, View};
use crate::fsio::FileId;

/// What this process wrote to journals that went while a read was under way, and why the
/// first of them went.
#[derive(Debug, Clone, Default)]
pub(super) struct Lost {
    wrote: CacheData,
    why: Option<&'static str>,
    /// The nonces of the journals that went.
    nonces: Vec<u64>,
}

#[derive(Debug, Clone)]
pub(super) struct JournalState {
    pub(super) id: FileId,
    pub(super) format: FormatVersion,
    pub(super) app: String,
    pub(super) schema: u32,
    /// Bytes of the header, to detect a journal replaced by another at the same inode.
    pub(super) header: Vec<u8>,
    /// The header's nonce: names this journal in a rewrite that dropped what it held.
    pub(super) nonce: u64,
    /// Bytes read and applied so far (header included); always at a record boundary.
    pub(super) offset: u64,
    /// The CRC-32 of the bytes after the header up to `offset`, as read or written.
    digest: crc32fast::Hasher,
    /// The journal's identity (length, modification and change time) when its bytes were last known to
    /// be those `digest` covers: after this process's own append, or a locked read that
    /// checked them. Another identity means someone wrote to it since.
    pub(super) checked: Option<FileId>,
    /// What this process appended to this journal, merged.
    pub(super) wrote: CacheData,
    /// The cache file was read afresh since (a compaction renamed in, which keeps the
    /// journal): the journal is read whole again, and what this process wrote to it is kept.
    pub(super) rebased: bool,
}

impl JournalState {
    /// The state of a journal whose header (`head`, its bytes) was just read.
    pub(super) fn new(
        id: FileId,
        format: FormatVersion,
        header: cache_format::JournalHeader,
        head: &[u8],
    ) -> Self {
        JournalState {
            id,
            format,
            app: header.app,
            schema: header.schema,
            header: head.to_vec(),
            nonce: header.nonce,
            offset: head.len() as u64,
            digest: crc32fast::Hasher::new(),
            checked: None,
            wrote: CacheData::new(),
            rebased: false,
        }
    }

    /// Takes in `bytes`, which were read or written at `offset` and end at a record boundary.
    pub(super) fn advance(&mut self, bytes: &[u8]) {
        self.digest.update(bytes);
        self.offset += bytes.len() as u64;
    }

    /// Whether `whole` (the journal's bytes now) begins with exactly what was read of it.
    pub(super) fn is_prefix_of(&self, whole: &[u8]) -> bool {
        let (head, offset) = (self.header.len(), self.offset as usize);
        if whole.len() < offset || whole[..head] != self.header[..] {
            return false;
        }
        let mut now = crc32fast::Hasher::new();
        now.update(&whole[head..offset]);
        now.finalize() == self.digest.clone().finalize()
    }

    /// Why the journal, now `now` (`None`: too large to read), is not the one read.
    pub(super) fn why_lost(&self, now: Option<&[u8]>) -> &'static str {
        match now {
            Some(b) if !b.starts_with(&self.header) => "another journal took its place",
            Some(b) if b.len() < self.offset as usize => "it was cut short",
            _ => "bytes already read were written over",
        }
    }

    /// Whether a locked read must check the bytes already read: the journal was touched since
    /// they were last known good.
    pub(super) fn needs_check(&self, now: &FileId) -> bool {
        self.checked != Some(*now)
    }
}

impl Cursor {
    /// The journal this cursor read (`j`) went, for `why`: what this process wrote to it is
    /// checked against the file once the read ends (see [`Cursor::take_lost`]).
    pub(super) fn note_lost(&mut self, j: &JournalState, why: &'static str) {
        if j.wrote.is_empty() {
            return;
        }
        self.lost.wrote.merge(j.wrote.clone());
        self.lost.why.get_or_insert(why);
        self.lost.nonces.push(j.nonce);
    }

    /// Why a journal lost what this process wrote to it, if the file as this cursor now reads
    /// it (table and journal) lacks any of it; `None` if a fold (or anything else) put all of
    /// it in the table. A file read whole (an older format) is answered by its own rule
    /// (`Incoming::whole`); a damaged entry counts as lacking.
    pub(super) fn take_lost(&mut self) -> Option<&'static str> {
        let Lost { wrote, why, nonces } = std::mem::take(&mut self.lost);
        let why = why?;
        let Some(t) = self.table() else {
            return Some(why);
        };
        // A rewrite that dropped entries on purpose (a retention limit) right after folding
        // one of these journals: what is missing was dropped, not lost, and stays dropped.
        let dropped_from = t.table.commit().dropped.and_then(|d| d.journal);
        if dropped_from.is_some_and(|n| nonces.contains(&n)) {
            return None;
        }
        let view = View {
            table: Some(std::sync::Arc::clone(&t.table)),
            journal: self.journal_data.clone(),
            changed: super::Changed::Keys(Default::default()),
        };
        let lacking = wrote.entries().any(|(scope, ns, entry)| {
            let (found, _) = super::lookup(&view, scope, ns, &entry.fingerprint());
            !found.is_some_and(|on_disk| on_disk.covers(entry))
        });
        lacking.then_some(why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(head: &[u8], read: &[u8]) -> JournalState {
        let header = cache_format::JournalHeader {
            app: "t".into(),
            schema: 1,
            base: 7,
            nonce: 1,
        };
        let id = FileId::of(&std::fs::metadata(".").expect("a folder"));
        let mut j = JournalState::new(id, FormatVersion::CURRENT, header, head);
        j.advance(read);
        j
    }

    #[test]
    fn only_the_bytes_read_followed_by_more_are_the_journal_read() {
        let j = state(b"HEAD", b"record-1record-2");
        assert!(j.is_prefix_of(b"HEADrecord-1record-2"), "unchanged");
        assert!(j.is_prefix_of(b"HEADrecord-1record-2record-3"), "grown");
        assert!(!j.is_prefix_of(b"HEADrecord-1"), "cut short");
        assert!(!j.is_prefix_of(b"HEADrecord-1record-X"), "written over");
        assert!(!j.is_prefix_of(b"HEAXrecord-1record-2"), "another header");
        assert!(!j.is_prefix_of(b""), "empty");
        assert_eq!(j.why_lost(Some(b"HEADrecord-1")), "it was cut short");
        assert_eq!(
            j.why_lost(Some(b"HEAXrecord-1record-2")),
            "another journal took its place"
        );
        assert_eq!(
            j.why_lost(Some(b"HEADrecord-1record-X")),
            "bytes already read were written over"
        );
    }

    #[test]
    fn a_journal_is_checked_again_once_touched_since_its_last_check() {
        let mut j = state(b"HEAD", b"");
        let now = j.id;
        assert!(j.needs_check(&now), "never checked");
        j.checked = Some(now);
        assert!(!j.needs_check(&now));
        let other = FileId::of(&std::fs::metadata("/").expect("root"));
        assert!(j.needs_check(&other));
    }
}
