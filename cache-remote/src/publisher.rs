//! The publisher: a thread per cache that sends what was recorded here to the server, never
//! on a caller's path. Keys are gathered for the cache's save delay, published within the
//! publish budget, and on failure kept for when the breaker lets calls out again; at shutdown
//! it makes one last bounded attempt. A thread of its own rather than a step of the saver: a
//! frozen server must not hold up the local file.
//!
//! When the next round is due is a pure function of the queue's state ([`next`]); the thread
//! itself (`CacheTier::run_publisher`) takes each round from here and gives back what it left.

use std::collections::HashSet;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cache_core::Namespace;
use cache_format::Fingerprint;

use crate::lease::{Fences, HeldLease};
use crate::store::RemoteError;

/// The publisher's queue.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    /// Keys recorded here and not yet on the server.
    pending: HashSet<(Namespace, Fingerprint)>,
    /// Since when the oldest pending key waits.
    since: Option<Instant>,
    /// Waits for everything queued so far (`publish_within`), and how many were served.
    requested: u64,
    served: u64,
    last_error: Option<RemoteError>,
    running: bool,
    shutdown: bool,
    /// The last attempt at shutdown was made.
    final_round: bool,
    /// Keys of the round in progress (taken from `pending`).
    in_flight: usize,
}

/// What the publisher does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Publish now (`force`: someone waits for it, so probe even while the breaker is open).
    Publish { force: bool },
    /// Sleep until then, or until woken.
    Sleep(Instant),
    /// Nothing queued: sleep until woken.
    Idle,
    /// Shut down.
    Stop,
}

/// The decision: from the queue, the time, the save delay and when the breaker lets the
/// next call out.
pub(crate) fn next(q: &Queue, now: Instant, delay: Duration, retry_at: Option<Instant>) -> Next {
    if q.shutdown && (q.pending.is_empty() || q.final_round) {
        return Next::Stop;
    }
    let wanted = q.requested > q.served;
    let Some(since) = q.since else {
        return Next::Idle;
    };
    let urgent = wanted || q.shutdown;
    let gathered = if urgent { now } else { since + delay };
    let due = match retry_at.filter(|_| !urgent) {
        Some(r) => r.max(gathered),
        None => gathered,
    };
    if due <= now {
        Next::Publish { force: wanted }
    } else {
        Next::Sleep(due)
    }
}

/// The queue and its condition variable.
#[derive(Debug, Default)]
pub(crate) struct Publisher {
    queue: Mutex<Queue>,
    cv: Condvar,
    /// The keys whose lease this process holds: their publications are fenced by it.
    fences: Mutex<Fences>,
}

impl Publisher {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        crate::lock(&self.queue)
    }

    fn wait<'a>(&self, q: MutexGuard<'a, Queue>, until: Option<Instant>) -> MutexGuard<'a, Queue> {
        match until {
            Some(at) => {
                let left = at.saturating_duration_since(Instant::now());
                self.cv
                    .wait_timeout(q, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
            None => self.cv.wait(q).unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// Marks the thread as started (before it is spawned, so a wait never misses it).
    pub(crate) fn set_running(&self, running: bool) {
        self.lock().running = running;
        self.cv.notify_all();
    }

    /// Queues keys recorded here.
    pub(crate) fn queue(&self, keys: &[(Namespace, Fingerprint)]) {
        let mut q = self.lock();
        let before = q.pending.len();
        q.pending.extend(keys.iter().copied());
        if q.pending.len() > before && q.since.is_none() {
            q.since = Some(Instant::now());
            self.cv.notify_all();
        }
    }

    /// Fences the publications of `(ns, fp)` by a lease this process holds, until
    /// [`Publisher::unfence`].
    pub(crate) fn fence(&self, ns: Namespace, fp: Fingerprint, held: Arc<HeldLease>) {
        crate::lock(&self.fences).insert((ns, fp), held);
    }

    /// Ends the fence of `(ns, fp)` if it is still `held`'s.
    pub(crate) fn unfence(&self, ns: Namespace, fp: Fingerprint, held: &Arc<HeldLease>) {
        let mut fences = crate::lock(&self.fences);
        if fences.get(&(ns, fp)).is_some_and(|h| Arc::ptr_eq(h, held)) {
            fences.remove(&(ns, fp));
        }
    }

    /// The fences now.
    pub(crate) fn fences(&self) -> Fences {
        crate::lock(&self.fences).clone()
    }

    /// Keys waiting.
    pub(crate) fn pending(&self) -> usize {
        self.lock().pending.len()
    }

    /// Waits at most `timeout` until everything queued so far was published (or a round
    /// failed); returns the error of the last round, if it failed.
    pub(crate) fn publish_within(&self, timeout: Duration) -> Result<(), RemoteError> {
        let deadline = cache_core::deadline_after(timeout);
        let mut q = self.lock();
        if !q.running || q.pending.is_empty() {
            return Ok(());
        }
        q.requested += 1;
        let request = q.requested;
        self.cv.notify_all();
        while q.served < request {
            if Instant::now() >= deadline || !q.running {
                // The keys of the round still running count: they are not published yet.
                return Err(RemoteError::Timeout(format!(
                    "{} entries not published after {timeout:?}",
                    q.pending.len() + q.in_flight
                )));
            }
            q = self.wait(q, Some(deadline));
        }
        match &q.last_error {
            Some(e) if !q.pending.is_empty() => Err(e.clone()),
            _ => Ok(()),
        }
    }

    /// Asks the thread to make its last round and stop, and waits for it as [`closes`] says:
    /// while the store answers (`answered` counts its replies), up to `cap`; a store silent
    /// for `silence` is given up on. Returns how many keys were not published (0: all were,
    /// or nothing was queued).
    pub(crate) fn stop(
        &self,
        silence: Duration,
        cap: Duration,
        answered: impl Fn() -> u64,
    ) -> usize {
        let start = Instant::now();
        let mut last = (answered(), start);
        let mut q = self.lock();
        q.shutdown = true;
        self.cv.notify_all();
        while q.running {
            let now = Instant::now();
            let seen = answered();
            if seen != last.0 {
                last = (seen, now);
            }
            match closes(now - start, now - last.1, silence, cap) {
                Some(left) => {
                    q = self.wait(q, Some(now + left.min(Duration::from_millis(50))));
                }
                None => return q.pending.len() + q.in_flight,
            }
        }
        q.pending.len()
    }
}

/// How much longer a closing tier waits for its last round (`None`: no longer), given the time
/// waited, the time since the store last answered (or since the wait began), how long a
/// silent store is waited for, and the cap (the publish budget). A store that answers keeps
/// its whole budget; one that does not answer costs a command its exit only `silence`.
pub(crate) fn closes(
    waited: Duration,
    since_answer: Duration,
    silence: Duration,
    cap: Duration,
) -> Option<Duration> {
    let left = cap
        .saturating_sub(waited)
        .min(silence.saturating_sub(since_answer));
    (!left.is_zero()).then_some(left)
}

/// A round the publisher thread is to make: the keys it took, whether someone waits for it
/// (probe even while the breaker is open), and the request count it serves.
#[derive(Debug)]
pub(crate) struct Round {
    pub(crate) keys: Vec<(Namespace, Fingerprint)>,
    pub(crate) force: bool,
    serving: u64,
}

impl Publisher {
    /// Waits until a round is due by [`next`] and takes its keys; `None` when the thread is
    /// to stop (marked stopped, its waiters served). `retry_at` says when the breaker lets
    /// the next call out.
    pub(crate) fn next_round(
        &self,
        delay: Duration,
        retry_at: impl Fn() -> Option<Instant>,
    ) -> Option<Round> {
        loop {
            let mut q = self.lock();
            let force = match next(&q, Instant::now(), delay, retry_at()) {
                Next::Stop => {
                    q.running = false;
                    q.served = q.requested;
                    self.cv.notify_all();
                    return None;
                }
                Next::Idle => {
                    q.served = q.requested;
                    self.cv.notify_all();
                    drop(self.wait(q, None));
                    continue;
                }
                Next::Sleep(at) => {
                    drop(self.wait(q, Some(at)));
                    continue;
                }
                Next::Publish { force } => force,
            };
            let serving = q.requested;
            q.final_round = q.shutdown;
            let keys: Vec<(Namespace, Fingerprint)> = q.pending.drain().collect();
            q.in_flight = keys.len();
            q.since = None;
            return Some(Round {
                keys,
                force,
                serving,
            });
        }
    }

    /// Ends `round`: the keys it `left` are queued again, its error kept for the waiters.
    pub(crate) fn end_round(
        &self,
        round: &Round,
        left: Vec<(Namespace, Fingerprint)>,
        error: Option<RemoteError>,
    ) {
        let mut q = self.lock();
        q.in_flight = 0;
        if !left.is_empty() {
            q.pending.extend(left);
            q.since.get_or_insert_with(Instant::now);
        }
        q.last_error = error;
        q.served = q.served.max(round.serving);
        self.cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closing_tier_waits_while_the_store_answers_and_briefly_when_it_does_not() {
        let s = Duration::from_secs;
        let (silence, cap) = (s(3), s(30));
        assert_eq!(closes(s(1), s(1), silence, cap), Some(s(2)));
        assert_eq!(
            closes(s(3), s(3), silence, cap),
            None,
            "silent for 3 s: given up"
        );
        assert_eq!(
            closes(s(20), s(1), silence, cap),
            Some(s(2)),
            "a store that answers keeps its budget"
        );
        assert_eq!(
            closes(s(30), s(0), silence, cap),
            None,
            "never past the budget"
        );
    }

    const DELAY: Duration = Duration::from_millis(250);

    fn queued(since: Instant) -> Queue {
        let mut q = Queue::default();
        q.pending.insert((
            Namespace::new("matmul").expect("valid"),
            Fingerprint([1; 16]),
        ));
        q.since = Some(since);
        q
    }

    #[test]
    fn an_empty_queue_idles_and_a_shutdown_with_nothing_left_stops() {
        let now = Instant::now();
        let mut q = Queue::default();
        assert_eq!(next(&q, now, DELAY, None), Next::Idle);
        q.shutdown = true;
        assert_eq!(next(&q, now, DELAY, None), Next::Stop);
    }

    #[test]
    fn keys_are_gathered_for_the_save_delay() {
        let t0 = Instant::now();
        let q = queued(t0);
        assert_eq!(next(&q, t0, DELAY, None), Next::Sleep(t0 + DELAY));
        assert_eq!(
            next(&q, t0 + DELAY, DELAY, None),
            Next::Publish { force: false }
        );
    }

    #[test]
    fn an_open_breaker_delays_a_round_unless_someone_waits_or_it_shuts_down() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(2);
        let mut q = queued(t0);
        assert_eq!(next(&q, t0 + DELAY, DELAY, Some(later)), Next::Sleep(later));
        q.requested = 1;
        assert_eq!(
            next(&q, t0, DELAY, Some(later)),
            Next::Publish { force: true },
            "a waiting caller probes at once"
        );
        q.requested = 0;
        q.shutdown = true;
        assert_eq!(
            next(&q, t0, DELAY, Some(later)),
            Next::Publish { force: false }
        );
        q.final_round = true;
        assert_eq!(
            next(&q, t0, DELAY, Some(later)),
            Next::Stop,
            "one last round only"
        );
    }
}
