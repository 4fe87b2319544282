//! The circuit breaker: after an outage, calls are skipped for a back-off that doubles from
//! 100 ms up to 2 s; when it has passed, one caller probes (the others keep skipping) and
//! either closes the breaker or opens it again for longer. One warning per outage. A full
//! server pauses writes for a cool-down, separately.

use std::time::{Duration, Instant};

/// The state of the circuit breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go to the server.
    Closed,
    /// The server failed; calls are skipped until the next probe.
    Open {
        /// Failures in a row.
        failures: u32,
    },
}

#[derive(Debug, Default)]
pub(crate) struct Breaker {
    failures: u32,
    open_until: Option<Instant>,
    pub(crate) full_until: Option<Instant>,
}

pub(crate) const BREAKER_FIRST: Duration = Duration::from_millis(100);
pub(crate) const BREAKER_MAX: Duration = Duration::from_secs(2);

impl Breaker {
    /// Whether a call may go out now. A call after the back-off is the probe: others wait
    /// for its outcome (at most `probe`).
    pub(crate) fn allow(&mut self, now: Instant, probe: Duration) -> bool {
        match self.open_until {
            None => true,
            Some(t) if now >= t => {
                self.open_until = Some(now + probe);
                true
            }
            Some(_) => false,
        }
    }

    /// Records an outage; returns whether it is a new one (to warn once).
    pub(crate) fn failure(&mut self, now: Instant) -> bool {
        self.failures = self.failures.saturating_add(1);
        let backoff = BREAKER_FIRST
            .saturating_mul(1 << (self.failures - 1).min(8))
            .min(BREAKER_MAX);
        self.open_until = Some(now + backoff);
        self.failures == 1
    }

    /// Records a success; returns whether it ends an outage.
    pub(crate) fn success(&mut self) -> bool {
        let recovered = self.failures > 0;
        self.failures = 0;
        self.open_until = None;
        recovered
    }

    /// When the next call may go out, if not now.
    pub(crate) fn open_until(&self) -> Option<Instant> {
        self.open_until.filter(|_| self.failures > 0)
    }

    pub(crate) fn state(&self) -> BreakerState {
        if self.failures == 0 {
            BreakerState::Closed
        } else {
            BreakerState::Open {
                failures: self.failures,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_breaker_backs_off_doubling_to_its_cap_and_one_probe_goes_out() {
        let mut b = Breaker::default();
        let t0 = Instant::now();
        assert!(b.allow(t0, Duration::from_millis(50)));
        assert!(b.failure(t0), "the first failure is a new outage");
        assert!(!b.allow(t0 + Duration::from_millis(99), Duration::from_millis(50)));
        let t1 = t0 + Duration::from_millis(100);
        assert!(b.allow(t1, Duration::from_millis(50)), "the probe");
        assert!(
            !b.allow(t1, Duration::from_millis(50)),
            "others wait for the probe"
        );
        assert!(!b.failure(t1), "the same outage: no second warning");
        assert!(!b.allow(t1 + Duration::from_millis(199), Duration::ZERO));
        for _ in 0..20 {
            b.failure(t1);
        }
        assert_eq!(b.open_until, Some(t1 + BREAKER_MAX));
        assert!(b.success(), "recovered");
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.allow(t1, Duration::ZERO));
    }
}
