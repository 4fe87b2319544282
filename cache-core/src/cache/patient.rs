//! Waiting out other processes' saves before this one ends. A pool of hundreds of workers that
//! end together queue for one cache lock; a worker whose exit flush gave up after the lock
//! timeout lost its results while the lock was busy with saves that were all moving. Here an
//! exit flush goes on waiting as long as the writers ahead of it make progress (each save they
//! finish changes the cache's files, which the saver watches while it waits), up to a budget,
//! and gives up only on a holder that makes none for the lock timeout (stuck, frozen) or past
//! the budget, which the error then names.

use std::time::{Duration, Instant};

use super::{Cache, lock};
use crate::error::StoreError;
use crate::fsio::{self, FileId};

/// What a patient flush and the saver share (in the queue's state).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Patient {
    /// A flush before exit waits until then: the saver waits for the lock as long as others
    /// progress, until then at most.
    pub(super) until: Option<Instant>,
    /// When the saver, waiting for the lock, last saw another process's save land.
    pub(super) progress_seen: Option<Instant>,
}

/// Whether a flush before exit that timed out goes on: others made progress within `idle`
/// (the lock timeout) of `now`, and the budget is not spent.
pub(super) fn goes_on(
    waited: Duration,
    budget: Duration,
    since_progress: Option<Duration>,
    idle: Duration,
) -> bool {
    waited < budget && since_progress.is_some_and(|s| s < idle)
}

impl Cache {
    /// [`Cache::flush_within`] for a process about to end: past `timeout`, it goes on waiting
    /// while the save is queued behind other processes that are saving (their saves landing
    /// on the cache's files are the proof of progress), up to `budget` in all. A lock holder
    /// that makes no progress for the lock timeout is given up on as by `flush_within`.
    /// Past the budget: `FlushTimeout` with the time waited.
    pub fn flush_before_exit(&self, timeout: Duration, budget: Duration) -> Result<(), StoreError> {
        let start = Instant::now();
        {
            let mut st = lock(&self.shared.saving.state);
            let until = crate::deadline_after(budget);
            st.patient.until = Some(st.patient.until.map_or(until, |u| u.max(until)));
        }
        let idle = self.shared.saving.timings.lock_timeout;
        loop {
            let round = timeout
                .min(budget.saturating_sub(start.elapsed()))
                .max(Duration::from_millis(1));
            match self.flush_inner(round) {
                Ok(()) => return Ok(()),
                Err(e @ (StoreError::FlushTimeout(_) | StoreError::LockTimeout { .. })) => {
                    let seen = lock(&self.shared.saving.state).patient.progress_seen;
                    if !goes_on(start.elapsed(), budget, seen.map(|t| t.elapsed()), idle) {
                        return Err(match e {
                            StoreError::FlushTimeout(_) => {
                                StoreError::FlushTimeout(start.elapsed())
                            }
                            other => other,
                        });
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// The cache's files as they are now: a change is another writer's save landing.
#[derive(Debug)]
pub(super) struct Watch<'a> {
    paths: &'a crate::disk::Paths,
    last: [Option<FileId>; 2],
}

impl<'a> Watch<'a> {
    pub(super) fn new(paths: &'a crate::disk::Paths) -> Watch<'a> {
        let mut w = Watch {
            paths,
            last: [None, None],
        };
        w.moved();
        w
    }

    /// Whether the table or the journal changed since the last look.
    pub(super) fn moved(&mut self) -> bool {
        let id = |p| fsio::stat(p).ok().flatten().map(|m| FileId::of(&m));
        let now = [id(&self.paths.snapshot), id(&self.paths.journal)];
        let moved = now != self.last;
        self.last = now;
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::goes_on;
    use std::time::Duration;

    #[test]
    fn an_exit_flush_goes_on_while_others_progress_within_its_budget() {
        let s = Duration::from_secs;
        assert!(
            goes_on(s(10), s(120), Some(s(1)), s(2)),
            "others saved a second ago"
        );
        assert!(
            !goes_on(s(10), s(120), Some(s(3)), s(2)),
            "nothing for the lock timeout"
        );
        assert!(
            !goes_on(s(10), s(120), None, s(2)),
            "never any progress: a stuck holder"
        );
        assert!(
            !goes_on(s(120), s(120), Some(s(0)), s(2)),
            "the budget is spent"
        );
    }
}
