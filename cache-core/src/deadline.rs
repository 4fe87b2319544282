//! Deadlines from caller-given waits. A wait is anyone's to give (`--wait 1e19`,
//! `flush(timeout=1e18)` from Python, `TUNECACHE_REMOTE_TIMEOUT_MS` at its largest), and
//! `Instant + Duration` panics past what the clock can hold: every deadline is made here, and
//! a wait that long is as good as forever, never a panic.

use std::time::{Duration, Instant};

/// The longest wait a deadline is made for (a century): any longer one is taken as this.
pub(crate) const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The instant `wait` from now (see the module docs).
pub fn deadline_after(wait: Duration) -> Instant {
    deadline_from(Instant::now(), wait)
}

/// The instant `wait` after `start`, a wait past `FOREVER` taken as it (and, on a clock that
/// cannot hold even that, the farthest it can, halving down).
pub fn deadline_from(start: Instant, wait: Duration) -> Instant {
    let mut wait = wait.min(FOREVER);
    loop {
        if let Some(deadline) = start.checked_add(wait) {
            return deadline;
        }
        wait /= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_too_long_for_the_clock_is_forever_not_a_panic() {
        let now = Instant::now();
        let far = deadline_from(now, Duration::MAX);
        assert_eq!(far.duration_since(now), FOREVER);
        assert_eq!(
            deadline_from(now, Duration::from_secs_f64(1e19)),
            far,
            "a --wait 1e19"
        );
        assert_eq!(
            deadline_from(now, Duration::from_millis(1500)).duration_since(now),
            Duration::from_millis(1500),
            "an ordinary wait is as given"
        );
        assert!(deadline_after(Duration::ZERO) <= Instant::now());
    }
}
