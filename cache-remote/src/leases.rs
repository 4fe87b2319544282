//! The leases of one shared tier as state: the renewer of the leases this process holds, and
//! what waiting on leases never seen renewing has cost it. Below both the tier that keeps it
//! and the fleet's claims that use it (`fleet/`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::renewer::Renewer;

/// How long waiting on leases that were never seen renewing stays charged to a process: the
/// longest lease tunecache trusts (a holder that died holds its keys at most that long).
pub(crate) const STALL_MEMORY: Duration = Duration::from_secs(600);

/// Waiting charged to leases never seen renewing.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Spent {
    pub(crate) spent: Duration,
    pub(crate) since: Option<Instant>,
}

impl Spent {
    /// What is spent at `now`: forgotten [`STALL_MEMORY`] after it began.
    pub(crate) fn at(self, now: Instant) -> Spent {
        match self.since {
            Some(since) if now.saturating_duration_since(since) < STALL_MEMORY => self,
            _ => Spent::default(),
        }
    }

    /// `self` with `d` more spent (`d` taken back when negative: a lease seen renewing).
    pub(crate) fn charge(self, now: Instant, add: Duration, refund: Duration) -> Spent {
        let s = self.at(now);
        Spent {
            spent: (s.spent + add).saturating_sub(refund),
            since: Some(s.since.unwrap_or(now)),
        }
    }
}

/// The leases of one shared tier: the renewer of those held, and how long waiting on leases
/// never seen renewing has cost this process.
#[derive(Debug, Default)]
pub(crate) struct Leases {
    pub(crate) renewer: Arc<Renewer>,
    /// Time spent waiting on leases not (yet) seen renewing, since when it is counted.
    unrenewed: Mutex<Spent>,
}

impl Leases {
    pub(crate) fn spent(&self, now: Instant) -> Duration {
        crate::lock(&self.unrenewed).at(now).spent
    }

    pub(crate) fn charge(&self, add: Duration, refund: Duration) {
        let mut s = crate::lock(&self.unrenewed);
        *s = s.charge(Instant::now(), add, refund);
    }
}
