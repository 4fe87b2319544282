//! The cross-process lock: an exclusive advisory lock on `<file>.lock`, then on the folder
//! that holds the cache, each waited for a bounded time by polling, never indefinitely.
//!
//! The lock file itself is created once and never deleted by tunecache. Someone else may
//! delete or replace it (a cleanup script): a lock is only taken on the file the path names
//! when the lock is granted, so a waiter never goes on holding a lock on a file that has
//! been replaced. A deletion while the lock is held would still let another process lock the
//! new file; that is what the folder lock is for: a writer of the cache holds it too, taken
//! after the file lock (always in that order, so no two writers deadlock), and a folder cannot
//! be deleted or replaced under its files by a cleanup of stale files. The folder lock is held
//! only while writing, so writers of other caches in the same folder wait for it at most that
//! long. The kernel releases both locks when their holder dies, so a killed process never
//! leaves a stale lock behind. On Linux this is `flock(2)`, which NFS maps to byte-range locks
//! on NFSv4; on NFSv3 without lockd it may not exclude.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::StoreError;

/// An exclusive `flock(2)` on a file, taken with a bounded wait; released on drop or when the
/// process dies. It is only a lock on the file the path names: once taken, the file at the
/// path must still be the one locked (same device and inode); a lock file deleted or replaced
/// meanwhile is locked again as it is now, within the same deadline.
#[derive(Debug)]
pub struct FileLock {
    file: File,
    path: PathBuf,
}

impl FileLock {
    /// Takes the lock at `path` (creating the file), waiting at most `timeout`; a wait past
    /// it is `StoreError::LockTimeout`.
    pub fn acquire(path: &Path, timeout: Duration) -> Result<FileLock, StoreError> {
        Self::acquire_unless(path, timeout, || false)
            .and_then(|held| held.ok_or_else(|| unreachable_give_up(path)))
    }

    /// [`FileLock::acquire`], giving up early (`Ok(None)`) as soon as `give_up` says so while
    /// waiting (the holder's work became visible: a waiter need not hold the lock any more).
    pub fn acquire_unless(
        path: &Path,
        timeout: Duration,
        mut give_up: impl FnMut() -> bool,
    ) -> Result<Option<FileLock>, StoreError> {
        Self::acquire_while(path, Instant::now(), &mut |waited| {
            if give_up() {
                Wait::GiveUp
            } else if waited >= timeout {
                Wait::TimedOut
            } else {
                Wait::For(timeout - waited)
            }
        })
    }

    /// Takes the lock at `path`, waiting as `wait` says, given how long it has waited since
    /// `start` (see [`Wait`]).
    pub(crate) fn acquire_while(
        path: &Path,
        start: Instant,
        wait: &mut dyn FnMut(Duration) -> Wait,
    ) -> Result<Option<FileLock>, StoreError> {
        let mut pause = Duration::from_millis(1);
        let mut file = open(path)?;
        loop {
            match file.try_lock() {
                Ok(()) => {
                    if still_at(&file, path)? {
                        return Ok(Some(FileLock {
                            file,
                            path: path.to_owned(),
                        }));
                    }
                    // Deleted or replaced since we opened it: lock what is there now.
                    let _ = file.unlock();
                    file = open(path)?;
                    continue;
                }
                Err(TryLockError::WouldBlock) => {}
                Err(TryLockError::Error(e)) => {
                    return Err(StoreError::io("lock", path, e));
                }
            }
            let waited = start.elapsed();
            let left = match wait(waited) {
                Wait::GiveUp => return Ok(None),
                Wait::TimedOut => {
                    return Err(StoreError::LockTimeout {
                        path: path.to_owned(),
                        waited,
                    });
                }
                Wait::For(left) => left,
            };
            std::thread::sleep(pause.min(left));
            pause = (pause * 2).min(Duration::from_millis(25));
            // The holder may have replaced the file: wait on the one the path names now.
            if !still_at(&file, path)? {
                file = open(path)?;
            }
        }
    }

    /// The locked file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the lock file while still holding it, then releases it. A waiter that opened
    /// the file before finds it gone when granted the lock, and locks a new one: so a claim
    /// file can be cleaned up by its holder without letting two holders in.
    pub fn remove(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// `acquire` never gives up early; an `Ok(None)` there would be a bug, reported as an error
/// rather than a panic.
fn unreachable_give_up(path: &Path) -> StoreError {
    StoreError::io(
        "lock",
        path,
        std::io::Error::other("the wait gave up without being asked to"),
    )
}

/// What a waiter for a lock does next, given how long it has waited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Try again, for at most this much longer before asking again.
    For(Duration),
    /// Stop: the wait is over (`LockTimeout`).
    TimedOut,
    /// Stop without the lock, as asked (`Ok(None)`).
    GiveUp,
}

/// How long a writer waits for a cache's lock that others hold: `idle` with no sign of
/// progress by them, and, while they make progress (each save they finish changes the cache's
/// files), on and on, up to `cap` in all. A holder that makes no progress for `idle` (stuck,
/// frozen) is given up on as before; a queue of writers that moves is waited out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Patience {
    pub(crate) idle: Duration,
    pub(crate) cap: Duration,
}

impl Patience {
    /// Waits `timeout`, whatever others do.
    pub(crate) fn fixed(timeout: Duration) -> Patience {
        Patience {
            idle: timeout,
            cap: timeout,
        }
    }

    /// The decision, given the time waited and the time since others last made progress (or
    /// since the start).
    pub(crate) fn next(&self, waited: Duration, since_progress: Duration) -> Wait {
        let left = self
            .cap
            .saturating_sub(waited)
            .min(self.idle.saturating_sub(since_progress));
        if left.is_zero() {
            Wait::TimedOut
        } else {
            Wait::For(left)
        }
    }
}

/// The lock a writer of a cache holds: its lock file, then its folder (see the module docs).
#[derive(Debug)]
pub(crate) struct CacheLock {
    // Released in reverse order of taking: the folder first, then the file.
    _dir: FolderLock,
    _file: FileLock,
}

impl CacheLock {
    /// Takes the lock file `lock` and then the folder `dir`, waiting at most `timeout` in all.
    pub(crate) fn acquire(lock: &Path, dir: &Path, timeout: Duration) -> Result<Self, StoreError> {
        Self::acquire_patient(lock, dir, &mut |waited| {
            Patience::fixed(timeout).next(waited, waited)
        })
    }

    /// Takes the lock file `lock` and then the folder `dir`, waiting as `wait` says given the
    /// time waited in all (the caller's closure observes others' progress itself, see
    /// [`Patience`]). `Wait::GiveUp` is taken as a time-out.
    pub(crate) fn acquire_patient(
        lock: &Path,
        dir: &Path,
        wait: &mut dyn FnMut(Duration) -> Wait,
    ) -> Result<Self, StoreError> {
        let start = Instant::now();
        let mut step = |waited: Duration| match wait(waited) {
            Wait::GiveUp => Wait::TimedOut,
            w => w,
        };
        let file = FileLock::acquire_while(lock, start, &mut step)?
            .ok_or_else(|| unreachable_give_up(lock))?;
        let dir = FolderLock::acquire(dir, start, &mut step)?;
        Ok(CacheLock {
            _dir: dir,
            _file: file,
        })
    }

    /// Takes the lock only if it is free right now.
    pub(crate) fn try_acquire(lock: &Path, dir: &Path) -> Result<Option<Self>, StoreError> {
        match Self::acquire(lock, dir, Duration::ZERO) {
            Ok(lock) => Ok(Some(lock)),
            Err(StoreError::LockTimeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// An exclusive `flock(2)` on a folder; released on drop.
#[derive(Debug)]
struct FolderLock {
    file: File,
}

impl FolderLock {
    fn acquire(
        dir: &Path,
        start: Instant,
        wait: &mut dyn FnMut(Duration) -> Wait,
    ) -> Result<FolderLock, StoreError> {
        let file = File::open(dir).map_err(|e| StoreError::io("open the folder", dir, e))?;
        let mut pause = Duration::from_millis(1);
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(FolderLock { file }),
                Err(TryLockError::WouldBlock) => {}
                Err(TryLockError::Error(e)) => return Err(StoreError::io("lock", dir, e)),
            }
            let waited = start.elapsed();
            let left = match wait(waited) {
                Wait::For(left) => left,
                Wait::TimedOut | Wait::GiveUp => {
                    return Err(StoreError::LockTimeout {
                        path: dir.to_owned(),
                        waited,
                    });
                }
            };
            std::thread::sleep(pause.min(left));
            pause = (pause * 2).min(Duration::from_millis(25));
        }
    }
}

impl Drop for FolderLock {
    fn drop(&mut self) {
        let _ = self.file.unlock();
    }
}

impl std::os::fd::AsRawFd for FileLock {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.file.as_raw_fd()
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        // Closing the descriptor releases the lock too; unlocking first makes it prompt.
        let _ = self.file.unlock();
    }
}

fn open(path: &Path) -> Result<File, StoreError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| StoreError::io("open the lock file", path, e))
}

/// Whether `path` still names the open `file` (same device and inode).
fn still_at(file: &File, path: &Path) -> Result<bool, StoreError> {
    use std::os::unix::fs::MetadataExt;
    let held = file
        .metadata()
        .map_err(|e| StoreError::io("inspect the lock file", path, e))?;
    match std::fs::metadata(path) {
        Ok(now) => Ok(now.dev() == held.dev() && now.ino() == held.ino()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(StoreError::io("inspect the lock file", path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiter_waits_while_others_progress_and_gives_up_on_a_stuck_holder() {
        let s = Duration::from_secs;
        let p = Patience {
            idle: s(2),
            cap: s(60),
        };
        assert_eq!(
            p.next(s(1), s(1)),
            Wait::For(s(1)),
            "within the first idle window"
        );
        assert_eq!(
            p.next(s(2), s(2)),
            Wait::TimedOut,
            "no progress for idle: stuck"
        );
        assert_eq!(
            p.next(s(30), Duration::from_millis(500)),
            Wait::For(Duration::from_millis(1500)),
            "others progressed half a second ago: go on"
        );
        assert_eq!(
            p.next(s(60), s(0)),
            Wait::TimedOut,
            "the cap, progress or not"
        );
        assert_eq!(p.next(s(59), s(0)), Wait::For(s(1)), "never past the cap");
        let fixed = Patience::fixed(s(2));
        assert_eq!(
            fixed.next(s(1), s(0)),
            Wait::For(s(1)),
            "a fixed wait ignores progress"
        );
        assert_eq!(fixed.next(s(2), s(0)), Wait::TimedOut);
    }

    /// A waiter that was granted the lock on a file that has since been replaced must not go
    /// on as if it held the lock: whoever locked the new file holds it.
    #[test]
    fn a_lock_on_a_replaced_file_is_not_a_lock() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("c.lock");
        let first = FileLock::acquire(&path, Duration::ZERO).expect("free");
        let waiter = std::thread::spawn({
            let path = path.clone();
            move || {
                let lock = FileLock::acquire(&path, Duration::from_secs(10));
                (lock.is_ok(), Instant::now())
            }
        });
        std::thread::sleep(Duration::from_millis(100)); // the waiter has opened the old file
        let replacement = dir.path().join("c.lock.new");
        std::fs::write(&replacement, b"").expect("write");
        std::fs::rename(&replacement, &path).expect("replace the lock file");
        let on_new_file = FileLock::acquire(&path, Duration::ZERO).expect("the new file is free");
        drop(first); // the old file's lock is released: the waiter must not take that one
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !waiter.is_finished(),
            "the waiter went on holding the replaced file's lock"
        );
        let released = Instant::now();
        drop(on_new_file);
        let (ok, granted) = waiter.join().expect("waiter");
        assert!(ok);
        assert!(
            granted >= released,
            "granted only once the new file's lock was free"
        );
    }
}
