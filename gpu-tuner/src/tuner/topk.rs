//! Top-k tuning ([`super::MissPolicy::TopK`]): a miss measures only the candidates the
//! prediction ranks best (and the nearest tuned key's winner), one a round, stopping as soon
//! as those left cannot win by the prediction (`predict/early_stop.rs`), and records that its
//! set was partial, under a checksum of its own, so a later full tune measures only the rest.

use std::sync::Arc;

use cache_core::cache_format::{CandidateId, Fingerprint, Key, Value};

use super::{Choice, TuneError, TunedInner};
use crate::operation::Operation;

/// The salt field that marks a candidate-set checksum as a top-k tune's.
const PARTIAL: &str = "tunecache.top_k";

impl<O: Operation> TunedInner<O> {
    /// The checksum a top-k tune records for the current candidates: never the full set's.
    pub(super) fn partial_set(&self, current: &[CandidateId]) -> Fingerprint {
        let mut salt = self.op.salt();
        salt.insert(PARTIAL.to_owned(), Value::Bool(true));
        Fingerprint::of_candidate_set(
            current.iter().map(|c| (c.algorithm.as_str(), &c.params)),
            &salt,
        )
    }

    /// A miss under top-k: the `k` best predicted and the nearest key's winner are measured,
    /// until the rest cannot win; everything when there is nothing to predict from or `k`
    /// covers the set.
    pub(super) fn top_k(
        &self,
        key: &O::Key,
        ckey: &Key,
        current: &[CandidateId],
        set: Fingerprint,
        k: usize,
    ) -> Result<Arc<Choice<O::Handle>>, TuneError> {
        let Some(prediction) = self.predict(ckey, current) else {
            return self.tune(key, ckey, current, set, None, current.to_vec());
        };
        let mut list = prediction.top(k.max(1));
        if let Some(nearest) = prediction.neighbours.first().and_then(|n| n.winner.clone())
            && !list.contains(&nearest)
        {
            list.push(nearest);
        }
        // A winner shipped for this key (an imported config) is measured too, first, so
        // stopping early never passes it over.
        if let Some(shipped) = self.shipped(ckey, current)
            && !list.contains(&shipped)
        {
            list.insert(0, shipped);
        }
        if list.len() >= current.len() {
            return self.tune(key, ckey, current, set, None, current.to_vec());
        }
        tracing::debug!(
            "tunecache: {} {ckey}: measuring {} of {} candidates: {}",
            self.namespace(),
            list.len(),
            current.len(),
            prediction.describe()
        );
        let partial = self.partial_set(current);
        self.tune_until(
            key,
            ckey,
            current,
            partial,
            None,
            &list,
            Some(&prediction.ranking),
        )
    }
}
