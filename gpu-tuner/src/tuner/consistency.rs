//! One winner for the fleet ([`Consistency::Fleet`]): a key's choice is the winner of the entry
//! the shared tier holds for it (read after this process's own results are published, so they
//! count), taken when the key is first chosen and again at [`super::Tuner::sync`], the epoch at
//! which a changed winner reaches a running process. Between two syncs a key's choice never
//! changes (the dispatch table is only replaced whole, by read-copy-update), so a job's ranks
//! that sync at the same step boundary run the same kernel for the same key in every step.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use cache_core::cache_format::Entry;

use super::plan::ranked_current;
use super::{Choice, Dispatch, TunedInner, lock};
use crate::fleet::FleetError;
use crate::operation::Operation;

/// A settled choice of a dispatch table, by its key.
type Settled<'a, O> = (
    &'a <O as Operation>::Key,
    &'a Arc<Choice<<O as Operation>::Handle>>,
);

/// A key, its choice when the sync began, and the fleet's.
type Adopted<O> = (
    <O as Operation>::Key,
    Arc<Choice<<O as Operation>::Handle>>,
    Arc<Choice<<O as Operation>::Handle>>,
);

/// Whose winner a process uses for a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Consistency {
    /// Its own cache's (what it measured, merged with what it read): processes that measured
    /// a key each may run different winners.
    #[default]
    Local,
    /// The fleet's: the winner of the entry the shared tier holds, even for a key this process
    /// measured itself (its measurements are merged there; the winner is the merged entry's).
    /// Checked on a key's first choice and at each [`super::Tuner::sync`]; without a
    /// reachable shared tier, the local winner, until a sync can read the fleet's.
    Fleet,
}

/// What a [`super::Tuner::sync`] did.
#[derive(Debug, Clone, Default)]
pub struct SyncReport {
    /// Keys of the dispatch tables looked up in the fleet's view.
    pub keys: usize,
    /// Keys whose choice changed to the fleet's winner.
    pub changed: usize,
    /// Why the fleet's view could not be read (the choices were kept), if it could not.
    pub error: Option<crate::fleet::FleetError>,
}

/// A registered operation, as the tuner syncs it.
pub(super) trait Synced: Send + Sync {
    fn sync(&self, timeout: Duration, report: &mut SyncReport);
}

impl<O: Operation> TunedInner<O> {
    /// Under [`Consistency::Fleet`], a key's first choice becomes the fleet's winner (one
    /// round trip, after publishing what this process recorded); a provisional choice, or one
    /// made while the fleet cannot be read, stays as it is.
    pub(super) fn reconcile(
        &self,
        key: &O::Key,
        choice: Arc<Choice<O::Handle>>,
    ) -> Arc<Choice<O::Handle>> {
        if self.tuner.consistency != Consistency::Fleet || choice.provisional {
            return choice;
        }
        let Some(fleet) = &self.tuner.fleet else {
            return choice;
        };
        let fp = choice.key.fingerprint();
        match fleet.view(self.ns, &[fp], self.config.wait) {
            Ok(view) => match view.into_iter().next().flatten() {
                Some(entry) => self.adopt(key, &choice, &entry).unwrap_or(choice),
                None => choice,
            },
            Err(why) => {
                tracing::debug!(
                    "tunecache: {}: the local winner is used until the fleet's can be read: \
                     {why}",
                    self.namespace()
                );
                choice
            }
        }
    }

    /// The choice the fleet's `entry` makes, if its best current candidate is not `choice`'s
    /// (`None`: keep `choice`, also when the fleet's winner cannot be used here).
    fn adopt(
        &self,
        key: &O::Key,
        choice: &Choice<O::Handle>,
        entry: &Entry,
    ) -> Option<Arc<Choice<O::Handle>>> {
        let current = self.current(key);
        let best = ranked_current(entry, &current).first()?.id.clone();
        if best == choice.candidate {
            return None;
        }
        match self.choose(key, &choice.key, &current, entry, HashMap::new()) {
            Ok(adopted) => {
                self.counters.fleet_adopted.fetch_add(1, Ordering::Relaxed);
                Some(adopted)
            }
            Err(e) => {
                tracing::warn!(
                    "tunecache: {}: the fleet's winner for {} cannot be used here, the local \
                     one is kept: {e}",
                    self.namespace(),
                    choice.key
                );
                None
            }
        }
    }
}

impl<O: Operation> Synced for TunedInner<O> {
    /// Reads the fleet's entries of every settled key of the dispatch table in one round trip,
    /// and replaces the table once with the choices that changed.
    fn sync(&self, timeout: Duration, report: &mut SyncReport) {
        let table = self.dispatch.load_full();
        let settled: Vec<Settled<'_, O>> = table.iter().filter(|(_, c)| !c.provisional).collect();
        if settled.is_empty() {
            return;
        }
        let Some(fleet) = &self.tuner.fleet else {
            report.error.get_or_insert_with(|| FleetError::new(NoFleet));
            return;
        };
        let fps: Vec<_> = settled.iter().map(|(_, c)| c.key.fingerprint()).collect();
        let view = match fleet.view(self.ns, &fps, timeout) {
            Ok(view) => view,
            Err(why) => {
                report.error.get_or_insert(why);
                return;
            }
        };
        report.keys += settled.len();
        let adopted: Vec<Adopted<O>> = settled
            .into_iter()
            .zip(view)
            .filter_map(|((key, choice), entry)| {
                let next = self.adopt(key, choice, entry.as_deref()?)?;
                Some((key.clone(), Arc::clone(choice), next))
            })
            .collect();
        if adopted.is_empty() {
            return;
        }
        let _writer = lock(&self.publish);
        let mut next = Dispatch::<O>::clone(&self.dispatch.load());
        for (key, was, now) in adopted {
            // A key chosen again meanwhile (a failure, a background tune) keeps that choice.
            if next.get(&key).is_some_and(|c| Arc::ptr_eq(c, &was)) {
                next.insert(key, now);
                report.changed += 1;
            }
        }
        self.dispatch.store(Arc::new(next));
    }
}

/// Why a sync read no fleet: the tuner was given none.
#[derive(Debug, thiserror::Error)]
#[error("this tuner shares no fleet (see Tuner::with_fleet)")]
struct NoFleet;
