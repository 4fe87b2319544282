//! A table (cache-format's format 4) on disk: read with `pread` through one descriptor, never a
//! memory map, so a file cut short or rewritten in place by someone else costs errors (misses,
//! warnings), never a fault. Written by appending blocks and then pointing the older commit
//! slot at the new commit, each step synced, under the cache lock; or, for a new table, as a
//! temporary file renamed into place.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cache_format::table::{ReadAt, Table, TableBuilder, TableError, Update};
use cache_format::{FormatError, Limits};

use crate::error::StoreError;
use crate::fsio::{self, AtomicFile, FileId};

/// The bytes of a table in a file: the whole file, or a region of it (a table inside a
/// bundle), read with `pread`.
#[derive(Debug)]
pub(crate) struct FileBytes {
    file: Arc<File>,
    /// Where the table starts in the file.
    base: u64,
    /// The region's length (`None`: to the end of the file, as it is now).
    len: Option<u64>,
}

impl FileBytes {
    pub(crate) fn whole(file: Arc<File>) -> FileBytes {
        FileBytes {
            file,
            base: 0,
            len: None,
        }
    }

    pub(crate) fn region(file: Arc<File>, base: u64, len: u64) -> FileBytes {
        FileBytes {
            file,
            base,
            len: Some(len),
        }
    }

    pub(crate) fn file(&self) -> &Arc<File> {
        &self.file
    }
}

impl ReadAt for FileBytes {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let end = offset.checked_add(buf.len() as u64);
        if let (Some(len), Some(end)) = (self.len, end)
            && end > len
        {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let at = offset
            .checked_add(self.base)
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        self.file.read_exact_at(buf, at)
    }

    fn size(&self) -> std::io::Result<u64> {
        match self.len {
            Some(len) => Ok(len),
            None => Ok(self.file.metadata()?.len().saturating_sub(self.base)),
        }
    }
}

/// An open table on disk.
pub(crate) type TableFile = Table<FileBytes>;

/// A table's error as the store's, naming the file.
pub(crate) fn table_error(path: &Path, e: TableError) -> StoreError {
    match e {
        TableError::Format(source) | TableError::OverCaps(source) => StoreError::Format {
            path: path.to_owned(),
            source,
        },
        TableError::Io(e) => StoreError::io("read", path, e),
    }
}

/// Whether the file open as `file` starts as a table does (its first 16 bytes).
pub(crate) fn starts_as_table(file: &File) -> std::io::Result<bool> {
    let mut prefix = [0u8; 16];
    match file.read_exact_at(&mut prefix, 0) {
        Ok(()) => Ok(cache_format::table::is_table(&prefix)),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether `file` begins as every tunecache cache file begins (a msgpack array, then the
/// string `"tunecache"`, as FORMAT.md's snapshot and table layouts both start), or is cut short
/// within that beginning (an empty file included). One that does not is not tunecache's (a
/// user's file given as the cache's path, a bundle): it is left alone, never moved aside.
pub(crate) fn begins_as_cache(file: &File) -> std::io::Result<bool> {
    let mut prefix = [0u8; 16];
    let mut len = 0;
    while len < prefix.len() {
        match file.read_at(&mut prefix[len..], len as u64) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(marked(&prefix[..len], CACHE_MARKER))
}

/// A cache file's marker: the string `"tunecache"`.
const CACHE_MARKER: &[u8] = b"tunecache";

/// A journal's marker: the string `"tunecache-journal"`.
const JOURNAL_MARKER: &[u8] = b"tunecache-journal";

/// Whether `bytes` (a file's first bytes) begin as a cache file or a journal does, or are cut
/// short within that: what a copy tunecache kept aside holds.
pub(crate) fn begins_as_ours(bytes: &[u8]) -> bool {
    marked(bytes, CACHE_MARKER) || marked(bytes, JOURNAL_MARKER)
}

/// Whether the first bytes of a journal begin as a journal does, or are cut short within that
/// beginning (see [`begins_as_cache`]): one that does not is not tunecache's and is left alone.
pub(crate) fn begins_as_journal(bytes: &[u8]) -> bool {
    marked(bytes, JOURNAL_MARKER)
}

/// Whether `bytes` begin with a msgpack array and then the string `marker`, in any of
/// msgpack's encodings (readers take any), or are cut short within that.
fn marked(bytes: &[u8], marker: &[u8]) -> bool {
    // The array's header: a fixarray, or an array 16 or 32.
    let rest = match bytes.first() {
        None => return true,
        Some(0x90..=0x9f) => &bytes[1..],
        Some(0xdc) => bytes.get(3..).unwrap_or_default(),
        Some(0xdd) => bytes.get(5..).unwrap_or_default(),
        Some(_) => return false,
    };
    // The string's header: a fixstr, or a str 8, 16 or 32, whose length is the marker's.
    let len = marker.len() as u32;
    let header: Vec<u8> = match rest.first() {
        None => return true,
        Some(0xa0..=0xbf) => vec![0xa0 | len as u8],
        Some(0xd9) => vec![0xd9, len as u8],
        Some(0xda) => [&[0xda][..], &(len as u16).to_be_bytes()].concat(),
        Some(0xdb) => [&[0xdb][..], &len.to_be_bytes()].concat(),
        Some(_) => return false,
    };
    let expected = [header.as_slice(), marker].concat();
    let n = rest.len().min(expected.len());
    rest[..n] == expected[..n]
}

/// Opens the table in `file` (read through it from now on).
pub(crate) fn open(file: Arc<File>, limits: &Limits) -> Result<TableFile, TableError> {
    Table::open(FileBytes::whole(file), limits)
}

/// The table's length on disk beyond its newest commit (an append cut short by a crash, or a
/// writer's append in progress when read without the lock).
pub(crate) fn torn_len(table: &TableFile) -> u64 {
    table
        .source()
        .size()
        .map_or(0, |size| size.saturating_sub(table.slot().end()))
}

/// Writes `update` (whose first bytes the sink already wrote from `update.at`) into the table at
/// `path` through `file` (opened for writing): the rest of its bytes, a sync, the slot, a sync.
/// On failure the file is cut back to where the update started, so nothing half-written stays.
pub(crate) fn finish_update(
    path: &Path,
    file: &File,
    start: u64,
    update: &Update,
) -> Result<(), StoreError> {
    let written = file
        .write_all_at(&update.bytes, update.at)
        .and_then(|()| file.sync_data())
        .and_then(|()| file.write_all_at(&update.slot, update.slot_at))
        .and_then(|()| file.sync_data());
    if let Err(e) = written {
        // The slot may be torn: it is the older one, so readers fall back to the current
        // commit, whose blocks are before `start`.
        let _ = file.set_len(start).and_then(|()| file.sync_all());
        return Err(StoreError::io("append to", path, e));
    }
    Ok(())
}

/// A sink for [`Table::update`]'s appended bytes: written at `*at` through `file`.
pub(crate) fn appender<'a>(
    file: &'a File,
    at: &'a mut u64,
) -> impl FnMut(&[u8]) -> std::io::Result<()> + 'a {
    move |bytes| {
        file.write_all_at(bytes, *at)?;
        *at += bytes.len() as u64;
        Ok(())
    }
}

/// A new table being written at a path: a temporary file beside it, filled from a
/// [`TableBuilder`] as entries come, then synced, renamed into place and the folder synced.
/// Dropped unfinished, the temporary file goes and the path is untouched.
#[derive(Debug)]
pub(crate) struct NewTable {
    out: AtomicFile,
    builder: TableBuilder,
    path: PathBuf,
}

impl NewTable {
    pub(crate) fn create(path: &Path, builder: TableBuilder) -> Result<NewTable, StoreError> {
        Ok(NewTable {
            out: AtomicFile::create(path, true)?,
            builder,
            path: path.to_owned(),
        })
    }

    /// Adds an entry's bytes (keys ascending; see [`TableBuilder::add`]).
    pub(crate) fn add(
        &mut self,
        key: cache_format::table::TKey,
        scope: &cache_format::Scope,
        ns: &str,
        entry: &[u8],
    ) -> Result<(), StoreError> {
        self.builder
            .add(key, scope, ns, entry)
            .map_err(|e| format_error(&self.path, e))?;
        self.drain(1 << 20)
    }

    fn drain(&mut self, at_least: usize) -> Result<(), StoreError> {
        let pending = self.builder.take_output_if(at_least);
        if !pending.is_empty() {
            self.out.write_all(&pending)?;
        }
        Ok(())
    }

    /// Writes the rest and the first slot, and syncs, without putting the table in place: it
    /// can be read and updated (a rewrite catching up) before [`Written::commit`].
    pub(crate) fn written(mut self) -> Result<Written, StoreError> {
        // More scopes or namespaces than a reader with the format's bounds accepts: refused,
        // and the temporary goes with `self` (the path is untouched).
        self.builder
            .check_caps(&cache_format::Limits::default())
            .map_err(|e| format_error(&self.path, e))?;
        self.drain(0)?;
        let (rest, slot, commit) = self.builder.finish();
        self.out.write_all(&rest)?;
        self.out.write_at(cache_format::table::SLOT_A, &slot)?;
        self.out.synced()?;
        Ok(Written {
            out: self.out,
            path: self.path,
            commit,
        })
    }

    /// Writes the rest and puts the table in place; returns the file's identity and the
    /// table's first commit.
    pub(crate) fn finish(self) -> Result<(FileId, cache_format::table::Commit), StoreError> {
        self.written()?.commit()
    }
}

/// A new table written and synced, not yet in place.
#[derive(Debug)]
pub(crate) struct Written {
    out: AtomicFile,
    path: PathBuf,
    commit: cache_format::table::Commit,
}

impl Written {
    /// The temporary file, for reading it as a table and appending to it.
    pub(crate) fn file(&mut self) -> Result<Arc<File>, StoreError> {
        let f = self.out.synced()?;
        f.try_clone()
            .map(Arc::new)
            .map_err(|e| StoreError::io("open", &self.path, e))
    }

    /// Puts the table in place (renamed over the path, the folder synced); returns the file's
    /// identity and the table's first commit.
    pub(crate) fn commit(self) -> Result<(FileId, cache_format::table::Commit), StoreError> {
        self.out.commit()?;
        let id = fsio::stat(&self.path)?
            .map(|m| FileId::of(&m))
            .ok_or_else(|| {
                StoreError::io("find", &self.path, std::io::ErrorKind::NotFound.into())
            })?;
        Ok((id, self.commit))
    }
}

/// A format error in the table at `path`.
pub(crate) fn format_error(path: &Path, e: FormatError) -> StoreError {
    StoreError::Format {
        path: path.to_owned(),
        source: e,
    }
}

impl Written {
    /// Puts the table in place only if nothing is at the path (see
    /// [`AtomicFile::commit_new`]); returns the table's first commit.
    pub(crate) fn commit_new(self) -> Result<cache_format::table::Commit, StoreError> {
        self.out.commit_new()?;
        Ok(self.commit)
    }
}

#[cfg(test)]
mod marker_tests {
    use super::{CACHE_MARKER, begins_as_journal, marked};

    #[test]
    fn only_a_file_that_begins_as_a_cache_or_is_cut_short_within_that_is_taken_as_one() {
        let table =
            cache_format::table::table_bytes("app", 1, None, &cache_format::CacheData::new());
        let marked = |b: &[u8]| marked(b, CACHE_MARKER);
        assert!(marked(&table[..16]), "a table");
        for cut in 0..12 {
            assert!(marked(&table[..cut]), "cut short at {cut}");
        }
        assert!(marked(b"\x96\xa9tunecache\x03\xc6"), "a snapshot");
        assert!(marked(b"\xdc\x00\x06\xa9tunecache\x03"), "an array 16");
        let journal = cache_format::encode_journal_header(&cache_format::JournalHeader {
            app: "app".into(),
            schema: 1,
            base: 7,
            nonce: 9,
        });
        assert!(
            begins_as_journal(&journal) && !marked(&journal),
            "a journal"
        );
        assert!(begins_as_journal(&journal[..5]) && begins_as_journal(b""));
        assert!(!begins_as_journal(b"my notes\n") && !begins_as_journal(&table[..16]));
        // Any string encoding of the marker, as readers take any (a third review: a journal
        // written with a str 8 marker was appended to by put and called foreign by gc).
        assert!(marked(b"\x96\xd9\x09tunecache\x04"), "str 8");
        assert!(marked(b"\x96\xda\x00\x09tunecache\x04"), "str 16");
        assert!(marked(b"\x96\xdb\x00\x00\x00\x09tunecache\x04"), "str 32");
        assert!(begins_as_journal(b"\x94\xd9\x11tunecache-journal\x04"));
        assert!(!marked(b"\x96\xd9\x0atunecache!\x04"), "another string");
        assert!(!marked(b"\x96\xa8tunecach"), "a shorter one");
        for foreign in [
            &b"important notes"[..],
            b"{\"a\":1}",
            b"\x93\xa8TCBUNDLE\x03",
            b"\x96\xa9tunecachf\x04",
            b"\x96\xa8tunecache\x04",
            b"\x00",
        ] {
            assert!(!marked(foreign), "{foreign:?}");
        }
    }
}
