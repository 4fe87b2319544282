//! The saver thread: a pure decision (what to do next, given the queue's state and the time),
//! a pure back-off rule, and a small loop that carries them out. All file I/O of a cache
//! happens here, with no in-memory lock held.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cache_format::CacheData;

use super::notice::Notice;
use super::{Mode, Shared, State, lock};
use crate::disk::{Disk, Failure, Incoming};
use crate::error::StoreError;

/// What the saver sees when it decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Inputs {
    /// The cache writes its file (otherwise the saver only refreshes).
    pub(super) persistent: bool,
    /// The cache is closing.
    pub(super) shutdown: bool,
    /// Since when changes wait to be saved.
    pub(super) dirty_since: Option<Instant>,
    /// The snapshot must be rewritten (migrated, or unusable and not yet moved aside).
    pub(super) rewrite: bool,
    /// A caller waits in `flush()`.
    pub(super) flush_wanted: bool,
    /// A caller waits in `refresh()`.
    pub(super) refresh_wanted: bool,
    /// Failed saves in a row.
    pub(super) failures: u32,
    /// No retry before this, after a failure.
    pub(super) retry_at: Option<Instant>,
    /// When the periodic refresh is due.
    pub(super) next_refresh: Option<Instant>,
    /// How long changes are gathered before a save.
    pub(super) save_delay: Duration,
    /// Saves are held (`Cache::pause_saves`, around a `fork`).
    pub(super) paused: bool,
}

impl Inputs {
    fn of(
        st: &State,
        persistent: bool,
        next_refresh: Option<Instant>,
        save_delay: Duration,
    ) -> Self {
        Inputs {
            persistent,
            shutdown: st.shutdown,
            dirty_since: st.dirty_since,
            rewrite: st.rewrite,
            flush_wanted: st.flush_requested > st.flush_served,
            refresh_wanted: st.refresh_requested > st.refresh_served,
            failures: st.failures,
            retry_at: st.retry_at,
            next_refresh,
            save_delay,
            paused: st.paused > 0,
        }
    }
}

/// What the saver does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    /// Lock, read others' updates, write the queue.
    Save,
    /// Read others' updates without the lock.
    Refresh,
    /// Wait for a signal, or until this time.
    Sleep(Option<Instant>),
    /// Exit the thread.
    Stop,
}

/// The next action at `now`. A flush or a shutdown saves at once; otherwise changes are
/// gathered for `save_delay` and a failed save is retried no earlier than its back-off. A
/// shutdown ends the thread once nothing is left, or while a retry is still backing off and
/// no flush waits (drop must not wait out a long back-off; `close()` reports it).
pub(super) fn decide(i: &Inputs, now: Instant) -> Action {
    let dirty = i.persistent && (i.dirty_since.is_some() || i.rewrite);
    let backing_off = i.failures > 0 && i.retry_at.is_some_and(|r| r > now);
    if i.shutdown && (!dirty || backing_off && !i.flush_wanted) {
        return Action::Stop;
    }
    let save_due = if !i.persistent {
        None
    } else if i.flush_wanted || i.shutdown {
        Some(now)
    } else if dirty {
        let gathered = i.dirty_since.map_or(now, |d| d + i.save_delay);
        Some(i.retry_at.map_or(gathered, |r| r.max(gathered)))
    } else {
        None
    };
    if save_due.is_some_and(|d| d <= now) {
        if i.paused && !i.shutdown {
            // Resuming wakes the saver.
            return Action::Sleep(None);
        }
        return Action::Save;
    }
    if i.refresh_wanted || i.next_refresh.is_some_and(|r| r <= now) {
        return Action::Refresh;
    }
    Action::Sleep([save_due, i.next_refresh].into_iter().flatten().min())
}

/// How long to wait before retrying after `failures` failed saves in a row: the save delay
/// (at least 100 ms), doubled per failure, capped at `max`.
pub(super) fn backoff(failures: u32, save_delay: Duration, max: Duration) -> Duration {
    save_delay
        .max(Duration::from_millis(100))
        .saturating_mul(1 << failures.min(8))
        .min(max)
}

/// What a save took from the queue, to settle it afterwards.
#[derive(Debug, Clone, Copy)]
struct Job {
    /// The last change it covers.
    seq: u64,
    /// Whether it rewrites the snapshot.
    rewrite: bool,
    /// The flush requests it answers.
    serves: u64,
}

impl Shared {
    /// Starts the saver on its own thread; without one the cache stays in memory.
    pub(super) fn start_saver(
        self: &Arc<Self>,
        disk: Disk,
        mode: Mode,
    ) -> Option<std::thread::JoinHandle<()>> {
        lock(&self.saving.state).saver_running = true;
        let worker = Arc::clone(self);
        let spawned = crate::spawn_background("tunecache-saver".into(), move || {
            worker.run_saver(disk, mode)
        });
        match spawned {
            Ok(handle) => Some(handle),
            Err(e) => {
                lock(&self.saving.state).saver_running = false;
                self.diag.notify(Notice::no_saver(&e));
                let mut diag = self.diag.lock();
                diag.mode = Mode::Memory;
                diag.reason = Some(format!("no saver thread: {e}"));
                None
            }
        }
    }

    pub(super) fn run_saver(self: Arc<Self>, mut disk: Disk, mode: Mode) {
        let persistent = mode == Mode::Persistent;
        let mut next_refresh = self
            .saving
            .timings
            .refresh_interval
            .map(crate::deadline_after);
        loop {
            let mut st = lock(&self.saving.state);
            let now = Instant::now();
            match decide(
                &Inputs::of(
                    &st,
                    persistent,
                    next_refresh,
                    self.saving.timings.save_delay,
                ),
                now,
            ) {
                Action::Stop => {
                    let unsaved = st.dirty.len() + st.other.len();
                    st.saver_running = false;
                    self.saving.cv.notify_all();
                    drop(st);
                    if unsaved > 0 {
                        self.diag.notify(Notice::unsaved_at_exit(unsaved));
                    }
                    return;
                }
                Action::Sleep(until) => {
                    let _woken = match until {
                        Some(at) => {
                            self.saving
                                .cv
                                .wait_timeout(st, at.saturating_duration_since(now))
                                .unwrap_or_else(|p| p.into_inner())
                                .0
                        }
                        None => self.saving.cv.wait(st).unwrap_or_else(|p| p.into_inner()),
                    };
                }
                Action::Save => {
                    let batch = self.take_batch(&mut st);
                    let job = Job {
                        seq: st.put_seq,
                        rewrite: st.rewrite,
                        serves: st.flush_requested,
                    };
                    st.dirty_since = None;
                    st.saving = true;
                    drop(st);
                    let result = self.save_once(&mut disk, batch, job.rewrite);
                    let settled = self.settle(job, result);
                    if matches!(settled, Settled::Saved) {
                        self.compactor.maybe_start(&self, &disk);
                    }
                    {
                        let mut st = lock(&self.saving.state);
                        st.saving = false;
                        self.saving.cv.notify_all();
                    }
                    match settled {
                        Settled::Saved => {
                            next_refresh = self
                                .saving
                                .timings
                                .refresh_interval
                                .map(crate::deadline_after);
                        }
                        Settled::Retry => {}
                        Settled::Blocked => return,
                    }
                }
                Action::Refresh => {
                    let serving = st.refresh_requested;
                    drop(st);
                    match disk.read_updates(false) {
                        Ok(inc) => self.absorb(inc, persistent),
                        Err(Failure::Blocked(b)) => {
                            let mut st = lock(&self.saving.state);
                            st.saver_running = false;
                            self.saving.cv.notify_all();
                            drop(st);
                            self.diag.block(&b.path, &b.cause.to_string());
                            return;
                        }
                        Err(Failure::Retry(e)) => self.diag.notify(Notice::refresh_failed(&e)),
                    }
                    next_refresh = self
                        .saving
                        .timings
                        .refresh_interval
                        .map(crate::deadline_after);
                    let mut st = lock(&self.saving.state);
                    st.refresh_served = st.refresh_served.max(serving);
                    self.saving.cv.notify_all();
                }
            }
        }
    }

    /// Records the outcome of a save in the queue's state and wakes the waiting callers.
    fn settle(&self, job: Job, result: Result<Incoming, (Failure, CacheData)>) -> Settled {
        let (failure, batch) = match result {
            Ok(inc) => {
                let mut st = lock(&self.saving.state);
                st.durable_seq = st.durable_seq.max(job.seq);
                if job.rewrite {
                    st.rewrite = false;
                }
                st.last_error = None;
                st.retry_at = None;
                st.failures = 0;
                drop(st);
                // What the save read from other processes comes into memory before the
                // flushers wake, so a flush also makes their results visible here.
                self.absorb(inc, true);
                let mut st = lock(&self.saving.state);
                st.flush_served = job.serves;
                self.saving.cv.notify_all();
                return Settled::Saved;
            }
            Err(e) => e,
        };
        let mut st = lock(&self.saving.state);
        self.requeue(&mut st, batch);
        st.rewrite |= job.rewrite;
        st.dirty_since.get_or_insert_with(Instant::now);
        st.flush_served = job.serves;
        match failure {
            Failure::Blocked(b) => {
                let reason = b.cause.to_string();
                st.last_error = Some(StoreError::NotPersistent {
                    reason: reason.clone(),
                });
                st.saver_running = false;
                self.saving.cv.notify_all();
                drop(st);
                self.diag.block(&b.path, &reason);
                Settled::Blocked
            }
            Failure::Retry(e) => {
                st.failures += 1;
                st.retry_at = Some(
                    Instant::now()
                        + backoff(
                            st.failures,
                            self.saving.timings.save_delay,
                            self.saving.timings.max_retry_delay,
                        ),
                );
                let notice = Notice::save_failed(&e);
                st.last_error = Some(e);
                self.saving.cv.notify_all();
                drop(st);
                self.diag.notify(notice);
                Settled::Retry
            }
        }
    }
}

/// How a save ended, for the loop.
enum Settled {
    Saved,
    Retry,
    /// The file must not be written by this build: the saver stops.
    Blocked,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle(now: Instant) -> Inputs {
        let _ = now;
        Inputs {
            persistent: true,
            shutdown: false,
            dirty_since: None,
            rewrite: false,
            flush_wanted: false,
            refresh_wanted: false,
            failures: 0,
            retry_at: None,
            next_refresh: None,
            save_delay: Duration::from_millis(250),
            paused: false,
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_clean_cache_sleeps_until_woken_or_the_refresh() {
        let now = Instant::now();
        assert_eq!(decide(&idle(now), now), Action::Sleep(None));
        let refresh = now + ms(900);
        let i = Inputs {
            next_refresh: Some(refresh),
            ..idle(now)
        };
        assert_eq!(decide(&i, now), Action::Sleep(Some(refresh)));
        assert_eq!(decide(&i, refresh), Action::Refresh);
    }

    #[test]
    fn changes_are_gathered_for_the_save_delay() {
        let now = Instant::now();
        let i = Inputs {
            dirty_since: Some(now),
            ..idle(now)
        };
        assert_eq!(decide(&i, now), Action::Sleep(Some(now + ms(250))));
        assert_eq!(
            decide(&i, now + ms(249)),
            Action::Sleep(Some(now + ms(250)))
        );
        assert_eq!(decide(&i, now + ms(250)), Action::Save);
    }

    #[test]
    fn a_flush_saves_at_once_even_during_a_back_off() {
        let now = Instant::now();
        let i = Inputs {
            dirty_since: Some(now),
            flush_wanted: true,
            failures: 3,
            retry_at: Some(now + ms(5000)),
            ..idle(now)
        };
        assert_eq!(decide(&i, now), Action::Save);
    }

    #[test]
    fn a_failed_save_is_retried_no_earlier_than_its_back_off() {
        let now = Instant::now();
        let retry = now + ms(800);
        let i = Inputs {
            dirty_since: Some(now),
            failures: 1,
            retry_at: Some(retry),
            ..idle(now)
        };
        assert_eq!(decide(&i, now + ms(300)), Action::Sleep(Some(retry)));
        assert_eq!(decide(&i, retry), Action::Save);
    }

    #[test]
    fn a_pending_rewrite_is_a_change() {
        let now = Instant::now();
        let i = Inputs {
            rewrite: true,
            ..idle(now)
        };
        assert_eq!(decide(&i, now), Action::Save, "no dirty time: due at once");
    }

    #[test]
    fn shutdown_saves_what_is_left_then_stops() {
        let now = Instant::now();
        let dirty = Inputs {
            shutdown: true,
            dirty_since: Some(now),
            ..idle(now)
        };
        assert_eq!(
            decide(&dirty, now),
            Action::Save,
            "no gathering at shutdown"
        );
        let clean = Inputs {
            shutdown: true,
            ..idle(now)
        };
        assert_eq!(decide(&clean, now), Action::Stop);
    }

    #[test]
    fn shutdown_does_not_wait_out_a_back_off_unless_a_flush_waits() {
        let now = Instant::now();
        let i = Inputs {
            shutdown: true,
            dirty_since: Some(now),
            failures: 2,
            retry_at: Some(now + ms(10_000)),
            ..idle(now)
        };
        assert_eq!(decide(&i, now), Action::Stop);
        let flushing = Inputs {
            flush_wanted: true,
            ..i
        };
        assert_eq!(decide(&flushing, now), Action::Save);
        assert_eq!(decide(&i, now + ms(10_000)), Action::Save, "back-off over");
    }

    #[test]
    fn a_read_only_cache_never_saves_but_refreshes() {
        let now = Instant::now();
        let i = Inputs {
            persistent: false,
            dirty_since: Some(now),
            flush_wanted: true,
            refresh_wanted: true,
            ..idle(now)
        };
        assert_eq!(decide(&i, now + ms(1000)), Action::Refresh);
        let shutdown = Inputs {
            shutdown: true,
            ..i
        };
        assert_eq!(decide(&shutdown, now), Action::Stop);
    }

    #[test]
    fn a_refresh_request_waits_behind_a_due_save() {
        let now = Instant::now();
        let i = Inputs {
            dirty_since: Some(now),
            refresh_wanted: true,
            ..idle(now)
        };
        assert_eq!(decide(&i, now), Action::Refresh, "the save is not due yet");
        assert_eq!(decide(&i, now + ms(250)), Action::Save);
    }

    #[test]
    fn a_paused_saver_starts_no_save_until_resumed_but_still_stops() {
        let now = Instant::now();
        let i = Inputs {
            flush_wanted: true,
            dirty_since: Some(now),
            paused: true,
            ..idle(now)
        };
        assert_eq!(decide(&i, now + ms(1000)), Action::Sleep(None));
        assert_eq!(decide(&Inputs { paused: false, ..i }, now), Action::Save);
        let closing = Inputs {
            shutdown: true,
            ..i
        };
        assert_eq!(decide(&closing, now), Action::Save, "closing saves anyway");
    }

    #[test]
    fn back_off_doubles_from_the_save_delay_and_is_capped() {
        let max = Duration::from_secs(30);
        assert_eq!(backoff(1, ms(250), max), ms(500));
        assert_eq!(backoff(2, ms(250), max), ms(1000));
        assert_eq!(backoff(1, ms(0), max), ms(200), "at least 100 ms doubled");
        assert_eq!(backoff(50, ms(250), max), max);
        assert_eq!(backoff(u32::MAX, Duration::MAX, max), max, "no overflow");
    }
}
