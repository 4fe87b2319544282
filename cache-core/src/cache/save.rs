//! One locked save: wait for the cache's lock, read what others wrote (through the gate), and
//! write the batch, with what must be written again along with it.

use std::time::Instant;

use cache_format::CacheData;

use super::{Shared, lock};
use crate::disk::{Changed, Disk, Failure, Incoming};
use crate::error::StoreError;
use crate::lock::{CacheLock, Patience};

impl Shared {
    /// The cache's lock, waited for the lock timeout; while a flush before exit waits (see
    /// `patient.rs`), as long as others holding it make progress, until that flush's budget.
    fn lock_patiently(&self, disk: &Disk) -> Result<CacheLock, StoreError> {
        let idle = self.saving.timings.lock_timeout;
        let start = Instant::now();
        let mut watch = super::patient::Watch::new(&disk.paths);
        let mut last_progress = start;
        CacheLock::acquire_patient(&disk.paths.lock, &disk.paths.dir, &mut |waited| {
            let now = Instant::now();
            let until = lock(&self.saving.state).patient.until;
            if until.is_some() && watch.moved() {
                last_progress = now;
                lock(&self.saving.state).patient.progress_seen = Some(now);
            }
            let cap = until.map_or(idle, |u| u.saturating_duration_since(start).max(idle));
            Patience { idle, cap }.next(waited, now - last_progress)
        })
    }

    /// One locked save: read others' updates (gated), then append or compact.
    #[allow(
        clippy::result_large_err,
        reason = "the batch must travel back to the queue on failure"
    )]
    pub(super) fn save_once(
        &self,
        disk: &mut Disk,
        mut batch: CacheData,
        rewrite: bool,
    ) -> Result<Incoming, (Failure, CacheData)> {
        let guard = match self.lock_patiently(disk) {
            Ok(g) => g,
            Err(e) => return Err((Failure::Retry(e), batch)),
        };
        let mut inc = match disk.read_updates(true) {
            Ok(inc) => inc,
            Err(f) => return Err((f, batch)),
        };
        // Rescued entries exist nowhere else now: they travel with the batch until written,
        // and into memory with the rest of what was read.
        let salvaged = std::mem::take(&mut inc.salvaged);
        batch.merge(salvaged.clone());
        inc.data.merge(salvaged);
        // A file replaced by one that may lack what this process recorded gets it again in
        // this save, so the flush waiting on it returns with it written (not a round later).
        let wrote_own = inc.replaced;
        if wrote_own {
            batch.merge(self.own_entries());
            inc.replaced = false;
        }
        let rewrite = rewrite || inc.needs_rewrite;
        inc.needs_rewrite = false;
        match disk.write(&batch, rewrite) {
            Ok(mut events) => {
                // A fold that met damaged entries lost what they held: this process's keys
                // among them are written again from memory at once (one more journal record).
                if events
                    .iter()
                    .any(|e| matches!(e, crate::disk::Event::DamagedTable { .. }))
                {
                    match disk.write(&self.own_entries(), false) {
                        Ok(more) => events.extend(more),
                        // The next save writes them.
                        Err(_) => inc.replaced = true,
                    }
                }
                drop(guard);
                inc.events.extend(events);
                // Lookups read what was just written (a new commit, the journal's new record);
                // memory changes only for what the read before the write found.
                let changed = match inc.view.take().map(|v| v.changed) {
                    None => Changed::Keys(Default::default()),
                    // This save wrote what this process recorded into the new file: nothing
                    // to write again.
                    Some(Changed::All { .. }) if wrote_own => Changed::All { faithful: true },
                    Some(changed) => changed,
                };
                inc.view = Some(disk.view(changed));
                Ok(inc)
            }
            Err(f) => {
                drop(guard);
                // Whatever was read is still good to absorb; the batch goes back to the queue.
                self.absorb(
                    Incoming {
                        salvaged: CacheData::new(),
                        needs_rewrite: false,
                        ..inc
                    },
                    false,
                );
                Err((f, batch))
            }
        }
    }
}
