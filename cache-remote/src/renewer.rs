//! The renewer: one thread per shared tier that keeps every lease this process holds alive,
//! renewing each every third of its time to live, and marks a lease lost when a renewal finds
//! it gone or held by another. One thread for all of them, started at the first lease and
//! stopping after a while without any, so taking a lease costs no thread of its own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::lease::{HeldLease, LeaseOp, LeaseReply};
use crate::store::Remote;

/// How long the thread stays once no lease is held.
const LINGER: Duration = Duration::from_secs(10);

/// One lease being renewed.
#[derive(Debug)]
pub(crate) struct Renewal {
    pub(crate) held: Arc<HeldLease>,
    ttl: Duration,
    /// A renewal found the lease gone or held by another.
    pub(crate) lost: AtomicBool,
    /// Its guard let it go: no more renewals, and a failed one in flight means nothing.
    pub(crate) stopped: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    /// The leases held, with when each is next renewed.
    held: Vec<(Arc<Renewal>, Instant)>,
    /// The process whose thread is running (none after a fork: the child starts its own).
    running: Option<u32>,
    /// When the thread next wakes by itself: a lease due later needs no wake-up call.
    wakes_at: Option<Instant>,
    /// The shortest renewal period seen: how long the thread waits while no lease is held,
    /// so a lease taken meanwhile is renewed in time without waking it.
    tick: Option<Duration>,
    shutdown: bool,
}

/// The leases of one shared tier and the thread that renews them.
#[derive(Debug, Default)]
pub(crate) struct Renewer {
    state: Mutex<State>,
    cv: Condvar,
}

impl Renewer {
    /// Starts renewing `held` (time to live `ttl`) through `remote`, each call within
    /// `budget`; the renewal's flags say how it went.
    pub(crate) fn add(
        self: &Arc<Self>,
        remote: &Arc<dyn Remote>,
        held: Arc<HeldLease>,
        ttl: Duration,
        budget: Duration,
    ) -> Arc<Renewal> {
        let renewal = Arc::new(Renewal {
            held,
            ttl,
            lost: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
        });
        let due = cache_core::deadline_after(ttl / 3);
        let mut st = crate::lock(&self.state);
        st.held.push((Arc::clone(&renewal), due));
        st.tick = Some(st.tick.map_or(ttl / 3, |t| t.min(ttl / 3)));
        let pid = std::process::id();
        if st.running != Some(pid) && !st.shutdown {
            let (this, remote) = (Arc::clone(self), Arc::clone(remote));
            let started = cache_core::spawn_background("tunecache-lease".to_owned(), move || {
                this.run(&remote, budget)
            });
            if started.is_ok() {
                st.running = Some(pid);
                st.wakes_at = None;
            }
        } else if st.wakes_at.is_none_or(|at| due < at) {
            self.cv.notify_all();
        }
        renewal
    }

    /// Stops renewing `renewal` (its guard is done with it).
    pub(crate) fn remove(&self, renewal: &Arc<Renewal>) {
        renewal.stopped.store(true, Ordering::Relaxed);
        crate::lock(&self.state)
            .held
            .retain(|(r, _)| !Arc::ptr_eq(r, renewal));
    }

    /// Stops the thread (the tier closes); leases still held are left to expire.
    pub(crate) fn shutdown(&self) {
        crate::lock(&self.state).shutdown = true;
        self.cv.notify_all();
    }

    /// The thread: carries out [`next`] (wait, renew what is due, or leave) until it says
    /// leave.
    fn run(&self, remote: &Arc<dyn Remote>, budget: Duration) {
        let mut idle_since = Instant::now();
        let mut st = crate::lock(&self.state);
        loop {
            let now = Instant::now();
            let dues: Vec<Instant> = st.held.iter().map(|(_, due)| *due).collect();
            if !dues.is_empty() {
                idle_since = now;
            }
            match next(&dues, st.shutdown, st.tick, idle_since, now) {
                Turn::Leave => {
                    st.running = None;
                    return;
                }
                Turn::Wait(until) => st = self.wait(st, until),
                Turn::Renew => {
                    let due: Vec<Arc<Renewal>> = st
                        .held
                        .iter_mut()
                        .filter(|(_, at)| *at <= now)
                        .map(|(r, at)| {
                            *at = now + r.ttl / 3;
                            Arc::clone(r)
                        })
                        .collect();
                    drop(st);
                    for renewal in due {
                        renew(remote.as_ref(), &renewal, budget);
                    }
                    st = crate::lock(&self.state);
                    st.held.retain(|(r, _)| !r.lost.load(Ordering::Relaxed));
                }
            }
        }
    }

    /// Waits until `until` or a wake-up call, saying when it will wake by itself.
    fn wait<'a>(
        &self,
        mut st: std::sync::MutexGuard<'a, State>,
        until: Instant,
    ) -> std::sync::MutexGuard<'a, State> {
        st.wakes_at = Some(until);
        let left = until.saturating_duration_since(Instant::now());
        let mut st = self
            .cv
            .wait_timeout(st, left)
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0;
        st.wakes_at = None;
        st
    }
}

/// What the renewer's thread does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Stop: the tier closed, or no lease was held for [`LINGER`].
    Leave,
    /// Sleep until then, or until woken (a lease taken that falls due sooner).
    Wait(Instant),
    /// Renew every lease due now.
    Renew,
}

/// The renewer's schedule, from the times the held leases fall `due`, whether the tier is
/// shutting down, the shortest renewal period seen (`tick`), since when no lease is held
/// (`idle_since`) and `now`. Pure: the thread only carries it out.
pub(crate) fn next(
    due: &[Instant],
    shutdown: bool,
    tick: Option<Duration>,
    idle_since: Instant,
    now: Instant,
) -> Turn {
    if shutdown {
        return Turn::Leave;
    }
    let Some(first) = due.iter().min() else {
        if now.saturating_duration_since(idle_since) >= LINGER {
            return Turn::Leave;
        }
        // Wake within a renewal period, so a lease taken meanwhile is renewed in time even
        // if its wake-up call is missed.
        return Turn::Wait(now + tick.unwrap_or(LINGER).min(LINGER));
    };
    if *first > now {
        Turn::Wait(*first)
    } else {
        Turn::Renew
    }
}

/// One renewal. A failed call is tried again at the next turn (the lease may expire
/// meanwhile); a lease found gone or held by another is lost, unless its guard let it go
/// while the call was out.
fn renew(remote: &dyn Remote, renewal: &Renewal, budget: Duration) {
    if renewal.stopped.load(Ordering::Relaxed) {
        return;
    }
    let held = &renewal.held;
    let op = LeaseOp::Renew {
        value: &held.value,
        ttl: renewal.ttl,
    };
    match remote.lease(&held.key, op, cache_core::deadline_after(budget)) {
        Ok(LeaseReply::Done) | Err(_) => {}
        Ok(_) if renewal.stopped.load(Ordering::Relaxed) => {}
        Ok(_) => {
            if !renewal.lost.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "tunecache: the lease on {} was lost while measuring (it expired or another \
                     process holds it): the fleet may measure this key twice",
                    held.key
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_renews_what_is_due_waits_for_the_next_and_leaves_when_idle_or_closed() {
        let now = Instant::now();
        let s = Duration::from_secs;
        // Shutting down wins over anything due.
        assert_eq!(next(&[now], true, None, now, now), Turn::Leave);
        // A lease due now or earlier is renewed; otherwise wait for the first due.
        assert_eq!(next(&[now + s(3), now], false, None, now, now), Turn::Renew);
        assert_eq!(
            next(&[now + s(3), now + s(1)], false, None, now, now),
            Turn::Wait(now + s(1))
        );
        // No lease: wait one tick (capped by the linger), and leave after lingering.
        assert_eq!(
            next(&[], false, Some(s(2)), now, now),
            Turn::Wait(now + s(2))
        );
        assert_eq!(
            next(&[], false, Some(s(60)), now, now),
            Turn::Wait(now + LINGER)
        );
        assert_eq!(next(&[], false, None, now, now), Turn::Wait(now + LINGER));
        assert_eq!(next(&[], false, Some(s(2)), now, now + LINGER), Turn::Leave);
        // An idle start "in the future" (a clock read late) does not leave early.
        assert_eq!(
            next(&[], false, Some(s(2)), now + s(5), now),
            Turn::Wait(now + s(2))
        );
    }
}
