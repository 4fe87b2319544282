//! The cache's background rewrite of its file (a compaction, see `disk/compact.rs`): started
//! by the saver after a save once one is due, one at a time, on a thread of its own, so no
//! caller and no save waits for it. A closing cache lets it finish within the flush timeout,
//! then tells it to stop (it drops its copy; nothing changes on disk).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use super::notice::Notice;
use super::{Shared, lock};
use crate::disk::{Compacted, Disk};

/// Whether a rewrite failed on bytes of the file that do not read back (not on a bound, a
/// newer format or I/O).
fn is_damage(e: &crate::error::StoreError) -> bool {
    use cache_format::FormatError as F;
    matches!(
        e,
        crate::error::StoreError::Format { source, .. }
            if !matches!(
                source,
                F::TooMany { .. } | F::TooLarge { .. } | F::NewerFormat { .. } | F::NotTunecache { .. }
            )
    )
}

impl Shared {
    /// The next save rewrites the file (`Disk::write` with `rewrite`), which salvages what can be read
    /// and reports the damage; the save then writes this process's results again.
    fn rewrite_after_damage(&self) {
        let mut st = lock(&self.saving.state);
        st.rewrite = true;
        self.mark_dirty(&mut st);
    }
}

/// The cache's rewrites: the one in progress, if any.
#[derive(Debug, Default)]
pub(super) struct Compactor {
    running: Mutex<Option<Running>>,
}

/// A rewrite in progress.
#[derive(Debug)]
struct Running {
    handle: std::thread::JoinHandle<()>,
    done: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Compactor {
    /// Starts a rewrite of `shared`'s file if one is due and none runs; what it did is said
    /// through the cache's notices, if the cache is still open then.
    pub(super) fn maybe_start(&self, shared: &Arc<Shared>, disk: &Disk) {
        let mut slot = lock(&self.running);
        if slot
            .as_ref()
            .is_some_and(|r| !r.done.load(Ordering::Acquire))
        {
            return;
        }
        let Some(job) = disk.compaction_due() else {
            return;
        };
        if let Some(old) = slot.take() {
            let _ = old.handle.join();
        }
        let done = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let lock_timeout = shared.saving.timings.lock_timeout;
        let shared: Weak<Shared> = Arc::downgrade(shared);
        let spawned = crate::spawn_background("tunecache-compactor".into(), {
            let (done, stop) = (Arc::clone(&done), Arc::clone(&stop));
            move || {
                let result = job.run(&stop, lock_timeout);
                done.store(true, Ordering::Release);
                let Some(shared) = shared.upgrade() else {
                    return;
                };
                match result {
                    Ok(Compacted::Done { dropped, .. }) => {
                        shared.diag.notify(Notice::compacted(dropped));
                    }
                    Ok(Compacted::Dropped(why)) => {
                        shared.diag.notify(Notice::compaction_dropped(why))
                    }
                    Err(e) => {
                        // Damage the copy met (an entry or a node that does not read back):
                        // the next save rewrites the table from what can be read, keeping a
                        // copy of the file, and writes this process's results again.
                        if is_damage(&e) {
                            shared.rewrite_after_damage();
                        }
                        shared.diag.notify(Notice::compaction_failed(&e))
                    }
                }
            }
        });
        if let Ok(handle) = spawned {
            *slot = Some(Running { handle, done, stop });
        }
    }

    /// Lets a running rewrite finish within the flush timeout, then tells it to stop and
    /// waits a moment more; one still running after that is left to end on its own.
    pub(super) fn stop(&self, flush_timeout: Duration) {
        let Some(running) = lock(&self.running).take() else {
            return;
        };
        let finished = |by: Instant| {
            while !running.done.load(Ordering::Acquire) {
                if Instant::now() >= by {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            true
        };
        let mut done = finished(crate::deadline_after(flush_timeout));
        if !done {
            running.stop.store(true, Ordering::Release);
            done = finished(Instant::now() + Duration::from_secs(2));
        }
        if done {
            let _ = running.handle.join();
        }
    }
}
