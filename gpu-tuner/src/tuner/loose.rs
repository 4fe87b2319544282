//! Loose matching after an upgrade (FORMAT.md, "Loose matching"): a key this scope lacks, whose
//! entry under a scope that differs only in other families' versions (`version.<family>`
//! fields) names a winner of an unchanged family, is served that winner at once, provisionally,
//! once it has run, verified, within `remote_slack` of its stored median here; a background tune
//! then re-times the stored top few for this scope. A winner that fails the check is not used:
//! the key is tuned as a miss.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use cache_core::cache_format::{CandidateId, Entry, Key, Scope, loose_match};

use super::plan::ranked_current;
use super::{Choice, TunedInner};
use crate::measure::slower_than;
use crate::operation::Operation;

/// The background tuning time a loose hit may start in one process (its re-time).
const RETIME_BUDGET: Duration = Duration::from_secs(3600);

impl<O: Operation> TunedInner<O> {
    /// The newest entry of another scope that matches loosely, with its winner.
    pub(super) fn loose_prior(
        &self,
        ckey: &Key,
        current: &[CandidateId],
    ) -> Option<(Scope, Entry, CandidateId)> {
        let cache = self.cache();
        let mut others = cache.lookup_other_scopes(self.ns, &ckey.fingerprint());
        others.sort_by_key(|(_, e)| std::cmp::Reverse(e.recorded_at()));
        others.into_iter().find_map(|(scope, entry)| {
            let winner = ranked_current(&entry, current).first()?.id.clone();
            loose_match(cache.scope(), &scope, &winner).then_some((scope, entry, winner))
        })
    }

    /// Serves a loose match's winner once it passes its check here, and queues the re-time;
    /// `Err` with why it was not used.
    pub(super) fn loose(
        self: &Arc<Self>,
        key: &O::Key,
        ckey: &Key,
        current: &[CandidateId],
        (scope, entry, winner): (Scope, Entry, CandidateId),
    ) -> Result<Arc<Choice<O::Handle>>, String> {
        let stored = entry
            .candidates()
            .iter()
            .find(|c| c.id == winner)
            .and_then(|c| c.stats())
            .map(|s| s.median_ns);
        let handle = self.op.prepare(&winner, key)?;
        let mut problem = self.op.problem(key)?;
        let first = self.op.time(&handle, &mut problem, 1)?;
        self.op.verify(&handle, &mut problem)?;
        if let Some(median) = stored {
            let slack = self.config.remote_slack;
            let check = (&handle, &mut problem);
            if let Some(ratio) = slower_than(
                &self.op,
                check,
                first,
                median,
                slack,
                self.config.measure.min_sample,
            )? {
                return Err(format!(
                    "it ran {ratio:.1}x slower here than its stored median"
                ));
            }
        }
        self.counters.loose_hits.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            "tunecache: {} {ckey}: {winner} used loosely from the scope {scope}",
            self.namespace()
        );
        let mut ranking = vec![winner.clone()];
        ranking.extend(current.iter().filter(|c| **c != winner).cloned());
        self.enqueue_background(key.clone(), RETIME_BUDGET);
        Ok(Arc::new(Choice {
            candidate: winner,
            handle: Arc::new(handle),
            provisional: true,
            expires: None,
            ranking,
            key: ckey.clone(),
            prediction: None,
            loose_from: Some(scope),
        }))
    }
}
