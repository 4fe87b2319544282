//! What only a shared tier does, behind a handle of this crate: [`RemoteHandle`], which the
//! tier gives its cache when it opens ([`cache_core::TierContext::provide`]) and a caller
//! finds with [`RemoteCache::remote`]. A second shared tier gets a handle of its own; no
//! method is added to `Cache` or `Tier` for either.

use std::sync::Arc;
use std::time::Duration;

use cache_core::{Cache, Namespace};
use cache_format::{Entry, Fingerprint};

use crate::fleet::{self, FleetClaim};
use crate::health::RemoteHealth;
use crate::store::RemoteError;
use crate::tier::{CacheTier, ViewError};

/// A cache's shared tier, for what only it does: its counters, pulls, waiting for what was
/// recorded to be published, fleet leases and the fleet's view. Cheap to clone; it keeps the
/// tier (not the cache) alive.
#[derive(Debug, Clone)]
pub struct RemoteHandle {
    tier: Arc<CacheTier>,
}

impl RemoteHandle {
    pub(crate) fn new(tier: Arc<CacheTier>) -> Self {
        RemoteHandle { tier }
    }

    /// The tier's counters and state.
    pub fn health(&self) -> RemoteHealth {
        self.tier.remote_health()
    }

    /// Reads every entry of the cache's scope that the tier holds and merges them in (kept in
    /// the file as well); returns how many it held. For warming a fresh machine at start-up,
    /// or converging with what other machines published since.
    pub fn pull(&self, timeout: Duration) -> Result<usize, RemoteError> {
        let pulled = self.tier.pull_scope(cache_core::deadline_after(timeout))?;
        let n = pulled.len();
        self.tier.link.absorb(pulled);
        Ok(n)
    }

    /// Waits at most `timeout` until what was recorded so far is published (a command-line
    /// tool before it exits). A read-only tier: `Ok` at once.
    pub fn publish_within(&self, timeout: Duration) -> Result<(), RemoteError> {
        self.tier.publisher.publish_within(timeout)
    }

    /// Before measuring a key of `ns` that neither the cache nor any tier has: takes the key's
    /// lease, or waits at most `wait` for the process that holds it (see [`FleetClaim`]).
    pub fn claim(&self, ns: Namespace, fp: &Fingerprint, wait: Duration) -> FleetClaim {
        fleet::claim(&self.tier, ns, fp, wait)
    }

    /// The fleet's entries for the keys `fps` of `ns`: the cache's own entries for them are
    /// published first (by the merge rule: only what the tier lacks is written, waiting at
    /// most `timeout`), then the keys are read in one round trip within the tier's budget,
    /// whatever memory holds. What is read is merged into the cache (memory and file). One
    /// result per key, aligned with `fps` (`None`: the fleet lacks it).
    pub fn view(
        &self,
        ns: Namespace,
        fps: &[Fingerprint],
        timeout: Duration,
    ) -> Result<Vec<Option<Arc<Entry>>>, ViewError> {
        let view = self.tier.view(ns, fps, timeout)?;
        let found: Vec<(Namespace, Entry)> =
            view.iter().flatten().map(|e| (ns, e.clone())).collect();
        self.tier.link.absorb(found);
        Ok(view.into_iter().map(|e| e.map(Arc::new)).collect())
    }
}

/// The shared tier of a [`Cache`], and shortcuts for the calls a tool makes most.
pub trait RemoteCache {
    /// The cache's shared tier, if it has one.
    fn remote(&self) -> Option<Arc<RemoteHandle>>;

    /// [`RemoteHandle::health`], if the cache has a shared tier.
    fn remote_health(&self) -> Option<RemoteHealth> {
        self.remote().map(|r| r.health())
    }

    /// [`RemoteHandle::pull`]; without a shared tier, `Ok(0)`.
    fn pull_remote(&self, timeout: Duration) -> Result<usize, RemoteError> {
        self.remote().map_or(Ok(0), |r| r.pull(timeout))
    }

    /// [`RemoteHandle::publish_within`]; without a shared tier, `Ok` at once.
    fn publish_within(&self, timeout: Duration) -> Result<(), RemoteError> {
        self.remote().map_or(Ok(()), |r| r.publish_within(timeout))
    }
}

impl RemoteCache for Cache {
    fn remote(&self) -> Option<Arc<RemoteHandle>> {
        self.handle::<RemoteHandle>()
    }
}
