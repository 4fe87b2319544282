//! What this process knows of the journal it reads and appends to, and how it tells a journal
//! that lost records it had (removed, cut short, replaced, written back to an older copy,
//! damaged) from one a fold emptied on purpose.
//!
//! A fold writes the table's next commit before it removes the journal, so a journal that is
//! gone, or is no longer the one read, while the table and its commit are still those it was
//! read under, lost what it held: what this process wrote there must be written again. The
//! bytes read so far are kept as a running checksum; a locked read that finds the journal
//! touched since it was last checked reads it whole and compares, so a journal written over
//! in place (an older copy put back, bytes damaged where this process already read) is caught
//! before the next save, not only a journal cut or removed.

use super::{Base, Cursor};
use crate::fsio::FileId;
use cache_format::FormatVersion;

/// The cache file and its commit as they were when the journal was last read or written.
#[derive(Debug, Clone, Copy)]
pub(super) struct Epoch {
    file: FileId,
    seq: u64,
}

impl Epoch {
    /// The epoch of the cache file as `base` read it.
    pub(super) fn of(base: &Base) -> Epoch {
        match base {
            Base::Legacy(s) => Epoch {
                file: s.id,
                seq: s.generation,
            },
            Base::Table(t) => Epoch {
                file: t.id,
                seq: t.table.commit().seq,
            },
        }
    }

    fn same(&self, other: &Epoch) -> bool {
        self.file.same_file(&other.file) && self.seq == other.seq
    }
}

/// A journal found to have lost records, pending the end of the read: if the file's commit is
/// still the one the journal was read under, no fold explains it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Lost {
    pub(super) epoch: Epoch,
    pub(super) why: &'static str,
}

#[derive(Debug, Clone)]
pub(super) struct JournalState {
    pub(super) id: FileId,
    pub(super) format: FormatVersion,
    pub(super) app: String,
    pub(super) schema: u32,
    /// Bytes of the header, to detect a journal replaced by another at the same inode.
    pub(super) header: Vec<u8>,
    /// Bytes read and applied so far (header included); always at a record boundary.
    pub(super) offset: u64,
    /// The CRC-32 of the bytes after the header up to `offset`, as read or written.
    digest: crc32fast::Hasher,
    /// The journal's identity (length, modification time) when its bytes were last known to
    /// be those `digest` covers: after this process's own append, or a locked read that
    /// checked them. Another identity means someone wrote to it since.
    pub(super) checked: Option<FileId>,
    /// The cache file's commit when the journal was last read or written.
    pub(super) epoch: Option<Epoch>,
}

impl JournalState {
    /// The state of a journal whose header (`head`, its bytes) was just read.
    pub(super) fn new(
        id: FileId,
        format: FormatVersion,
        header: cache_format::JournalHeader,
        head: &[u8],
        epoch: Option<Epoch>,
    ) -> Self {
        JournalState {
            id,
            format,
            app: header.app,
            schema: header.schema,
            header: head.to_vec(),
            offset: head.len() as u64,
            digest: crc32fast::Hasher::new(),
            checked: None,
            epoch,
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

    /// Whether a locked read must check the bytes already read: the journal was touched since
    /// they were last known good.
    pub(super) fn needs_check(&self, now: &FileId) -> bool {
        self.checked != Some(*now)
    }
}

impl Cursor {
    /// The epoch of the cache file as this cursor read it.
    pub(super) fn epoch(&self) -> Option<Epoch> {
        self.base.as_ref().map(Epoch::of)
    }

    /// The journal this cursor read (`j`) lost records, for `why`, unless the cache file moved
    /// on since it read it (a fold): noted until the read ends (see [`Cursor::take_lost`]).
    pub(super) fn note_lost(&mut self, j: &JournalState, why: &'static str) {
        if let (Some(epoch), Some(now)) = (j.epoch, self.epoch())
            && epoch.same(&now)
            && self.lost.is_none()
        {
            self.lost = Some(Lost { epoch, why });
        }
    }

    /// A loss noted during a read, if the cache file is still at the commit the journal was
    /// read under (a fold that raced the read explains a journal gone).
    pub(super) fn take_lost(&mut self) -> Option<&'static str> {
        let lost = self.lost.take()?;
        self.epoch()
            .is_some_and(|now| lost.epoch.same(&now))
            .then_some(lost.why)
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
        let mut j = JournalState::new(id, FormatVersion::CURRENT, header, head, None);
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
