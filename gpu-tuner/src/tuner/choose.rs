//! Choosing a candidate: the best current one of an entry that prepares, a provisional
//! stand-in (the nearest tuned key's winner, or a declared default) while another thread or
//! process tunes, and the fall-back to the runner-up when a chosen candidate fails at run
//! time.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use cache_core::Store as _;
use cache_core::cache_format::{
    Candidate, CandidateId, Entry, Fingerprint, Key, Origin, Outcome, now_millis, rank,
};

use super::plan::ranked_current;
use super::{Choice, MissPolicy, TuneError, TunedInner, lock};
use crate::measure::{contention_explains, interleaved_best, slower_than};
use crate::operation::Operation;
use crate::predict::{Prediction, Predictor, Query, TunedKeys, Voters};

/// What choosing from an entry gave.
enum Chosen<H> {
    /// A candidate that prepared (and, from a shared tier, passed its check here).
    Ready(Arc<Choice<H>>),
    /// A shared tier's winner ran far slower here than its stored figure: the key is tuned
    /// here instead.
    Distrusted,
}

/// What checking a shared tier's candidate here found.
enum Checked {
    /// It verified, and ran about as fast as recorded (or no check applies).
    Passed,
    /// It failed its verification here.
    Failed(String),
    /// It verified, but its best timed run here was this many times its stored median.
    Slow(f64),
}

impl<O: Operation> TunedInner<O> {
    pub(super) fn choose_reused(
        &self,
        key: &O::Key,
        ckey: &Key,
        current: &[CandidateId],
        entry: &Entry,
    ) -> Result<Arc<Choice<O::Handle>>, TuneError> {
        let choice = match self.choose_checked(key, ckey, current, entry, HashMap::new())? {
            Chosen::Ready(choice) => choice,
            Chosen::Distrusted => return self.tune_here(key, ckey, current),
        };
        let saved: u64 = entry
            .candidates()
            .iter()
            .filter(|c| current.contains(&c.id))
            .filter_map(|c| c.tuning_ns)
            .sum();
        // Only what this process did not spend itself, once per cache key; a key served by
        // a cache key measured here (another key of its bucket) is not reused from the cache.
        let mut counted = lock(&self.counted);
        match counted.get(&ckey.fingerprint()) {
            Some(true) => self.counters.bucketed_keys.fetch_add(1, Ordering::Relaxed),
            Some(false) => self.counters.reused_keys.fetch_add(1, Ordering::Relaxed),
            None => {
                counted.insert(ckey.fingerprint(), false);
                self.counters.saved_ns.fetch_add(saved, Ordering::Relaxed);
                self.counters.reused_keys.fetch_add(1, Ordering::Relaxed)
            }
        };
        Ok(choice)
    }

    /// Every current candidate measured here, whatever is stored: a shared tier's figures for
    /// this key were found false. The results, measured later, replace them by the merge rule
    /// (here and, once published, on the server).
    fn tune_here(
        &self,
        key: &O::Key,
        ckey: &Key,
        current: &[CandidateId],
    ) -> Result<Arc<Choice<O::Handle>>, TuneError> {
        let set = self.set_checksum(current);
        // The entry tuned from nothing has this machine's origin: choosing from it checks
        // nothing remote, so this never comes back here.
        self.tune(key, ckey, current, set, None, current.to_vec())
    }

    /// The best current candidate of `entry` that prepares; failing ones are recorded.
    pub(super) fn choose(
        &self,
        key: &O::Key,
        ckey: &Key,
        current: &[CandidateId],
        entry: &Entry,
        handles: HashMap<CandidateId, Arc<O::Handle>>,
    ) -> Result<Arc<Choice<O::Handle>>, TuneError> {
        match self.choose_checked(key, ckey, current, entry, handles)? {
            Chosen::Ready(choice) => Ok(choice),
            Chosen::Distrusted => self.tune_here(key, ckey, current),
        }
    }

    /// [`TunedInner::choose`], saying when a shared tier's winner was distrusted.
    fn choose_checked(
        &self,
        key: &O::Key,
        ckey: &Key,
        current: &[CandidateId],
        entry: &Entry,
        mut handles: HashMap<CandidateId, Arc<O::Handle>>,
    ) -> Result<Chosen<O::Handle>, TuneError> {
        // Only candidates of the current set count: a stored winner that is not one of them is
        // ignored.
        let mut ranking: Vec<CandidateId> = ranked_current(entry, current)
            .into_iter()
            .map(|c| c.id.clone())
            .collect();
        let mut reasons = Vec::new();
        while !ranking.is_empty() {
            let spec = ranking[0].clone();
            let handle = match handles.remove(&spec) {
                Some(h) => Ok(h),
                None => self
                    .op
                    .prepare(&spec, key)
                    .map(Arc::new)
                    .map_err(String::from),
            };
            let handle = handle.and_then(|h| match self.check_remote(entry, &spec, key, &h) {
                Checked::Passed => Ok(Some(h)),
                Checked::Slow(ratio) => {
                    self.distrust(entry, &spec, ckey, ratio);
                    Ok(None)
                }
                Checked::Failed(e) => {
                    Err(format!("a winner from {} failed here: {e}", entry.origin()))
                }
            });
            match handle {
                Ok(None) => return Ok(Chosen::Distrusted),
                Ok(Some(handle)) => {
                    return Ok(Chosen::Ready(Arc::new(Choice {
                        candidate: spec,
                        handle,
                        provisional: false,
                        expires: None,
                        ranking,
                        key: ckey.clone(),
                        prediction: None,
                        loose_from: None,
                    })));
                }
                Err(e) => {
                    reasons.push(format!("{spec}: {e}"));
                    self.record(Entry::new(
                        ckey.clone(),
                        Fingerprint::default(),
                        cache_core::measured_here(),
                        now_millis(),
                        [Candidate::new(
                            spec.clone(),
                            Outcome::Failed(if e.starts_with("a winner from") {
                                e.clone()
                            } else {
                                format!("prepare failed: {e}")
                            }),
                        )],
                    ));
                    ranking.remove(0);
                }
            }
        }
        for c in entry.candidates() {
            if let Outcome::Failed(r) = &c.outcome
                && current.contains(&c.id)
            {
                reasons.push(format!("{}: {r}", c.id.algorithm));
            }
        }
        Err(TuneError::NoCandidate {
            namespace: self.namespace().to_owned(),
            key: ckey.to_string(),
            reasons: if reasons.is_empty() {
                "nothing was measured".into()
            } else {
                reasons.join("; ")
            },
        })
    }

    /// Under [`super::RemotePolicy::Verify`], a candidate of an entry from a shared tier runs
    /// once on this key's problem and must pass the operation's verification before it is
    /// used (counted; a failure is counted and reported once per candidate); then it is timed
    /// against its stored median (see [`slower_than`]).
    fn check_remote(
        &self,
        entry: &Entry,
        spec: &CandidateId,
        key: &O::Key,
        handle: &O::Handle,
    ) -> Checked {
        if !matches!(entry.origin(), Origin::Remote(_))
            || self.config.remote != super::RemotePolicy::Verify
        {
            return Checked::Passed;
        }
        self.counters.remote_checked.fetch_add(1, Ordering::Relaxed);
        let stored = entry
            .candidates()
            .iter()
            .find(|c| c.id == *spec)
            .and_then(|c| c.stats())
            .map(|s| s.median_ns);
        let checked = self.op.problem(key).and_then(|mut problem| {
            // The verification run is timed: the first sample, free.
            let first = self.op.time(handle, &mut problem, 1)?;
            self.op.verify(handle, &mut problem)?;
            let Some(median) = stored else {
                return Ok(None);
            };
            let slow = slower_than(
                &self.op,
                (handle, &mut problem),
                first,
                median,
                self.config.remote_slack,
                self.config.measure.min_sample,
            )?;
            match slow {
                Some(ratio) if !self.contention(entry, spec, key, handle, &mut problem) => {
                    Ok(Some(ratio))
                }
                _ => Ok(None),
            }
        });
        match checked {
            Ok(None) => Checked::Passed,
            Ok(Some(ratio)) => Checked::Slow(ratio),
            Err(e) => {
                self.counters.remote_refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    "tunecache: {}: a winner from {} failed its verification here ({e}); trying the next candidate",
                    self.namespace(),
                    entry.origin()
                );
                Checked::Failed(e.to_string())
            }
        }
    }

    /// Whether a winner from a shared tier that ran slower here than recorded did so because
    /// this machine is slower now: it is timed against the entry's runner-up here, in the
    /// same moments ([`contention_explains`]). Without a measured runner-up that prepares
    /// here, nothing explains it.
    fn contention(
        &self,
        entry: &Entry,
        spec: &CandidateId,
        key: &O::Key,
        handle: &O::Handle,
        problem: &mut O::Problem,
    ) -> bool {
        let stats_of = |id: &CandidateId| {
            entry
                .candidates()
                .iter()
                .find(|c| c.id == *id)
                .and_then(|c| c.stats())
                .map(|s| s.median_ns)
        };
        let Some(winner_stored) = stats_of(spec) else {
            return false;
        };
        let Some((runner, runner_stored)) = entry
            .candidates()
            .iter()
            .filter(|c| c.id != *spec)
            .find_map(|c| c.stats().map(|s| (c.id.clone(), s.median_ns)))
        else {
            return false;
        };
        let Ok(runner_handle) = self.op.prepare(&runner, key) else {
            return false;
        };
        match interleaved_best(
            &self.op,
            problem,
            (handle, &runner_handle),
            self.config.measure.min_sample,
        ) {
            Ok(here) => contention_explains(
                here,
                (winner_stored, runner_stored),
                self.config.remote_slack,
            ),
            Err(_) => false,
        }
    }

    /// Counts and says (at warn level once per operation) that a shared tier's winner ran
    /// `ratio` times slower here than recorded.
    fn distrust(&self, entry: &Entry, spec: &CandidateId, ckey: &Key, ratio: f64) {
        self.counters
            .remote_distrusted
            .fetch_add(1, Ordering::Relaxed);
        let text = format!(
            "tunecache: {} {ckey}: {spec}, the winner from {}, ran {ratio:.1}x slower here than its recorded median; its figures are not trusted and the key is tuned here",
            self.namespace(),
            entry.origin()
        );
        if self.counters.distrust_said.swap(true, Ordering::Relaxed) {
            tracing::debug!("{text}");
        } else {
            tracing::warn!("{text} (further such keys are logged at debug level)");
        }
    }

    /// A stand-in while someone else tunes: the declared default, else the nearest tuned key's
    /// winner, else the first applicable candidate. Nothing is measured.
    pub(super) fn fallback(
        self: &Arc<Self>,
        key: &O::Key,
        why: &str,
    ) -> Result<Arc<Choice<O::Handle>>, TuneError> {
        tracing::debug!(
            "tunecache: {} uses a provisional choice: {why}",
            self.namespace()
        );
        let ckey = self.cache_key(key)?;
        let current = self.current(key);
        let mut choice = match &self.config.policy {
            MissPolicy::Never { default } => self.declared(key, &ckey, &current, default)?,
            _ => self.nearest(key, &ckey, &current)?,
        };
        if let Some(c) = Arc::get_mut(&mut choice) {
            c.expires = Some(cache_core::deadline_after(self.config.provisional_ttl));
        }
        self.publish(key, &choice);
        Ok(choice)
    }

    pub(super) fn provisional(
        &self,
        key: &O::Key,
        ckey: &Key,
        spec: CandidateId,
        current: &[CandidateId],
        prediction: Option<Arc<Prediction>>,
    ) -> Result<Arc<Choice<O::Handle>>, TuneError> {
        let handle = self
            .op
            .prepare(&spec, key)
            .map_err(|e| TuneError::NoCandidate {
                namespace: self.namespace().to_owned(),
                key: ckey.to_string(),
                reasons: format!("{spec}: {e}"),
            })?;
        self.counters.provisional.fetch_add(1, Ordering::Relaxed);
        let ranking = match &prediction {
            Some(p) => p.ranking.iter().map(|(c, _)| c.clone()).collect(),
            None => {
                let mut ranking = vec![spec.clone()];
                ranking.extend(current.iter().filter(|c| **c != spec).cloned());
                ranking
            }
        };
        Ok(Arc::new(Choice {
            candidate: spec,
            handle: Arc::new(handle),
            provisional: true,
            expires: None,
            ranking,
            key: ckey.clone(),
            prediction,
            loose_from: None,
        }))
    }

    pub(super) fn declared(
        &self,
        key: &O::Key,
        ckey: &Key,
        current: &[CandidateId],
        default: &CandidateId,
    ) -> Result<Arc<Choice<O::Handle>>, TuneError> {
        // A winner shipped for this very key (an imported config) before a default for all.
        let spec = match self.shipped(ckey, current) {
            Some(spec) => spec,
            None if current.contains(default) => default.clone(),
            None => self.first_of(ckey, current)?,
        };
        let mut choice = self.provisional(key, ckey, spec, current, None)?;
        if let Some(c) = Arc::get_mut(&mut choice) {
            // A declared default is the answer, not a stand-in.
            c.provisional = false;
        }
        Ok(choice)
    }

    /// The winner of the nearest tuned key of this namespace (same non-numeric fields, closest
    /// numeric ones), else the first current candidate.
    pub(super) fn nearest(
        &self,
        key: &O::Key,
        ckey: &Key,
        current: &[CandidateId],
    ) -> Result<Arc<Choice<O::Handle>>, TuneError> {
        if let Some(spec) = self.shipped(ckey, current) {
            // The key's own shipped winner beats a prediction from other keys.
            return self.provisional(key, ckey, spec, current, None);
        }
        match self.predict(ckey, current) {
            Some(prediction) => {
                let spec = prediction.winner().clone();
                tracing::debug!(
                    "tunecache: {} {ckey}: {}",
                    self.namespace(),
                    prediction.describe()
                );
                self.provisional(key, ckey, spec, current, Some(Arc::new(prediction)))
            }
            None => {
                let spec = self.first_of(ckey, current)?;
                self.provisional(key, ckey, spec, current, None)
            }
        }
    }

    /// The latest winner another tool chose for `ckey` among `current` (an imported shipped
    /// config, [`Outcome::Chosen`]), if the stored entry has one.
    pub(super) fn shipped(&self, ckey: &Key, current: &[CandidateId]) -> Option<CandidateId> {
        let entry = self.cache().lookup(self.ns, ckey)?;
        rank(
            entry
                .candidates()
                .iter()
                .map(|c| &**c)
                .filter(|c| matches!(c.outcome, Outcome::Chosen(_)) && current.contains(&c.id)),
        )
        .first()
        .map(|c| c.id.clone())
    }

    /// The predicted ranking of `current` for `ckey` from the tuned keys of this namespace,
    /// with the same key's results under other scopes (other devices) voting beside them
    /// ([`Voters::Scope`]); with no key comparable here (a device never tuned),
    /// transferred from those results alone (every one votes, [`Prediction::transferred`]);
    /// `None` if neither exists.
    pub(super) fn predict(&self, ckey: &Key, current: &[CandidateId]) -> Option<Prediction> {
        // This namespace's tuned keys, indexed (made again when they change: neighbours.rs).
        let (index, fresher) = self.neighbours.current(self.cache(), self.ns);
        let elsewhere = self
            .cache()
            .lookup_other_scopes(self.ns, &ckey.fingerprint());
        let elsewhere: Vec<&Entry> = elsewhere.iter().map(|(_, e)| e).collect();
        let target = ckey.fields();
        let here = Query {
            target,
            current,
            voters: Voters::Scope {
                tuned: TunedKeys::Indexed {
                    index: &index,
                    fresher: &fresher,
                },
                elsewhere: &elsewhere,
            },
        };
        if let Some(p) = Predictor::default().predict(&here) {
            return Some(p);
        }
        let voters = Predictor {
            neighbours: elsewhere.len().max(1),
        };
        voters.predict(&Query {
            target,
            current,
            voters: Voters::Devices {
                tuned: &elsewhere,
                measured: &[],
            },
        })
    }

    /// Records that `choice` failed at run time and returns the runner-up's choice.
    pub(super) fn demote(
        &self,
        key: &O::Key,
        choice: &Choice<O::Handle>,
        reason: String,
    ) -> Result<Arc<Choice<O::Handle>>, TuneError> {
        self.counters.failures.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            "tunecache: {} {} failed at run time ({reason}); falling back to the runner-up",
            self.namespace(),
            choice.candidate
        );
        self.record(Entry::new(
            choice.key.clone(),
            Fingerprint::default(),
            cache_core::measured_here(),
            now_millis(),
            [Candidate::new(
                choice.candidate.clone(),
                Outcome::Failed(format!("failed at run time: {reason}")),
            )],
        ));
        let rest: Vec<CandidateId> = choice
            .ranking
            .iter()
            .filter(|c| **c != choice.candidate)
            .cloned()
            .collect();
        let mut reasons = vec![format!("{}: {reason}", choice.candidate)];
        for (i, spec) in rest.iter().enumerate() {
            match self.op.prepare(spec, key) {
                Ok(handle) => {
                    let next = Arc::new(Choice {
                        candidate: spec.clone(),
                        handle: Arc::new(handle),
                        provisional: choice.provisional,
                        expires: choice.expires,
                        ranking: rest[i..].to_vec(),
                        key: choice.key.clone(),
                        prediction: choice.prediction.clone(),
                        loose_from: choice.loose_from.clone(),
                    });
                    self.publish(key, &next);
                    return Ok(next);
                }
                Err(e) => reasons.push(format!("{spec}: {e}")),
            }
        }
        Err(TuneError::NoCandidate {
            namespace: self.namespace().to_owned(),
            key: choice.key.to_string(),
            reasons: reasons.join("; "),
        })
    }

    /// The first current candidate: the last resort of a stand-in. None applying to the key is
    /// an error, never an index out of bounds.
    fn first_of(&self, ckey: &Key, current: &[CandidateId]) -> Result<CandidateId, TuneError> {
        current
            .first()
            .cloned()
            .ok_or_else(|| TuneError::NoCandidate {
                namespace: self.namespace().to_owned(),
                key: ckey.to_string(),
                reasons: "no candidate applies to this key".into(),
            })
    }
}
