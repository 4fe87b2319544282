//! The shared tier of tunecache: what one machine measured, the others reuse.
//!
//! - [`Remote`] is the small byte store the tier sits on; every call takes a deadline and none
//!   may block past it. [`RedisRemote`] and [`RedisClusterRemote`] implement it on Redis with
//!   the `redis` crate's synchronous client (no async runtime); `MemoryRemote` (the `testing`
//!   feature) in process, for tests.
//! - The policy around it is here, the same for every backend: the key layout and the value
//!   (one entry in the checked snapshot envelope of files, read through the same version gate
//!   and migration; FORMAT.md, "Shared tier"), the checks a value must pass before it is
//!   used, a circuit breaker that keeps an unreachable server off the caller's path, the
//!   counters, and publishing by the one merge rule through a bounded compare-and-set loop.
//! - A [`cache_core::Cache`] gets the tier from [`RemoteBuilder::remote`] (a
//!   [`cache_core::Tier`]: read on a local miss, never on a hit; what is measured here is
//!   published from a thread of its own); what only a shared tier does (pull, wait for
//!   publishing, its counters, fleet leases and the fleet's view) is behind its
//!   [`RemoteHandle`], found with [`RemoteCache::remote`]. [`SharedTier`] is the same tier for tools
//!   without a cache (the CLI).
//!
//! ```no_run
//! use std::sync::Arc;
//! use cache_remote::RemoteBuilder as _;
//! # fn f(registry: cache_core::cache_migrate::Migrations) -> Result<(), cache_remote::ConfigError> {
//! let remote = cache_remote::RedisRemote::open("redis://cache.internal:6379/0")?;
//! let cache = cache_core::Cache::builder(registry).remote(Arc::new(remote)).open();
//! # Ok(()) }
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod breaker;
#[cfg(feature = "s3")]
mod dates;
mod fleet;
#[cfg(feature = "s3")]
mod generations;
#[cfg(any(feature = "testing", feature = "s3", test))]
mod glob;
mod handle;
mod health;
mod jitter;
mod layout;
mod lease;
mod leases;
#[cfg(feature = "testing")]
mod memory;
mod options;
mod policy;
mod publish;
mod publisher;
mod renewer;
mod server;
mod shared;
mod source;
mod store;
mod tier;
#[cfg(feature = "s3")]
pub mod trust;
mod value;

pub use breaker::BreakerState;
pub use fleet::{Alone, FinishError, FleetClaim, LeaseGuard};
#[cfg(feature = "s3")]
pub use generations::{
    GenerationError, Generations, Listed as GenerationListed, fetch_pinned, generation_dir,
    generation_id,
};
pub use handle::{RemoteCache, RemoteHandle};
pub use health::RemoteHealth;
pub use layout::remote_key;
pub use lease::{LeaseOp, LeaseReply, lease_key};
#[cfg(feature = "testing")]
pub use memory::MemoryRemote;
#[cfg(feature = "s3")]
pub use options::ENV_GENERATION;
pub use options::{RemoteMode, RemoteOptions};
#[cfg(feature = "cluster")]
pub use server::RedisClusterRemote;
#[cfg(feature = "s3")]
pub use server::S3Remote;
pub use server::{ConfigError, ENV_REMOTE, RedisRemote, connect, from_settings};
pub use shared::{Published, Pulled, SharedTier};
pub use source::RemoteBuilder;
pub use store::{Fence, Read, Remote, RemoteError, Swap, Swapped};
pub use tier::ViewError;
pub use value::encode_value;

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every critical section leaves its data consistent, so a poisoned mutex still guards
    // valid data.
    m.lock().unwrap_or_else(|p| p.into_inner())
}
