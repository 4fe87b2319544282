//! The counters of one tuned operation. Hits are counted on the hot path, so their counter is
//! striped over cache lines: threads hitting at once do not contend on one.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crossbeam_utils::CachePadded;

use super::TuneStats;

/// A counter split over cache lines.
#[derive(Default)]
pub(super) struct Striped([CachePadded<AtomicU64>; 8]);

impl Striped {
    #[inline]
    pub(super) fn add(&self, n: u64) {
        thread_local! {
            static STRIPE: usize = {
                static NEXT: AtomicU64 = AtomicU64::new(0);
                (NEXT.fetch_add(1, Ordering::Relaxed) % 8) as usize
            };
        }
        let i = STRIPE.with(|s| *s);
        self.0[i].fetch_add(n, Ordering::Relaxed);
    }

    fn sum(&self) -> u64 {
        self.0.iter().map(|p| p.load(Ordering::Relaxed)).sum()
    }
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) hits: Striped,
    pub(super) misses: AtomicU64,
    pub(super) tuned_keys: AtomicU64,
    pub(super) reused_keys: AtomicU64,
    pub(super) bucketed_keys: AtomicU64,
    pub(super) measured: AtomicU64,
    pub(super) provisional: AtomicU64,
    pub(super) failures: AtomicU64,
    pub(super) remote_checked: AtomicU64,
    pub(super) remote_refused: AtomicU64,
    pub(super) remote_distrusted: AtomicU64,
    /// Whether a distrusted winner was said (once per operation, at warn level).
    pub(super) distrust_said: AtomicBool,
    pub(super) tuning_ns: AtomicU64,
    pub(super) saved_ns: AtomicU64,
    pub(super) fleet_adopted: AtomicU64,
    pub(super) loose_hits: AtomicU64,
}

impl Counters {
    pub(super) fn snapshot(&self) -> TuneStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        TuneStats {
            hits: self.hits.sum(),
            misses: get(&self.misses),
            tuned_keys: get(&self.tuned_keys),
            reused_keys: get(&self.reused_keys),
            bucketed_keys: get(&self.bucketed_keys),
            measured: get(&self.measured),
            provisional: get(&self.provisional),
            failures: get(&self.failures),
            remote_checked: get(&self.remote_checked),
            remote_refused: get(&self.remote_refused),
            remote_distrusted: get(&self.remote_distrusted),
            tuning_time: Duration::from_nanos(get(&self.tuning_ns)),
            saved_time: Duration::from_nanos(get(&self.saved_ns)),
            fleet_adopted: get(&self.fleet_adopted),
            loose_hits: get(&self.loose_hits),
        }
    }
}
