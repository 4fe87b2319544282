//! The lower tiers of a cache, in the order a miss asks them (the system tier first, if any):
//! which has a key, which take offers of keys recorded here, and what they gave to be found by
//! type. What a tier returns comes into memory and the file through the save queue
//! (`queue.rs`).

use std::sync::Arc;

use cache_format::{Entry, Fingerprint};

use crate::namespace::Namespace;
use crate::tier::{Fill, Handle, Tier};

/// A cache's lower tiers.
pub(super) struct Lower {
    /// In the order a miss asks them.
    pub(super) tiers: Vec<Arc<dyn Tier>>,
    /// The tiers that take offers of new keys (all of them but the system tier).
    offered: Vec<Arc<dyn Tier>>,
    /// What the tiers gave to be found by type ([`super::Cache::handle`]).
    pub(super) handles: Vec<Handle>,
}

impl Lower {
    /// `tiers` in the order a miss asks them, of which those from `first_offered` on take
    /// offers.
    pub(super) fn new(
        tiers: Vec<Arc<dyn Tier>>,
        first_offered: usize,
        handles: Vec<Handle>,
    ) -> Self {
        Lower {
            offered: tiers[first_offered..].to_vec(),
            tiers,
            handles,
        }
    }

    /// The first tier that has `fp` in `ns`: its entry, and whether the cache keeps it.
    pub(super) fn find(&self, ns: Namespace, fp: &Fingerprint) -> Option<(Arc<Entry>, Fill)> {
        self.tiers.iter().find_map(|tier| {
            let found = tier.get_many(ns, std::slice::from_ref(fp)).pop()?;
            Some((found, tier.fill()))
        })
    }

    /// Asks each tier once for the keys of `missing` the tiers before it lacked, handing what
    /// a [`Fill::Keep`] tier returned to `keep`; returns how many the tiers had.
    pub(super) fn find_many(
        &self,
        ns: Namespace,
        mut missing: Vec<Fingerprint>,
        mut keep: impl FnMut(Vec<Arc<Entry>>),
    ) -> usize {
        let mut had = 0;
        for tier in &self.tiers {
            if missing.is_empty() {
                break;
            }
            let found = tier.get_many(ns, &missing);
            had += found.len();
            missing.retain(|fp| found.iter().all(|e| e.fingerprint() != *fp));
            if tier.fill() == Fill::Keep {
                keep(found);
            }
        }
        had
    }

    /// Offers keys recorded here to the tiers that write.
    #[inline]
    pub(super) fn offer(&self, keys: &[(Namespace, Fingerprint)]) {
        for tier in &self.offered {
            tier.offer(keys);
        }
    }
}
