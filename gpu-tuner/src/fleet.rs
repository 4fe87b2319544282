//! The tuner's view of a fleet: the processes that share results through a shared tier. A
//! [`Tuner`](crate::Tuner) given a [`Fleet`] ([`Tuner::with_fleet`](crate::Tuner::with_fleet))
//! leases a key before measuring it, so one process of the fleet measures it and the others
//! take its entry, and under [`Consistency::Fleet`](crate::Consistency::Fleet) it uses the
//! fleet's winners. Without one, every process measures for itself.
//!
//! This is the tuner's own small contract; with the `remote` feature, cache-remote's
//! [`RemoteHandle`](cache_remote::RemoteHandle) implements it, and [`of_cache`] finds a
//! cache's.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use cache_core::Namespace;
use cache_core::cache_format::{Entry, Fingerprint};

/// Fleet coordination, as the tuner uses it.
pub trait Fleet: Send + Sync + fmt::Debug {
    /// Before measuring a key of `ns` that neither the cache nor any tier has: leads the key
    /// for the fleet, or waits at most `wait` for the process that does.
    fn claim(&self, ns: Namespace, fp: &Fingerprint, wait: Duration) -> FleetClaim;

    /// The fleet's entries for the keys `fps` of `ns`, this cache's own published first
    /// (waiting at most `timeout`) and what is read merged into the cache; one per key,
    /// aligned with `fps` (`None`: the fleet lacks it).
    fn view(
        &self,
        ns: Namespace,
        fps: &[Fingerprint],
        timeout: Duration,
    ) -> Result<Vec<Option<Arc<Entry>>>, FleetError>;
}

/// What [`Fleet::claim`] gives.
#[derive(Debug)]
pub enum FleetClaim {
    /// This process measures the key for the fleet; finish the lease once the results are
    /// recorded.
    Lead(Box<dyn FleetLease>),
    /// Another process published the key while this one waited: its entry is in the cache.
    Published {
        /// Who measured it.
        by: String,
    },
    /// Measure here, without coordination; why, for the log.
    Alone(FleetError),
}

/// A key held for the fleet ([`FleetClaim::Lead`]); dropping it lets the others go on.
pub trait FleetLease: Send + fmt::Debug {
    /// Publishes what the cache recorded (waiting at most `timeout`), then lets it go.
    fn finish(self: Box<Self>, timeout: Duration) -> Result<(), FleetError>;
}

/// Why the fleet could not coordinate or be read: the tuner only reports it (the choice made
/// here stands), so it keeps the fleet's own error as it was.
#[derive(Debug, Clone)]
pub struct FleetError(Arc<dyn std::error::Error + Send + Sync>);

impl FleetError {
    /// Wraps the fleet's own error.
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        FleetError(Arc::new(error))
    }

    /// The fleet's own error, to downcast where its type is known.
    pub fn source_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

impl fmt::Display for FleetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for FleetError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

#[cfg(feature = "remote")]
mod remote {
    use super::*;
    use cache_remote::{LeaseGuard, RemoteCache as _, RemoteHandle};

    impl Fleet for RemoteHandle {
        fn claim(&self, ns: Namespace, fp: &Fingerprint, wait: Duration) -> FleetClaim {
            match RemoteHandle::claim(self, ns, fp, wait) {
                cache_remote::FleetClaim::Lead(lease) => FleetClaim::Lead(Box::new(lease)),
                cache_remote::FleetClaim::Published { by } => FleetClaim::Published { by },
                cache_remote::FleetClaim::Alone(why) => FleetClaim::Alone(FleetError::new(why)),
            }
        }

        fn view(
            &self,
            ns: Namespace,
            fps: &[Fingerprint],
            timeout: Duration,
        ) -> Result<Vec<Option<Arc<Entry>>>, FleetError> {
            RemoteHandle::view(self, ns, fps, timeout).map_err(FleetError::new)
        }
    }

    impl FleetLease for LeaseGuard {
        fn finish(self: Box<Self>, timeout: Duration) -> Result<(), FleetError> {
            LeaseGuard::finish(*self, timeout).map_err(FleetError::new)
        }
    }

    /// The fleet of `cache`'s shared tier, if it has one.
    pub fn of_cache(cache: &cache_core::Cache) -> Option<Arc<dyn Fleet>> {
        cache.remote().map(|r| r as Arc<dyn Fleet>)
    }
}

#[cfg(feature = "remote")]
pub use remote::of_cache;
