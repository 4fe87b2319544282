//! Writing a file whole beside its name, then putting it in place: renamed over the old one
//! ([`AtomicFile::commit`]) or linked to a name nothing holds ([`AtomicFile::commit_new`]).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::{TMP_COUNTER, check_regular, parent_dir, sync_dir, tmp_prefix};
use crate::error::StoreError;

/// A file being written to replace `target` atomically: a temporary file beside it (created
/// new, never opened if something is there), renamed over `target` by [`AtomicFile::commit`].
/// With `durable`, the file is synced before the rename and the folder after it, so the new
/// contents survive a crash once `commit` returns. Dropped without a commit, the temporary
/// file is removed and `target` is untouched.
#[derive(Debug)]
pub struct AtomicFile {
    tmp: PathBuf,
    target: PathBuf,
    out: Option<io::BufWriter<File>>,
    durable: bool,
}

impl AtomicFile {
    /// Starts replacing `target`. Fails with `NotAFile` if something other than a regular
    /// file is there (a device, a FIFO, a folder): those are never replaced.
    pub fn create(target: &Path, durable: bool) -> Result<AtomicFile, StoreError> {
        check_regular(target)?;
        let tmp = parent_dir(target).join(format!(
            "{}{}.{}",
            tmp_prefix(target),
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| StoreError::io("create", &tmp, e))?;
        // Held until the file is put in place or dropped: the sweep of leftovers
        // (`remove_stale_temporaries`) spares a temporary a live writer holds. A file system
        // without locks still writes (the sweep then runs only under the cache lock).
        let _ = file.try_lock();
        Ok(AtomicFile {
            out: Some(io::BufWriter::with_capacity(1 << 16, file)),
            tmp,
            target: target.to_owned(),
            durable,
        })
    }

    /// Appends `bytes` to the new contents.
    pub fn write_all(&mut self, bytes: &[u8]) -> Result<(), StoreError> {
        let out = self.out.as_mut().expect("written only before commit");
        out.write_all(bytes)
            .map_err(|e| StoreError::io("write", &self.tmp, e))
    }

    /// Overwrites `bytes` at `offset` of what was written so far (a table's first commit slot,
    /// written once the blocks it names are).
    pub fn write_at(&mut self, offset: u64, bytes: &[u8]) -> Result<(), StoreError> {
        use std::os::unix::fs::FileExt;
        let out = self.out.as_mut().expect("written only before commit");
        out.flush()
            .and_then(|()| out.get_ref().write_all_at(bytes, offset))
            .map_err(|e| StoreError::io("write", &self.tmp, e))
    }

    /// Writes out what is buffered and syncs the temporary file; returns it, to read back or
    /// write at offsets before it is put in place.
    pub(crate) fn synced(&mut self) -> Result<&File, StoreError> {
        let out = self.out.as_mut().expect("written only before commit");
        out.flush()
            .and_then(|()| out.get_ref().sync_all())
            .map_err(|e| StoreError::io("write", &self.tmp, e))?;
        Ok(out.get_ref())
    }

    /// Writes out what is buffered and syncs the temporary file, and returns its path: to check
    /// the new contents (read them back, verify them) before they are put in place.
    pub fn written_path(&mut self) -> Result<&Path, StoreError> {
        self.synced()?;
        Ok(&self.tmp)
    }

    /// Puts the new contents in place (see the type's docs).
    pub fn commit(mut self) -> Result<(), StoreError> {
        self.close_tmp()?;
        fs::rename(&self.tmp, &self.target)
            .map_err(|e| StoreError::io("rename into place", &self.target, e))?;
        self.tmp = PathBuf::new();
        if self.durable {
            sync_dir(&parent_dir(&self.target))?;
        }
        Ok(())
    }

    /// Writes out what is buffered and closes the temporary file (synced if durable): ready to
    /// be renamed or linked into place.
    fn close_tmp(&mut self) -> Result<(), StoreError> {
        let out = self.out.take().expect("committed once");
        let file = out
            .into_inner()
            .map_err(|e| StoreError::io("write", &self.tmp, e.into_error()))?;
        if self.durable {
            file.sync_all()
                .map_err(|e| StoreError::io("sync", &self.tmp, e))?;
        }
        Ok(())
    }
}

impl AtomicFile {
    /// Puts the new contents in place only if nothing is at the target: a hard link from the
    /// temporary file (which fails if the target exists), then the temporary removed and the
    /// folder synced. Something that appeared at the target meanwhile is left as it is and
    /// refused. For writers of new files (`tunecache merge -o`, a bundle, an export), which
    /// never replace anything.
    pub fn commit_new(mut self) -> Result<(), StoreError> {
        self.close_tmp()?;
        match fs::hard_link(&self.tmp, &self.target) {
            Ok(()) => {}
            // A file system without hard links: the target is created new (never replacing
            // anything either, but not atomically) and the bytes copied into it.
            Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                let mut to = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&self.target)
                    .map_err(|e| StoreError::io("create", &self.target, e))?;
                let copied = File::open(&self.tmp)
                    .and_then(|mut from| io::copy(&mut from, &mut to))
                    .and_then(|_| if self.durable { to.sync_all() } else { Ok(()) });
                if let Err(e) = copied {
                    let _ = fs::remove_file(&self.target);
                    return Err(StoreError::io("write", &self.target, e));
                }
            }
            Err(e) => return Err(StoreError::io("create", &self.target, e)),
        }
        let _ = fs::remove_file(&self.tmp);
        self.tmp = PathBuf::new();
        if self.durable {
            sync_dir(&parent_dir(&self.target))?;
        }
        Ok(())
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if !self.tmp.as_os_str().is_empty() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// Replaces `target` with `bytes` atomically and durably (an [`AtomicFile`]).
pub fn write_atomic(target: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let mut file = AtomicFile::create(target, true)?;
    file.write_all(bytes)?;
    file.commit()
}
