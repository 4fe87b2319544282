//! The cache's background rewrite of its file (a compaction, see `disk/compact.rs`): started
//! by the saver after a save once one is due, one at a time, on a thread of its own, so no
//! caller and no save waits for it. A closing cache lets it finish within the flush timeout,
//! then tells it to stop (it drops its copy; nothing changes on disk).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::notice::Notice;
use super::{Shared, lock};
use crate::disk::{Compacted, Disk};

/// A rewrite in progress.
#[derive(Debug)]
pub(crate) struct Running {
    handle: std::thread::JoinHandle<()>,
    done: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Shared {
    /// Starts a rewrite of the file if one is due and none runs.
    pub(super) fn maybe_compact(self: &Arc<Self>, disk: &Disk) {
        let mut slot = lock(&self.compactor);
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
        let shared: Weak<Shared> = Arc::downgrade(self);
        let lock_timeout = self.timings.lock_timeout;
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
                        shared.notify(Notice::compacted(dropped));
                    }
                    Ok(Compacted::Dropped(why)) => shared.notify(Notice::compaction_dropped(why)),
                    Err(e) => shared.notify(Notice::compaction_failed(&e)),
                }
            }
        });
        if let Ok(handle) = spawned {
            *slot = Some(Running { handle, done, stop });
        }
    }

    /// Lets a running rewrite finish within the flush timeout, then tells it to stop and
    /// waits a moment more; one still running after that is left to end on its own.
    pub(super) fn stop_compactor(&self) {
        let Some(running) = lock(&self.compactor).take() else {
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
        let mut done = finished(crate::deadline_after(self.timings.flush_timeout));
        if !done {
            running.stop.store(true, Ordering::Release);
            done = finished(Instant::now() + Duration::from_secs(2));
        }
        if done {
            let _ = running.handle.join();
        }
    }
}
