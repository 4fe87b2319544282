//! The `Store` trait: what every tier offers.

use std::sync::Arc;

use cache_format::{Entry, Fingerprint, Key};

use crate::error::StoreError;
use crate::namespace::Namespace;

/// A place that remembers entries by namespace and key fingerprint.
///
/// Tiers compose: the disk-backed [`crate::Cache`] is a store that keeps a
/// [`crate::MemoryStore`] in front of its files. A miss is `None`, not an error; a tier that
/// cannot reach its backing storage degrades and says so once, it does not fail lookups.
pub trait Store: Send + Sync {
    /// The entry recorded for `fp` in `ns`, if any.
    fn get(&self, ns: Namespace, fp: &Fingerprint) -> Option<Arc<Entry>>;

    /// Merges `entry` into what is recorded for its key (see `Entry::merge`). Never blocks
    /// on I/O; a persistent store makes it durable later or on [`Store::flush`]. An entry that
    /// no reader could read back is refused with [`StoreError::Refused`] and nothing of it is
    /// recorded.
    fn try_put(&self, ns: Namespace, entry: Entry) -> Result<(), StoreError>;

    /// [`Store::try_put`] for callers that have nothing to do with a refusal: the store
    /// reports it its own way (a `Cache` logs a warning, once per condition).
    fn put(&self, ns: Namespace, entry: Entry) {
        let _ = self.try_put(ns, entry);
    }

    /// Makes everything put so far durable, waiting a bounded time.
    fn flush(&self) -> Result<(), StoreError>;

    /// The entry recorded for `key` in `ns` (fingerprints the key, then [`Store::get`]).
    fn lookup(&self, ns: Namespace, key: &Key) -> Option<Arc<Entry>> {
        self.get(ns, &key.fingerprint())
    }
}
