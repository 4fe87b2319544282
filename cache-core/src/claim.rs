//! Per-key claims: while one process measures a key, other processes that share the cache file
//! wait for it (a bounded time) instead of measuring the same key again.
//!
//! A claim is an exclusive `flock` on `<file>.claims/<namespace>-<fingerprint>.lock` (FORMAT.md,
//! "Claim files"). The kernel releases it when the holder drops it or dies, so a killed tuner
//! never leaves a key claimed. The files themselves hold no data; deleting one that nobody holds
//! is harmless, which is what a later `gc` does.
//!
//! A cache with no file to share claims through (memory only, read-only, a claims folder that
//! cannot be written) claims the key among the threads of its process instead
//! ([`LocalClaims`]), so every binding gets one claim from the core, whatever the cache.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use cache_format::Fingerprint;

use crate::error::StoreError;
use crate::fsio;
use crate::lock::FileLock;
use crate::namespace::Namespace;

/// The outcome of [`crate::Cache::claim`].
#[derive(Debug)]
pub enum Claim {
    /// This caller holds the key until the guard is dropped; other callers wait for it.
    Held(ClaimGuard),
    /// Another holder kept the key for longer than the wait.
    Busy,
}

/// A held claim on one key; released on drop (or when the process dies).
#[derive(Debug)]
pub struct ClaimGuard {
    held: Held,
}

#[derive(Debug)]
enum Held {
    /// A claim file's lock: across processes.
    File(FileLock),
    /// A key of the cache's in-process table.
    Local(Arc<LocalClaims>, (Namespace, Fingerprint)),
}

impl ClaimGuard {
    /// Whether the claim holds across the processes sharing the file (else only among this
    /// process's threads: the cache has no file to share claims through). A holder of a
    /// shared claim reads what other processes saved before measuring.
    pub fn is_shared(&self) -> bool {
        matches!(self.held, Held::File(_))
    }

    /// The descriptor a shared claim's lock is on. A process that forks while holding claims
    /// has its child close its copies (and never unlock them: the lock is shared with the
    /// parent), so a child outliving a killed parent does not keep the key claimed (the C ABI
    /// does).
    pub fn lock_fd(&self) -> Option<std::os::fd::RawFd> {
        match &self.held {
            Held::File(lock) => Some(std::os::fd::AsRawFd::as_raw_fd(lock)),
            Held::Local(..) => None,
        }
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        if let Held::Local(table, key) = &self.held {
            table.release(key);
        }
    }
}

/// The keys claimed among the threads of one process, for a cache with no file to share
/// claims through.
#[derive(Debug, Default)]
pub(crate) struct LocalClaims {
    held: Mutex<HashSet<(Namespace, Fingerprint)>>,
    freed: Condvar,
}

impl LocalClaims {
    /// Takes `key`, waiting at most `wait` for its holder.
    pub(crate) fn take(self: &Arc<Self>, key: (Namespace, Fingerprint), wait: Duration) -> Claim {
        let deadline = crate::deadline_after(wait);
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        while held.contains(&key) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Claim::Busy;
            }
            held = self
                .freed
                .wait_timeout(held, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        held.insert(key);
        Claim::Held(ClaimGuard {
            held: Held::Local(Arc::clone(self), key),
        })
    }

    fn release(&self, key: &(Namespace, Fingerprint)) {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
        self.freed.notify_all();
    }
}

/// The folder of claim files of the cache file `path`: `<path>.claims`.
pub(crate) fn claims_dir(path: &Path) -> PathBuf {
    fsio::aside(path, ".claims")
}

/// The claim file of one key: the namespace with every byte outside `[A-Za-z0-9_-]` replaced
/// by `_`, a dash, and the key fingerprint in 32 lower-case hex digits.
pub(crate) fn claim_file(dir: &Path, ns: Namespace, fp: &Fingerprint) -> PathBuf {
    let safe: String = ns
        .name()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    // A file name has at most 255 bytes: a long namespace keeps its first 100 characters and
    // a digest of the whole name (still a claim file's name, see `is_claim_file`).
    let safe = if safe.len() > 120 {
        let digest = cache_format::table::namespace_hash(ns.name());
        format!("{}_{}", &safe[..100], &digest.to_hex()[..16])
    } else {
        safe
    };
    dir.join(format!("{safe}-{}.lock", fp.to_hex()))
}

/// Whether `name` is a claim file's name (`<safe namespace>-<32 hex>.lock`, see
/// [`claim_file`]): `gc` removes nothing else from a claims folder.
pub(crate) fn is_claim_file(name: &str) -> bool {
    let Some(stem) = name.strip_suffix(".lock") else {
        return false;
    };
    let Some((ns, fp)) = stem.rsplit_once('-') else {
        return false;
    };
    !ns.is_empty()
        && ns
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && fp.len() == 32
        && fp.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Takes the claim of `(ns, fp)` for the cache file `path`, waiting at most `wait`; `None`
/// if no claim file can be used (the caller claims the key in-process instead).
pub(crate) fn claim_file_lock(
    path: &Path,
    ns: Namespace,
    fp: &Fingerprint,
    wait: Duration,
) -> Option<Claim> {
    let dir = claims_dir(path);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        tracing::debug!(
            "tunecache: no cross-process claim for a key: cannot create {}: {e}",
            dir.display()
        );
        return None;
    }
    match FileLock::acquire(&claim_file(&dir, ns, fp), wait) {
        Ok(lock) => Some(Claim::Held(ClaimGuard {
            held: Held::File(lock),
        })),
        Err(StoreError::LockTimeout { .. }) => Some(Claim::Busy),
        Err(e) => {
            tracing::debug!("tunecache: no cross-process claim for a key: {e}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    /// Hardening IV, case 10: a namespace of real kernel names (up to 512 bytes) gets a claim
    /// file whose name fits a file system's 255 bytes and is still known as a claim file; two
    /// long names that share their start get two files.
    fn a_long_namespace_gets_a_short_claim_file_name() {
        let long = |tail: &str| {
            Namespace::new(&format!("triton/{}{tail}", "k".repeat(480))).expect("valid")
        };
        let fp = Fingerprint([0xcd; 16]);
        let (a, b) = (
            claim_file(Path::new("/c.claims"), long("a"), &fp),
            claim_file(Path::new("/c.claims"), long("b"), &fp),
        );
        let name = a.file_name().and_then(|n| n.to_str()).expect("name");
        assert!(name.len() <= 160, "{} bytes", name.len());
        assert!(is_claim_file(name), "{name}");
        assert_ne!(a, b);
    }

    #[test]
    fn claim_files_are_named_by_a_safe_namespace_and_the_fingerprint() {
        let ns = Namespace::new("conv/fwd.v2").expect("valid");
        let fp = Fingerprint([0xab; 16]);
        assert_eq!(
            claim_file(Path::new("/c.tcache.claims"), ns, &fp),
            PathBuf::from(format!(
                "/c.tcache.claims/conv_fwd_v2-{}.lock",
                "ab".repeat(16)
            ))
        );
        assert_eq!(
            claims_dir(Path::new("/x/c.tcache")),
            PathBuf::from("/x/c.tcache.claims")
        );
    }

    #[test]
    fn only_claim_file_names_are_recognised() {
        let ns = Namespace::new("conv/fwd.v2").expect("valid");
        let ours = claim_file(Path::new("/c"), ns, &Fingerprint([0xab; 16]));
        let name = ours.file_name().and_then(|n| n.to_str()).expect("name");
        assert!(is_claim_file(name), "{name}");
        for other in [
            "notes.lock",
            "db.lock",
            "x-abc.lock",
            &format!("x-{}.lock.bak", "ab".repeat(16)),
            &format!("x y-{}.lock", "ab".repeat(16)),
            &format!("-{}.lock", "ab".repeat(16)),
            &format!("x-{}.lock", "AB".repeat(16)),
        ] {
            assert!(!is_claim_file(other), "{other}");
        }
    }

    #[test]
    fn a_claim_excludes_another_until_dropped() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("c.tcache");
        let file = |fp: &Fingerprint, wait| {
            claim_file_lock(&path, ns(), fp, wait).expect("a claims folder")
        };
        let local = Arc::new(LocalClaims::default());
        let in_process = |fp: &Fingerprint, wait| local.take((ns(), *fp), wait);
        for (kind, take) in [
            ("file", &file as &dyn Fn(&Fingerprint, Duration) -> Claim),
            ("in-process", &in_process),
        ] {
            let fp = Fingerprint([1; 16]);
            let held = take(&fp, Duration::ZERO);
            let Claim::Held(guard) = &held else {
                panic!("{kind}: {held:?}");
            };
            assert_eq!(guard.is_shared(), kind == "file");
            assert_eq!(guard.lock_fd().is_some(), kind == "file");
            assert!(
                matches!(take(&fp, Duration::from_millis(20)), Claim::Busy),
                "{kind}"
            );
            assert!(
                matches!(take(&Fingerprint([2; 16]), Duration::ZERO), Claim::Held(_)),
                "{kind}: another key is free"
            );
            drop(held);
            assert!(
                matches!(take(&fp, Duration::ZERO), Claim::Held(_)),
                "{kind}"
            );
        }
    }

    #[test]
    fn an_in_process_claim_lets_a_waiter_in_when_it_is_dropped() {
        let local = Arc::new(LocalClaims::default());
        let fp = Fingerprint([3; 16]);
        let held = local.take((ns(), fp), Duration::ZERO);
        let waiter = {
            let local = Arc::clone(&local);
            std::thread::spawn(move || {
                let t = Instant::now();
                let got = local.take((ns(), fp), Duration::from_secs(10));
                (matches!(got, Claim::Held(_)), t.elapsed())
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        drop(held);
        let (held_then, waited) = waiter.join().expect("waiter");
        assert!(held_then);
        assert!(waited < Duration::from_secs(5), "{waited:?}");
    }

    fn ns() -> Namespace {
        Namespace::new("matmul").expect("valid")
    }
}
