//! What the shared tier did: its counters, as [`RemoteHealth`] (typed, for this crate's
//! callers) and as the generic [`TierHealth`] every tier of a cache reports.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use cache_core::TierHealth;

use crate::breaker::BreakerState;
use crate::options::RemoteMode;

/// What the shared tier did, for `tunecache stats` and a cache's health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteHealth {
    /// Where it is (no password).
    pub describe: String,
    /// What the cache does with it.
    pub mode: RemoteMode,
    /// Misses read from the remote and used.
    pub hits: u64,
    /// Misses the remote did not have either.
    pub misses: u64,
    /// Calls that passed their deadline.
    pub timeouts: u64,
    /// Calls that failed otherwise.
    pub errors: u64,
    /// Reads skipped because the breaker was open.
    pub skipped: u64,
    /// Remote values refused, by reason.
    pub rejected: BTreeMap<&'static str, u64>,
    /// Entries written to the server.
    pub published: u64,
    /// Entries the server already held in full (nothing written).
    pub unchanged: u64,
    /// Compare-and-set attempts that lost to another writer (and were retried).
    pub conflicts: u64,
    /// Entries waiting to be published.
    pub pending: usize,
    /// Fleet leases taken: keys this process measured for the fleet.
    pub leases: u64,
    /// Keys this process found leased by another and waited for.
    pub lease_waits: u64,
    /// Leases taken after waiting (the holder finished without the key, or died).
    pub takeovers: u64,
    /// The breaker.
    pub breaker: BreakerState,
    /// Whether writes are paused because the server was full.
    pub full: bool,
}

impl RemoteHealth {
    /// The same counters as a cache's tiers report them.
    pub fn to_tier_health(&self) -> TierHealth {
        let mut counters = BTreeMap::from([
            ("hits".to_owned(), self.hits),
            ("misses".to_owned(), self.misses),
            ("timeouts".to_owned(), self.timeouts),
            ("errors".to_owned(), self.errors),
            ("skipped".to_owned(), self.skipped),
            ("published".to_owned(), self.published),
            ("unchanged".to_owned(), self.unchanged),
            ("conflicts".to_owned(), self.conflicts),
            ("pending".to_owned(), self.pending as u64),
            ("leases".to_owned(), self.leases),
            ("lease waits".to_owned(), self.lease_waits),
            ("takeovers".to_owned(), self.takeovers),
        ]);
        for (why, n) in &self.rejected {
            counters.insert(format!("rejected: {why}"), *n);
        }
        TierHealth {
            name: "shared",
            describe: self.describe.clone(),
            available: self.breaker == BreakerState::Closed && !self.full,
            counters,
            state: None,
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) hits: AtomicU64,
    pub(crate) misses: AtomicU64,
    pub(crate) timeouts: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) skipped: AtomicU64,
    pub(crate) published: AtomicU64,
    pub(crate) unchanged: AtomicU64,
    pub(crate) conflicts: AtomicU64,
    pub(crate) leases: AtomicU64,
    pub(crate) lease_waits: AtomicU64,
    pub(crate) takeovers: AtomicU64,
    pub(crate) rejected: Mutex<BTreeMap<&'static str, u64>>,
}

impl Counters {
    pub(crate) fn bump(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    pub(crate) fn rejected(&self) -> BTreeMap<&'static str, u64> {
        crate::lock(&self.rejected).clone()
    }

    pub(crate) fn reject(&self, why: &'static str) {
        *crate::lock(&self.rejected).entry(why).or_default() += 1;
    }
}
