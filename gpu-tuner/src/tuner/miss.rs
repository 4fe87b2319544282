//! The miss path: from a key that missed the dispatch table to a published choice. Looks in
//! the cache, claims the key across processes, measures what the plan says (all candidates
//! together, interleaved), records the key's measurements in one durable write, and chooses.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cache_core::cache_format::{
    Candidate, CandidateId, Entry, Fingerprint, Key, Origin, Outcome, now_millis, policy_class,
};
use cache_core::{Claim, Store};

use crate::fleet::{FleetClaim, FleetLease};

use super::plan::{self, Known, Plan, ranked_current};
use super::{Choice, MissPolicy, Progress, TuneError, TunedInner, lock};
use crate::measure::measure_all;
use crate::operation::Operation;
use crate::predict::early_stop::{Measured, may_stop};
use cache_core::Join;

/// What the early-stop rule reads of the results so far: each candidate's median (infinite
/// if it failed) and spread.
fn measured_of(results: &[Candidate]) -> Vec<Measured> {
    results
        .iter()
        .map(|c| Measured {
            id: c.id.clone(),
            median_ns: c.stats().map_or(f64::INFINITY, |s| s.median_ns),
            spread_ns: c.stats().map_or(0.0, |s| s.spread_ns),
        })
        .collect()
}

/// A candidate after preparation: its handle (or why it failed) and the time it took.
type Prepared<H> = (CandidateId, Result<Arc<H>, String>, Duration);

impl<O: Operation> TunedInner<O> {
    /// A key the dispatch table lacks: kept out of line, so the hit path stays a probe.
    #[cold]
    #[inline(never)]
    pub(super) fn miss(
        self: &Arc<Self>,
        key: &O::Key,
    ) -> Result<Arc<Choice<O::Handle>>, TuneError> {
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        let ready = || {
            self.dispatch
                .load()
                .get(key)
                .filter(|c| c.expires.is_none_or(|t| Instant::now() < t))
                .map(|c| Ok(Arc::clone(c)))
        };
        let leader = match self.inflight.join(key, ready) {
            Join::Ready(choice) => return choice,
            Join::Leader(leader) => leader,
            // Another thread is on it: wait (bounded), never tune twice.
            Join::Follower(follower) => {
                return match follower.wait(self.config.wait) {
                    Some(result) => result,
                    None => self.fallback(key, "another thread is still tuning this key"),
                };
            }
        };
        let result = self
            .resolve(key, &self.config.policy, true)
            .map(|choice| self.reconcile(key, choice));
        if let Ok(choice) = &result {
            self.publish(key, choice);
        }
        leader.finish(result.clone());
        result
    }

    /// Looks at what is stored for the key (this scope and the others) and decides what to
    /// measure (see [`plan::plan`]).
    pub(super) fn plan(&self, ckey: &Key, current: &[CandidateId], set: Fingerprint) -> Plan {
        let cache = self.cache();
        let stored = cache.lookup(self.ns, ckey).map(|e| Entry::clone(&e));
        let others = if stored.is_none() {
            cache.lookup_other_scopes(self.ns, &ckey.fingerprint())
        } else {
            Vec::new()
        };
        let partial_ok = matches!(self.config.policy, MissPolicy::TopK { .. })
            .then(|| self.partial_set(current));
        let known = Known {
            stored,
            others,
            scope: cache.scope(),
            volatile: &self.tuner.volatile,
            partial_ok,
            policy: policy_class(Some(&self.policy())),
            // Only where a miss measures at once: a top-k tune ranks by its own prediction,
            // and the other policies do not measure on the miss path.
            transfer_top: match self.config.policy {
                MissPolicy::TuneNow => self.config.transfer_top,
                _ => 0,
            },
        };
        plan::plan(known, current, set, self.config.retime_top)
    }

    /// Resolves a key the dispatch table lacks under `policy`; `loose`: a loose match after an
    /// upgrade may serve it (not for the background tune that re-times one).
    pub(super) fn resolve(
        self: &Arc<Self>,
        key: &O::Key,
        policy: &MissPolicy,
        loose: bool,
    ) -> Result<Arc<Choice<O::Handle>>, TuneError> {
        let ckey = self.cache_key(key)?;
        let current = self.current(key);
        if current.is_empty() {
            return Err(TuneError::NoCandidate {
                namespace: self.namespace().to_owned(),
                key: ckey.to_string(),
                reasons: "no candidate applies to this key".into(),
            });
        }
        let set = self.set_checksum(&current);
        // Fast path: complete in the cache, no claim needed.
        let plan = self.plan(&ckey, &current, set);
        if let Plan::Use(entry) = plan {
            return self.reuse(key, &ckey, &current, set, entry);
        }
        // Only another version of some other family's candidates measured it: its winner,
        // checked here, until the background re-times it.
        let nothing_here = matches!(
            plan,
            Plan::Miss | Plan::Measure { entry: None, .. } | Plan::Transfer { .. }
        );
        if loose
            && nothing_here
            && let Some(prior) = self.loose_prior(&ckey, &current)
        {
            match self.loose(key, &ckey, &current, prior) {
                Ok(choice) => return Ok(choice),
                Err(why) => tracing::warn!(
                    "tunecache: {} {ckey}: the winner of an earlier version is not used ({why}); \
                     tuning the key",
                    self.namespace()
                ),
            }
        }
        // Someone has to measure: take the key's claim (other processes wait for it), and
        // look again, since another process may have finished it meanwhile.
        let claim = self
            .cache()
            .claim(self.ns, &ckey.fingerprint(), self.config.wait);
        if !matches!(&claim, Claim::Held(guard) if !guard.is_shared()) {
            let _ = self.cache().refresh();
        }
        let plan = self.plan(&ckey, &current, set);
        if let Claim::Busy = claim
            && !matches!(plan, Plan::Use(_))
        {
            return self.fallback(key, "another process is still tuning this key");
        }
        // A key that is measured now is leased across the processes sharing a tier: one of
        // them measures it, the others take its entry.
        let (plan, lease) = self.fleet(&ckey, &current, set, plan, policy);
        let choice = match plan {
            Plan::Use(entry) => self.reuse(key, &ckey, &current, set, entry),
            Plan::Measure { entry, list } => self.tune(key, &ckey, &current, set, entry, list),
            Plan::Transfer { list, predicted } => {
                self.transfer(key, &ckey, &current, set, list, &predicted)
            }
            Plan::Miss => match policy {
                MissPolicy::TuneNow => self.tune(key, &ckey, &current, set, None, current.clone()),
                MissPolicy::Never { default } => self.declared(key, &ckey, &current, default),
                MissPolicy::TopK { k } => self.top_k(key, &ckey, &current, set, *k),
                MissPolicy::NearestThenTune { budget } => {
                    let choice = self.nearest(key, &ckey, &current)?;
                    self.enqueue_background(key.clone(), *budget);
                    Ok(choice)
                }
            },
        };
        if let Some(lease) = lease {
            // Published before the lease goes, so the processes waiting find the entry.
            if let Err(e) = lease.finish(self.config.wait) {
                tracing::debug!("tunecache: {}: not published yet: {e}", self.namespace());
            }
        }
        drop(claim);
        choice
    }

    /// Takes the key's fleet lease before measuring it, or waits (at most the operation's
    /// `wait`) for the process that holds it and uses what it published. Returns the plan to
    /// follow and the lease to finish once the key is recorded, if this process measures it
    /// for the fleet. Without a tier that coordinates, the plan as it was.
    fn fleet(
        &self,
        ckey: &Key,
        current: &[CandidateId],
        set: Fingerprint,
        plan: Plan,
        policy: &MissPolicy,
    ) -> (Plan, Option<Box<dyn FleetLease>>) {
        let measures_now = match &plan {
            Plan::Use(_) => false,
            Plan::Measure { .. } | Plan::Transfer { .. } => true,
            Plan::Miss => matches!(policy, MissPolicy::TuneNow | MissPolicy::TopK { .. }),
        };
        if !measures_now {
            return (plan, None);
        }
        let Some(fleet) = &self.tuner.fleet else {
            return (plan, None);
        };
        let fp = ckey.fingerprint();
        let give_up = cache_core::deadline_after(self.config.wait);
        let mut plan = plan;
        loop {
            let left = give_up.saturating_duration_since(Instant::now());
            match fleet.claim(self.ns, &fp, left) {
                FleetClaim::Lead(lease) => {
                    // What the server held is in the cache now: it may be enough.
                    let plan = self.plan(ckey, current, set);
                    let lease = (!matches!(plan, Plan::Use(_))).then_some(lease);
                    return (plan, lease);
                }
                FleetClaim::Published { by } => {
                    plan = self.plan(ckey, current, set);
                    if matches!(plan, Plan::Use(_)) || left.is_zero() {
                        return (plan, None);
                    }
                    tracing::debug!(
                        "tunecache: {}: {by} published this key without what this process \
                         needs; asking again",
                        self.namespace()
                    );
                }
                FleetClaim::Alone(why) => {
                    tracing::debug!("tunecache: {}: measuring here: {why}", self.namespace());
                    return (plan, None);
                }
            }
        }
    }

    /// A complete entry from the cache: chosen from, after the remote policy for an entry
    /// that came from a shared tier (re-timing its top two here under `Retime`; `Verify` is
    /// applied by [`TunedInner::choose`]).
    fn reuse(
        &self,
        key: &O::Key,
        ckey: &Key,
        current: &[CandidateId],
        set: Fingerprint,
        entry: Entry,
    ) -> Result<Arc<Choice<O::Handle>>, TuneError> {
        if matches!(entry.origin(), Origin::Remote(_))
            && self.config.remote == super::RemotePolicy::Retime
        {
            let list: Vec<CandidateId> = ranked_current(&entry, current)
                .into_iter()
                .take(2)
                .map(|c| c.id.clone())
                .collect();
            if !list.is_empty() {
                self.counters.remote_checked.fetch_add(1, Ordering::Relaxed);
                return self.tune(key, ckey, current, set, Some(entry), list);
            }
        }
        self.choose_reused(key, ckey, current, &entry)
    }

    /// A key only other devices measured: `list` (the best few of their ranking) measured and
    /// recorded as the whole set; then, if the medians measured here rank them unlike the
    /// other devices did (`new_device::agrees`), every other candidate too, with the leader
    /// measured again beside them, so a ranking from a device unlike this one (or a broken or
    /// poisoned one) costs a full tune, never a worse winner.
    fn transfer(
        &self,
        key: &O::Key,
        ckey: &Key,
        current: &[CandidateId],
        set: Fingerprint,
        list: Vec<CandidateId>,
        predicted: &[(CandidateId, f64)],
    ) -> Result<Arc<Choice<O::Handle>>, TuneError> {
        let choice = self.tune(key, ckey, current, set, None, list.clone())?;
        let Some(entry) = self.cache().lookup(self.ns, ckey).map(|e| Entry::clone(&e)) else {
            return Ok(choice);
        };
        let measured: Vec<(CandidateId, f64)> = entry
            .candidates()
            .iter()
            .filter(|c| list.contains(&c.id))
            .filter_map(|c| c.stats().map(|s| (c.id.clone(), s.median_ns)))
            .collect();
        if crate::predict::new_device::agrees(predicted, &measured) {
            return Ok(choice);
        }
        let mut rest: Vec<CandidateId> = current
            .iter()
            .filter(|c| !list.contains(c))
            .cloned()
            .collect();
        if let Some(leader) = ranked_current(&entry, current).first() {
            rest.push(leader.id.clone());
        }
        tracing::info!(
            "tunecache: {} {ckey}: the {} candidates other devices rank best measure here in \
             nearly the other way round; measuring the other {} too",
            self.namespace(),
            list.len(),
            current.len() - list.len()
        );
        let whole = self.tune(key, ckey, current, set, Some(entry), rest);
        // One key, tuned in two rounds: counted once (a second round that failed before its
        // measurements counted nothing).
        if whole.is_ok() {
            self.counters.tuned_keys.fetch_sub(1, Ordering::Relaxed);
        }
        whole
    }

    /// Measures `list` for the key, records the results with the candidate set in one record,
    /// and chooses.
    pub(super) fn tune(
        &self,
        key: &O::Key,
        ckey: &Key,
        current: &[CandidateId],
        set: Fingerprint,
        stored: Option<Entry>,
        list: Vec<CandidateId>,
    ) -> Result<Arc<Choice<O::Handle>>, TuneError> {
        self.tune_until(key, ckey, current, set, stored, &list, None)
    }

    /// [`Self::tune`], measuring `list` one candidate a round and stopping once the rest
    /// cannot win by the prediction's `ranking` (`predict/early_stop.rs`), if one is given.
    #[allow(
        clippy::too_many_arguments,
        reason = "tune's arguments and the ranking that may stop it"
    )]
    pub(super) fn tune_until(
        &self,
        key: &O::Key,
        ckey: &Key,
        current: &[CandidateId],
        set: Fingerprint,
        stored: Option<Entry>,
        list: &[CandidateId],
        ranking: Option<&[(CandidateId, Option<f64>)]>,
    ) -> Result<Arc<Choice<O::Handle>>, TuneError> {
        let started = Instant::now();
        let origin = cache_core::measured_here();
        let mut entry = stored.unwrap_or_else(|| {
            Entry::new(
                ckey.clone(),
                Fingerprint::default(),
                origin.clone(),
                now_millis(),
                [],
            )
        });
        let mut handles: HashMap<CandidateId, Arc<O::Handle>> = HashMap::new();
        let results = if list.is_empty() {
            Vec::new()
        } else {
            let results =
                self.measure_list(key, ckey, current, &entry, list, ranking, &mut handles)?;
            self.counters.tuned_keys.fetch_add(1, Ordering::Relaxed);
            lock(&self.counted).insert(ckey.fingerprint(), true);
            self.counters
                .tuning_ns
                .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
            results
        };
        // The measurements and the candidate set they complete, in one record: one durable
        // write per key, and no state in which the set is recorded without its results.
        let done = Entry::new(ckey.clone(), set, origin, now_millis(), results);
        entry.merge(done.clone());
        self.record(done);
        let choice = self.choose(key, ckey, current, &entry, handles)?;
        if !list.is_empty() {
            self.progress(&Progress::Tuned {
                namespace: self.namespace(),
                key: ckey,
                winner: &choice.candidate,
                elapsed: started.elapsed(),
            });
        }
        Ok(choice)
    }

    /// Prepares every candidate of `list` (keeping the handles of those that prepared),
    /// measures them together, and returns each one's result as a candidate to record; with a
    /// `ranking`, one candidate a round, until the rest cannot win by it.
    #[allow(
        clippy::too_many_arguments,
        reason = "the list, the ranking that may stop it, and where handles go"
    )]
    fn measure_list(
        &self,
        key: &O::Key,
        ckey: &Key,
        current: &[CandidateId],
        entry: &Entry,
        list: &[CandidateId],
        ranking: Option<&[(CandidateId, Option<f64>)]>,
        handles: &mut HashMap<CandidateId, Arc<O::Handle>>,
    ) -> Result<Vec<Candidate>, TuneError> {
        let mut results = Vec::new();
        self.progress(&Progress::Tuning {
            namespace: self.namespace(),
            key: ckey,
            candidates: list.len(),
        });
        let mut problem = self.op.problem(key).map_err(|reason| TuneError::Problem {
            namespace: self.namespace().to_owned(),
            key: ckey.to_string(),
            reason: reason.to_string(),
        })?;
        let best = ranked_current(entry, current)
            .first()
            .and_then(|c| c.stats().map(|s| s.median_ns));
        let rounds: Vec<&[CandidateId]> = match ranking {
            Some(_) => list.chunks(1).collect(),
            None => vec![list],
        };
        let mut done = 0;
        for round in rounds {
            self.measure_round(key, &mut problem, round, best, handles, &mut results);
            done += round.len();
            if let Some(ranking) = ranking
                && may_stop(ranking, &measured_of(&results), &list[done..])
            {
                break;
            }
        }
        Ok(results)
    }

    /// Prepares and measures one round of candidates, adding each one's result to `results`.
    fn measure_round(
        &self,
        key: &O::Key,
        problem: &mut O::Problem,
        list: &[CandidateId],
        best: Option<f64>,
        handles: &mut HashMap<CandidateId, Arc<O::Handle>>,
        results: &mut Vec<Candidate>,
    ) {
        // Prepare (compile) every candidate first, then measure them together,
        // interleaved (see `measure_all`), so load changes land on all alike.
        let mut prepared: Vec<Prepared<O::Handle>> = Vec::with_capacity(list.len());
        for spec in list {
            let t0 = Instant::now();
            let handle = self
                .op
                .prepare(spec, key)
                .map(Arc::new)
                .map_err(|e| format!("prepare failed: {e}"));
            prepared.push((spec.clone(), handle, t0.elapsed()));
        }
        let ready: Vec<&O::Handle> = prepared
            .iter()
            .filter_map(|(_, h, _)| h.as_ref().ok().map(|h| &**h))
            .collect();
        let mut measured =
            measure_all(&self.op, &ready, problem, &self.config.measure, best).into_iter();
        results.reserve(prepared.len());
        for (spec, handle, prep) in prepared {
            let (outcome, spent) = match handle {
                Err(e) => (Err(e), Duration::ZERO),
                Ok(handle) => {
                    let m = measured.next().expect("one result per prepared handle");
                    handles.insert(spec.clone(), handle);
                    let spent = m.as_ref().map_or(Duration::ZERO, |m| m.spent);
                    (m, spent)
                }
            };
            let mut candidate = Candidate::new(
                spec.clone(),
                match &outcome {
                    Ok(m) => Outcome::Measured(m.stats),
                    Err(e) => Outcome::Failed(e.clone()),
                },
            );
            candidate.tuning_ns = Some((prep + spent).as_nanos() as u64);
            candidate.policy = Some(self.policy());
            self.counters.measured.fetch_add(1, Ordering::Relaxed);
            self.progress(&Progress::Measured {
                namespace: self.namespace(),
                candidate: &spec,
                result: outcome.as_ref().map(|m| &m.stats).map_err(String::as_str),
                stopped_early: outcome.as_ref().is_ok_and(|m| m.stopped_early),
            });
            results.push(candidate);
        }
    }

    /// Queues `key` for tuning on a background thread (one per operation), within `budget`
    /// of background tuning time in this process.
    pub(super) fn enqueue_background(self: &Arc<Self>, key: O::Key, budget: Duration) {
        let mut bg = lock(&self.background);
        if !bg.push(key, budget) {
            return;
        }
        let me = Arc::clone(self);
        let spawned = cache_core::spawn_background(
            format!("tunecache-tune-{}", self.namespace()),
            move || me.background_loop(budget),
        );
        if spawned.is_err() {
            bg.stop();
        }
    }

    fn background_loop(self: Arc<Self>, budget: Duration) {
        loop {
            let Some(key) = lock(&self.background).next(budget) else {
                return;
            };
            let started = Instant::now();
            if let Ok(choice) = self.resolve(&key, &MissPolicy::TuneNow, false) {
                let choice = self.reconcile(&key, choice);
                self.publish(&key, &choice);
            }
            lock(&self.background).spend(started.elapsed());
        }
    }
}
