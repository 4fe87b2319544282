//! One question to a [`Predictor`]: the key, the candidates to rank, and whose results vote.
//! Every prediction the tuner, `tunecache explain` and `evaluate` make is one of these, and the
//! answer is always a [`Prediction`].

use std::sync::Arc;

use cache_core::cache_format::{CandidateId, Entry, Fields};

use super::{KeyIndex, Prediction, Predictor};

/// What a [`Predictor`] is asked.
#[derive(Debug, Clone, Copy)]
pub struct Query<'a> {
    /// The key's fields, bucketed.
    pub target: &'a Fields,
    /// The candidates to rank: the prediction ranks every one of them (none: no prediction).
    pub current: &'a [CandidateId],
    /// Whose results vote.
    pub voters: Voters<'a>,
}

/// Whose results vote in a [`Query`].
#[derive(Debug, Clone, Copy)]
pub enum Voters<'a> {
    /// This scope's tuned keys of the namespace (the target's own entry, if among them, is
    /// left out), and beside them `elsewhere`: the same key's entries under other scopes
    /// (other devices), each one more neighbour at distance 0.5 (chosen on published
    /// A100/H100 timings, docs/rust.md), marked
    /// [`super::Neighbour::elsewhere`]. A device with a few keys tuned predicts from its own
    /// keys and from what other devices measured for this very problem. No prediction when no
    /// key of this scope is comparable: that is [`Voters::Devices`].
    Scope {
        /// This scope's tuned keys.
        tuned: TunedKeys<'a>,
        /// The same key under other scopes (`&[]`: none).
        elsewhere: &'a [&'a Entry],
    },
    /// Other scopes' entries only: a device with no results of its own, served from the
    /// devices that have some. An entry of the same key is the nearest neighbour there is
    /// (distance 0), not the target's own entry to leave out; the prediction is marked
    /// [`Prediction::transferred`]. `measured`: what was measured on the target so far
    /// (candidate, median); from three on, each voter counts in proportion to how well its
    /// ranking of those agrees with the target's (`adapt.rs`), so the devices that behave like
    /// this one lead. With fewer measured, no prediction when the voters rank the candidates
    /// the other way round from each other (their mean pairwise rank correlation is at or
    /// below zero).
    Devices {
        /// Other scopes' entries of the namespace.
        tuned: &'a [&'a Entry],
        /// Medians measured on the target (`&[]`: none yet).
        measured: &'a [(CandidateId, f64)],
    },
}

/// A scope's tuned keys, as [`Voters::Scope`] takes them.
#[derive(Debug, Clone, Copy)]
pub enum TunedKeys<'a> {
    /// Walked one by one.
    Entries(&'a [&'a Entry]),
    /// An index of them and `fresher` ones: entries recorded since the index was built, which
    /// vote in place of any version of the same key the index holds. The same prediction a
    /// walk of all of them gives, at about the logarithm of their number.
    Indexed {
        /// The index ([`KeyIndex`]).
        index: &'a KeyIndex,
        /// Entries recorded since it was built.
        fresher: &'a [Arc<Entry>],
    },
}

impl Predictor {
    /// The predicted ranking of `query.current` for `query.target`, from `query.voters`;
    /// `None` when no voter is comparable, `current` is empty, or (for [`Voters::Devices`])
    /// the devices disagree with nothing measured to tell which to follow.
    pub fn predict(&self, query: &Query<'_>) -> Option<Prediction> {
        let Query {
            target, current, ..
        } = *query;
        match query.voters {
            Voters::Scope {
                tuned: TunedKeys::Entries(tuned),
                elsewhere,
            } => self.walk_beside(
                target,
                tuned.iter().copied(),
                elsewhere.iter().copied(),
                current,
                None,
            ),
            Voters::Scope {
                tuned: TunedKeys::Indexed { index, fresher },
                elsewhere,
            } => self.indexed_beside(target, index, fresher, elsewhere.iter().copied(), current),
            Voters::Devices { tuned, measured } => {
                self.across(target, tuned.iter().copied(), current, measured)
            }
        }
    }
}

/// Tests' shorthands: each builds the [`Query`] it names and asks [`Predictor::predict`].
#[cfg(test)]
impl Predictor {
    pub(crate) fn scope_of<'a>(
        &self,
        target: &Fields,
        tuned: impl IntoIterator<Item = &'a Entry>,
        current: &[CandidateId],
    ) -> Option<Prediction> {
        self.scope_beside(target, tuned, [], current)
    }

    pub(crate) fn scope_beside<'a>(
        &self,
        target: &Fields,
        tuned: impl IntoIterator<Item = &'a Entry>,
        elsewhere: impl IntoIterator<Item = &'a Entry>,
        current: &[CandidateId],
    ) -> Option<Prediction> {
        let tuned: Vec<&Entry> = tuned.into_iter().collect();
        let elsewhere: Vec<&Entry> = elsewhere.into_iter().collect();
        self.predict(&Query {
            target,
            current,
            voters: Voters::Scope {
                tuned: TunedKeys::Entries(&tuned),
                elsewhere: &elsewhere,
            },
        })
    }

    pub(crate) fn indexed(
        &self,
        target: &Fields,
        index: &KeyIndex,
        fresher: &[Arc<Entry>],
        current: &[CandidateId],
    ) -> Option<Prediction> {
        self.predict(&Query {
            target,
            current,
            voters: Voters::Scope {
                tuned: TunedKeys::Indexed { index, fresher },
                elsewhere: &[],
            },
        })
    }

    pub(crate) fn devices_of<'a>(
        &self,
        target: &Fields,
        tuned: impl IntoIterator<Item = &'a Entry>,
        current: &[CandidateId],
    ) -> Option<Prediction> {
        self.devices_measured(target, tuned, current, &[])
    }

    pub(crate) fn devices_measured<'a>(
        &self,
        target: &Fields,
        tuned: impl IntoIterator<Item = &'a Entry>,
        current: &[CandidateId],
        measured: &[(CandidateId, f64)],
    ) -> Option<Prediction> {
        let tuned: Vec<&Entry> = tuned.into_iter().collect();
        self.predict(&Query {
            target,
            current,
            voters: Voters::Devices {
                tuned: &tuned,
                measured,
            },
        })
    }
}
