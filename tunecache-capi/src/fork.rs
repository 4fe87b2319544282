//! `fork()` from a threaded process. A child has one thread, so the handles it inherits are
//! unusable there (their savers are gone): it opens its own, and the inherited ones answer
//! `TC_E_CLOSED`. Around the fork, every open cache's saver is paused, so no file lock taken
//! by a save is inherited (a child holding a copy would keep every other process waiting
//! until it exits), and the list of handles is locked, so the child never inherits it held.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cache_core::Cache;

use crate::handle::tc_cache;

/// How many forks this process descends from (counted in each child): a handle opened under
/// another count belongs to an ancestor.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Every cache handle ever opened (closed ones too: they are never freed).
static SHELLS: Mutex<Vec<&'static tc_cache>> = Mutex::new(Vec::new());

type Held = (MutexGuard<'static, Vec<&'static tc_cache>>, Vec<Arc<Cache>>);

thread_local! {
    /// What `prepare` took, until `parent` or `child` lets it go.
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// The fork generation of this process.
pub(crate) fn generation() -> u64 {
    GENERATION.load(Ordering::Relaxed)
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
    let _ = HELD.try_with(|h| *h.borrow_mut() = Some((shells, caches)));
}

extern "C" fn parent() {
    if let Ok(Some((shells, caches))) = HELD.try_with(|h| h.borrow_mut().take()) {
        for cache in &caches {
            cache.resume_saves();
        }
        drop(shells);
    }
}

extern "C" fn child() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
    if let Ok(Some((shells, caches))) = HELD.try_with(|h| h.borrow_mut().take()) {
        // Their saver threads do not exist here: dropping one would wait for them.
        std::mem::forget(caches);
        drop(shells);
    }
}
