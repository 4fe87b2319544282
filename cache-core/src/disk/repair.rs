//! The repairs the disk tier makes, always under the cache lock: an unusable file moved aside
//! (its journal's valid records rescued), a copy kept of a damaged journal (once per damage),
//! a journal removed.

use std::fs;
use std::path::{Path, PathBuf};

use super::{Cursor, Disk, Event, Failure, Incoming};
use crate::error::{Cause, StoreError};
use crate::fsio;

impl Disk {
    /// Moves an unusable snapshot aside, rescuing the valid records of its journal.
    pub(super) fn quarantine_snapshot(
        &self,
        reason: &str,
        inc: &mut Incoming,
    ) -> Result<(), Failure> {
        let stamp = cache_format::now_millis();
        let moved_to = fsio::aside(&self.paths.snapshot, &format!(".unusable-{stamp}"));
        fs::rename(&self.paths.snapshot, &moved_to)
            .map_err(|e| StoreError::io("move aside", &self.paths.snapshot, e))?;
        inc.events.push(Event::Quarantined {
            original: self.paths.snapshot.clone(),
            moved_to,
            reason: reason.to_owned(),
        });
        // A journal is moved with it, its valid records kept; a file at the journal's name
        // that is not a journal is not tunecache's, and stays.
        let journal = fsio::stat(&self.paths.journal)?.is_some()
            && crate::tablefile::begins_as_journal(&fsio::read_prefix(&self.paths.journal, 32)?);
        if journal {
            // Its records are individually checksummed and gated: keep the good ones.
            let mut scratch = Cursor::default();
            let mut rescued = Incoming::default();
            if self
                .read_journal_any_base(&mut scratch, &mut rescued)
                .is_ok()
            {
                inc.salvaged.merge(rescued.data);
            }
            let journal_to = fsio::aside(&self.paths.journal, &format!(".unusable-{stamp}"));
            fs::rename(&self.paths.journal, &journal_to)
                .map_err(|e| StoreError::io("move aside", &self.paths.journal, e))?;
            inc.events.push(Event::Quarantined {
                original: self.paths.journal.clone(),
                moved_to: journal_to,
                reason: "its snapshot was unusable; its valid records were kept".to_owned(),
            });
        }
        fsio::sync_dir(&self.paths.dir)?;
        Ok(())
    }

    pub(super) fn journal_unusable(
        &self,
        cause: Cause,
        locked: bool,
        inc: &mut Incoming,
    ) -> Result<(), Failure> {
        if locked {
            let moved_to = fsio::aside(
                &self.paths.journal,
                &format!(".unusable-{}", cache_format::now_millis()),
            );
            fs::rename(&self.paths.journal, &moved_to)
                .map_err(|e| StoreError::io("move aside", &self.paths.journal, e))?;
            fsio::sync_dir(&self.paths.dir)?;
            inc.events.push(Event::Quarantined {
                original: self.paths.journal.clone(),
                moved_to,
                reason: cause.to_string(),
            });
        } else {
            inc.events.push(Event::Unusable {
                path: self.paths.journal.clone(),
                cause,
            });
        }
        Ok(())
    }

    /// Keeps a copy of `path` as `<path>.<tag>-<hash of identity>`, once: the same damage
    /// seen again (by every process that opens the cache, at every save) keeps no new copy.
    pub(super) fn keep_copy(
        &self,
        path: &Path,
        tag: &str,
        identity: &[u8],
    ) -> Result<Option<PathBuf>, StoreError> {
        let to = fsio::aside(path, &format!(".{tag}-{:08x}", crc32fast::hash(identity)));
        if !to.exists() {
            fs::copy(path, &to).map_err(|e| StoreError::io("copy aside", path, e))?;
        }
        Ok(Some(to))
    }

    /// Before this process writes a table whose newest valid slot names a commit that does not
    /// read back (damage: a slot is written only after its commit is synced), the file as it is
    /// is copied aside once per damage: the next fold cuts off what follows the commit read,
    /// and the one after overwrites the slot, so without the copy that commit's results would
    /// be gone for good. The copy is written whole beside its name, synced, and linked to a name
    /// nothing holds (with its folder synced) before this returns, so no crash leaves a partial
    /// copy under the name; a file already under the name counts only if it holds the file's
    /// bytes (an earlier copy of this damage), and anything else there is left as it is and the
    /// copy goes under another name. The copy is what `tunecache verify` and a person can read.
    pub(super) fn keep_passed_over(
        &self,
        table: &crate::tablefile::TableFile,
        inc: &mut Incoming,
    ) -> Result<(), StoreError> {
        let Some(passed) = table.passed_over() else {
            return Ok(());
        };
        let path = &self.paths.snapshot;
        let identity = format!(
            "{}:{}:{}:{}",
            passed.seq,
            passed.slot_at,
            table.slot().end(),
            passed.problem
        );
        let base = fsio::aside(
            path,
            &format!(".damaged-{:08x}", crc32fast::hash(identity.as_bytes())),
        );
        for n in 0..16 {
            let to = if n == 0 {
                base.clone()
            } else {
                fsio::with_suffix(&base, &format!("-{n}"))
            };
            if fsio::stat(&to)?.is_some() {
                if same_bytes(path, &to)? {
                    return Ok(());
                }
                continue;
            }
            copy_whole(path, &to)?;
            inc.events.push(Event::PassedOver {
                path: path.clone(),
                seq: passed.seq,
                read: table.commit().seq,
                problem: passed.problem.clone(),
                kept: to,
            });
            return Ok(());
        }
        Err(StoreError::io(
            "keep a copy of",
            path,
            std::io::Error::other(format!(
                "{} and 15 names after it are taken by other files; the file is left as it is",
                base.display()
            )),
        ))
    }

    pub(super) fn remove_journal(&self) -> Result<(), StoreError> {
        // Only a journal: a file at its name that is not one is not tunecache's to remove.
        let prefix = fsio::read_prefix(&self.paths.journal, 32)?;
        if !crate::tablefile::begins_as_journal(&prefix) {
            return Err(StoreError::Format {
                path: self.paths.journal.clone(),
                source: cache_format::FormatError::NotTunecache {
                    what: "journal",
                    marker: "tunecache-journal",
                },
            });
        }
        match fs::remove_file(&self.paths.journal) {
            Ok(()) => fsio::sync_dir(&self.paths.dir),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StoreError::io("remove", &self.paths.journal, e)),
        }
    }
}

/// Whether `a` and `b` hold the same bytes (read a chunk at a time).
fn same_bytes(a: &Path, b: &Path) -> Result<bool, StoreError> {
    use std::io::Read;
    let open = |p: &Path| fs::File::open(p).map_err(|e| StoreError::io("read", p, e));
    let (mut fa, mut fb) = (open(a)?, open(b)?);
    let len = |f: &fs::File, p: &Path| {
        f.metadata()
            .map(|m| m.len())
            .map_err(|e| StoreError::io("inspect", p, e))
    };
    if len(&fa, a)? != len(&fb, b)? {
        return Ok(false);
    }
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let n = fa.read(&mut ba).map_err(|e| StoreError::io("read", a, e))?;
        if n == 0 {
            return Ok(true);
        }
        fb.read_exact(&mut bb[..n])
            .map_err(|e| StoreError::io("read", b, e))?;
        if ba[..n] != bb[..n] {
            return Ok(false);
        }
    }
}

/// Copies `from` to `to`, a name nothing holds: written beside it, synced, then linked in
/// place and the folder synced (never a partial file under `to`).
fn copy_whole(from: &Path, to: &Path) -> Result<(), StoreError> {
    use std::io::Read;
    let mut src = fs::File::open(from).map_err(|e| StoreError::io("copy aside", from, e))?;
    let mut out = fsio::AtomicFile::create(to, true)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = src
            .read(&mut buf)
            .map_err(|e| StoreError::io("copy aside", from, e))?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])?;
    }
    out.commit_new()
}
