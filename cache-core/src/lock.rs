//! The cross-process lock: an exclusive advisory lock on `<file>.lock`, waited for a bounded
//! time by polling, never indefinitely.
//!
//! The lock file itself is created once and never deleted (deleting a lock file lets two
//! processes lock two different inodes). The kernel releases the lock when its holder dies,
//! so a killed process never leaves a stale lock behind. On Linux this is `flock(2)`, which
//! NFS maps to byte-range locks on NFSv4; on NFSv3 without lockd it may not exclude.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::error::StoreError;

/// A held lock; released on drop.
#[derive(Debug)]
pub(crate) struct FileLock {
    file: File,
}

impl FileLock {
    /// Takes the lock at `path`, waiting at most `timeout`.
    pub(crate) fn acquire(path: &Path, timeout: Duration) -> Result<FileLock, StoreError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| StoreError::io("open the lock file", path, e))?;
        let start = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            match file.try_lock() {
                Ok(()) => {
                    return Ok(FileLock { file });
                }
                Err(TryLockError::WouldBlock) => {}
                Err(TryLockError::Error(e)) => {
                    return Err(StoreError::io("lock", path, e));
                }
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(StoreError::LockTimeout {
                    path: path.to_owned(),
                    waited,
                });
            }
            std::thread::sleep(pause.min(timeout - waited));
            pause = (pause * 2).min(Duration::from_millis(25));
        }
    }

    /// Takes the lock only if it is free right now.
    pub(crate) fn try_acquire(path: &Path) -> Result<Option<FileLock>, StoreError> {
        match Self::acquire(path, Duration::ZERO) {
            Ok(lock) => Ok(Some(lock)),
            Err(StoreError::LockTimeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        // Closing the descriptor releases the lock too; unlocking first makes it prompt.
        let _ = self.file.unlock();
    }
}
