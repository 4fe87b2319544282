//! `fork()` from a threaded process. A child has one thread, so the handles it inherits are
//! unusable there (their savers are gone): it opens its own, and the inherited ones answer
//! `TC_E_CLOSED`. Around the fork, every open cache's saver is paused, so no file lock taken
//! by a save is inherited (a child holding a copy would keep every other process waiting
//! until it exits), and the list of handles is locked, so the child never inherits it held.
//! The child closes its copies of the descriptors of the claims held at the fork (without
//! unlocking: the lock is the parent's too), so it never keeps a key claimed after its parent
//! let go or died; a claim inherited that way is dropped without unlocking when released.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cache_core::Cache;

use crate::handle::tc_cache;

/// How many forks this process descends from (counted in each child): a handle opened under
/// another count belongs to an ancestor.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Every cache handle ever opened (closed ones too: they are never freed).
static SHELLS: Mutex<Vec<&'static tc_cache>> = Mutex::new(Vec::new());

/// The descriptors of the file claims held now (`crate::claim`).
static CLAIM_FDS: Mutex<BTreeSet<RawFd>> = Mutex::new(BTreeSet::new());

type Held = (
    MutexGuard<'static, Vec<&'static tc_cache>>,
    MutexGuard<'static, BTreeSet<RawFd>>,
    Vec<Arc<Cache>>,
);

thread_local! {
    /// What `prepare` took, until `parent` or `child` lets it go.
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// The fork generation of this process.
pub(crate) fn generation() -> u64 {
    GENERATION.load(Ordering::Relaxed)
}

/// A file claim is held on `fd` (until [`claim_released`]).
pub(crate) fn claim_held(fd: RawFd) {
    CLAIM_FDS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(fd);
}

/// The file claim on `fd` is let go.
pub(crate) fn claim_released(fd: RawFd) {
    CLAIM_FDS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&fd);
}

/// Keeps `shell` reachable for the life of the process, and the hooks registered.
pub(crate) fn register(shell: &'static tc_cache) {
    register_hooks();
    SHELLS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(shell);
}

fn register_hooks() {
    static REGISTERED: AtomicBool = AtomicBool::new(false);
    if REGISTERED
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        // Prepare hooks run in the reverse order of registration, and ours waits for a save in
        // progress, which may intern a namespace: cache-core's namespace table (a fork-safe
        // lock, taken by its own prepare hook) must be registered first, so that its hook runs
        // after ours. Interning a name registers it.
        let _ = cache_core::Namespace::new("tunecache");
        // SAFETY: the hooks are `extern "C"` functions that live as long as the process.
        let rc = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
        if rc != 0 {
            tracing::warn!(
                "tunecache: cannot register fork hooks (error {rc}): a fork while a cache saves may hold its lock in the child"
            );
        }
    }
}

extern "C" fn prepare() {
    let shells = SHELLS.lock().unwrap_or_else(PoisonError::into_inner);
    let caches: Vec<Arc<Cache>> = shells.iter().filter_map(|s| s.current()).collect();
    for cache in &caches {
        cache.pause_saves();
    }
    let fds = CLAIM_FDS.lock().unwrap_or_else(PoisonError::into_inner);
    let _ = HELD.try_with(|h| *h.borrow_mut() = Some((shells, fds, caches)));
}

extern "C" fn parent() {
    if let Ok(Some((shells, fds, caches))) = HELD.try_with(|h| h.borrow_mut().take()) {
        for cache in &caches {
            cache.resume_saves();
        }
        drop((fds, shells));
    }
}

extern "C" fn child() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
    if let Ok(Some((shells, mut fds, caches))) = HELD.try_with(|h| h.borrow_mut().take()) {
        // Their saver threads do not exist here: dropping one would wait for them.
        std::mem::forget(caches);
        for fd in std::mem::take(&mut *fds) {
            // SAFETY: a descriptor of a claim this process inherited; its guard is never
            // dropped here (a release in this generation forgets it), so nothing else closes it.
            unsafe { libc::close(fd) };
        }
        drop((fds, shells));
    }
}
