//! What to measure for a key, decided from what is stored: a pure function of the stored entry,
//! the entries of other scopes, and the current candidates. No I/O, so every case is a unit
//! test.

use cache_core::cache_format::{
    Candidate, CandidateId, Entry, FAMILY_VERSION_PREFIX, Fields, Fingerprint, Outcome, Scope,
    Value, policy_class, rank,
};

/// The plan for a key that missed the dispatch table.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Plan {
    /// The stored entry is complete for the current candidate set.
    Use(Entry),
    /// Measure these; `entry` is what is stored already (if anything).
    Measure {
        entry: Option<Entry>,
        list: Vec<CandidateId>,
    },
    /// Only other devices measured the key: measure `list` (the best few of their ranking),
    /// then everything else if what was measured here ranks them unlike `predicted` (their
    /// predicted slowdowns), see `predict/new_device.rs`.
    Transfer {
        list: Vec<CandidateId>,
        predicted: Vec<(CandidateId, f64)>,
    },
    /// Nothing usable is stored.
    Miss,
}

/// Entries of one key under other scopes, with their scopes.
type Scoped = Vec<(Scope, Entry)>;

/// What is known about one key when a plan is made.
#[derive(Debug)]
pub(super) struct Known<'a> {
    /// The entry of the current scope, if any.
    pub(super) stored: Option<Entry>,
    /// The entries of the same key under other scopes, with their scopes.
    pub(super) others: Vec<(Scope, Entry)>,
    /// The current scope.
    pub(super) scope: &'a Scope,
    /// Scope fields that may differ for a warm start (driver, library, ...).
    pub(super) volatile: &'a [String],
    /// The checksum a top-k tune records for the current set, when the miss policy accepts
    /// such a partial entry as complete.
    pub(super) partial_ok: Option<Fingerprint>,
    /// The comparable part of the tuner's measurement policy (`None`: unknown): a stored
    /// result of another known policy counts as not measured.
    pub(super) policy: Option<Fields>,
    /// On a device with no result for the key that other devices measured: how many of their
    /// ranking's best are measured (see `predict/new_device.rs`); 0: the miss policy decides.
    pub(super) transfer_top: usize,
}

/// Decides what to measure:
/// - the stored entry is complete for the current candidate-set checksum: nothing;
/// - some current candidates are recorded: the missing ones plus the current leader, measured
///   again under the same conditions (the set grew, or a tune was interrupted); none if
///   nothing is missing (the set shrank);
/// - only a compatible older scope has the key (same device, new driver or library): its
///   stored top `retime_top` that are current;
/// - only other devices have it, and `transfer_top` is not 0: the best `transfer_top` of
///   their ranking, and every current candidate none of them measured, then the rest if
///   the measurements disagree with that ranking (`predict/new_device.rs`);
/// - otherwise a miss, for the miss policy to handle.
pub(super) fn plan(
    known: Known<'_>,
    current: &[CandidateId],
    set: Fingerprint,
    retime_top: usize,
) -> Plan {
    if let Some(stored) = known.stored {
        // A result measured under another known policy is not comparable: it counts as not
        // measured (a result of unknown policy, from before policies were recorded, counts).
        let usable =
            |c: &Candidate| c.policy.is_none() || policy_class(c.policy.as_ref()) == known.policy;
        let all_usable = stored
            .candidates()
            .iter()
            .map(|c| &**c)
            .filter(|c| current.contains(&c.id))
            .all(usable);
        let complete =
            stored.candidate_set() == set || Some(stored.candidate_set()) == known.partial_ok;
        if complete && all_usable {
            return Plan::Use(stored);
        }
        // Only winners other tools chose (an imported shipped config): nothing was measured,
        // so it is a miss, which the miss policy handles (a provisional policy serves the
        // shipped choice while the key is tuned).
        let mut of_current = stored
            .candidates()
            .iter()
            .filter(|c| current.contains(&c.id))
            .peekable();
        if of_current.peek().is_some()
            && of_current.all(|c| matches!(c.outcome, Outcome::Chosen(_)))
        {
            return Plan::Miss;
        }
        // A winner another tool chose is not a measurement: it is measured like a candidate
        // never recorded.
        let recorded: Vec<&CandidateId> = stored
            .candidates()
            .iter()
            .filter(|c| usable(c) && !matches!(c.outcome, Outcome::Chosen(_)))
            .map(|c| &c.id)
            .filter(|id| current.contains(id))
            .collect();
        let mut list: Vec<CandidateId> = current
            .iter()
            .filter(|id| !recorded.contains(id))
            .cloned()
            .collect();
        if !list.is_empty()
            && let Some(leader) = ranked_current(&stored, current).first()
            && !list.contains(&leader.id)
        {
            list.push(leader.id.clone());
        }
        return Plan::Measure {
            entry: Some(stored),
            list,
        };
    }
    let (mut priors, devices): (Scoped, Scoped) = known
        .others
        .into_iter()
        .partition(|(scope, _)| compatible(known.scope, scope, known.volatile));
    priors.sort_by_key(|(_, e)| std::cmp::Reverse(e.recorded_at()));
    if let Some((_, prior)) = priors.first() {
        let top: Vec<CandidateId> = ranked_current(prior, current)
            .into_iter()
            .take(retime_top.max(1))
            .map(|c| c.id.clone())
            .collect();
        if !top.is_empty() {
            return Plan::Measure {
                entry: None,
                list: top,
            };
        }
    }
    let devices: Vec<&Entry> = devices.iter().map(|(_, e)| e).collect();
    match crate::predict::new_device::to_measure(&devices, current, known.transfer_top) {
        Some((list, predicted)) => Plan::Transfer { list, predicted },
        None => Plan::Miss,
    }
}

/// The measured candidates of `entry` that are in the current set, best first. A stored
/// candidate outside the current set never counts.
pub(super) fn ranked_current<'a>(entry: &'a Entry, current: &[CandidateId]) -> Vec<&'a Candidate> {
    rank(
        entry
            .candidates()
            .iter()
            .map(|c| &**c)
            .filter(|c| c.stats().is_some() && current.contains(&c.id)),
    )
}

/// Whether `other` differs from `current` only in volatile fields (a driver or library
/// upgrade on the same device), a family's version (`version.<family>`) among them.
pub(super) fn compatible(current: &Scope, other: &Scope, volatile: &[String]) -> bool {
    let stable = |s: &Scope| -> Vec<(String, Value)> {
        s.fields()
            .iter()
            .filter(|(k, _)| !k.starts_with(FAMILY_VERSION_PREFIX))
            .filter(|(k, _)| !volatile.iter().any(|v| v == *k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    current != other && stable(current) == stable(other)
}

#[cfg(test)]
mod tests {
    use cache_core::cache_format::{Key, Origin, Stats};

    use super::*;

    fn f(pairs: &[(&str, i64)]) -> Fields {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::Int(*v)))
            .collect()
    }

    fn id(name: &str) -> CandidateId {
        CandidateId::new(name, &[])
    }

    fn set_of(ids: &[CandidateId]) -> Fingerprint {
        Fingerprint::of_candidate_set(
            ids.iter().map(|c| (c.algorithm.as_str(), &c.params)),
            &Fields::new(),
        )
    }

    fn timed(name: &str, median: f64) -> Candidate {
        let stats = Stats {
            median_ns: median,
            min_ns: median,
            spread_ns: 0.0,
            samples: 5,
        };
        Candidate::measured(name, Fields::new(), stats)
    }

    fn entry(set: Fingerprint, recorded_at: u64, candidates: Vec<Candidate>) -> Entry {
        Entry::new(
            Key::new(f(&[("m", 64)])),
            set,
            Origin::Measured("test".into()),
            recorded_at,
            candidates,
        )
    }

    fn scope(device: &str, driver: &str) -> Scope {
        Scope::new(Fields::from([
            ("device".to_owned(), Value::from(device)),
            ("driver".to_owned(), Value::from(driver)),
        ]))
    }

    fn known<'a>(
        stored: Option<Entry>,
        others: Vec<(Scope, Entry)>,
        here: &'a Scope,
        volatile: &'a [String],
    ) -> Known<'a> {
        Known {
            stored,
            others,
            scope: here,
            volatile,
            partial_ok: None,
            policy: None,
            transfer_top: 0,
        }
    }

    #[test]
    fn results_of_another_measurement_policy_count_as_not_measured() {
        let current = [id("a"), id("b")];
        let set = set_of(&current);
        let policy = |timer: &str, samples: i64| {
            Fields::from([
                ("timer".to_owned(), Value::from(timer)),
                ("samples".to_owned(), Value::Int(samples)),
            ])
        };
        let entry = |p: Option<Fields>| {
            let mut a = timed("a", 10.0);
            let mut b = timed("b", 20.0);
            a.policy = p.clone();
            b.policy = p;
            Entry::new(
                Key::new(f(&[("m", 8)])),
                set,
                Origin::Measured("here".into()),
                0,
                [a, b],
            )
        };
        let here = scope("gpu", "1");
        let mine = policy_class(Some(&policy("wall", 9)));
        let plan_for = |stored: Entry| {
            let mut k = known(Some(stored), vec![], &here, &[]);
            k.policy = mine.clone();
            plan(k, &current, set, 3)
        };
        // The same policy, or the same but for the sample count: used as it is.
        for p in [policy("wall", 9), policy("wall", 3)] {
            assert!(matches!(plan_for(entry(Some(p))), Plan::Use(_)));
        }
        // Unknown (an older file's results): used as it is.
        assert!(matches!(plan_for(entry(None)), Plan::Use(_)));
        // Another timer: everything is measured again.
        match plan_for(entry(Some(policy("cuda-events", 9)))) {
            Plan::Measure { list, .. } => assert_eq!(list, vec![id("a"), id("b")]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_partial_top_k_entry_is_complete_only_where_the_policy_accepts_it() {
        let current = [id("a"), id("b"), id("c")];
        let (set, partial) = (set_of(&current), set_of(&current[..1]));
        let stored = Entry::new(
            Key::new(f(&[("m", 8)])),
            partial,
            Origin::Measured("here".into()),
            0,
            [timed("a", 10.0)],
        );
        let here = scope("gpu", "1");
        let mut accepting = known(Some(stored.clone()), vec![], &here, &[]);
        accepting.partial_ok = Some(partial);
        assert_eq!(plan(accepting, &current, set, 3), Plan::Use(stored.clone()));
        // A full tune measures only the rest, and the leader again.
        match plan(known(Some(stored), vec![], &here, &[]), &current, set, 3) {
            Plan::Measure { list, .. } => assert_eq!(list, vec![id("b"), id("c"), id("a")]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_complete_entry_for_the_current_set_is_used_as_it_is() {
        let current = [id("a"), id("b")];
        let set = set_of(&current);
        let stored = entry(set, 1, vec![timed("a", 10.0), timed("b", 20.0)]);
        let here = scope("H100", "560");
        let got = plan(
            known(Some(stored.clone()), vec![], &here, &[]),
            &current,
            set,
            3,
        );
        assert_eq!(got, Plan::Use(stored));
    }

    #[test]
    fn a_shipped_winner_alone_is_a_miss_and_beside_measurements_is_measured() {
        // An imported vLLM config: b chosen, nothing measured: a miss, for the miss policy.
        let shipped = Candidate::chosen("b", Fields::new(), "vllm config");
        let stored = entry(Fingerprint::default(), 1, vec![shipped.clone()]);
        let current = [id("a"), id("b"), id("c")];
        let here = scope("H100", "560");
        let plan_for = |stored: Entry| {
            plan(
                known(Some(stored), vec![], &here, &[]),
                &current,
                set_of(&current),
                3,
            )
        };
        assert_eq!(plan_for(stored), Plan::Miss);
        // With a measurement beside it, the rest is measured, the chosen one too (it is no
        // measurement); the measured leader is re-timed.
        let mixed = entry(Fingerprint::default(), 1, vec![shipped, timed("a", 10.0)]);
        let Plan::Measure { list, .. } = plan_for(mixed) else {
            panic!("expected a measurement plan");
        };
        assert_eq!(list, vec![id("b"), id("c"), id("a")]);
    }

    #[test]
    fn a_grown_set_measures_only_the_new_candidates_plus_the_leader() {
        let old = [id("a"), id("b"), id("c")];
        let stored = entry(
            set_of(&old),
            1,
            vec![timed("a", 30.0), timed("b", 10.0), timed("c", 20.0)],
        );
        let current = [id("a"), id("b"), id("c"), id("d")];
        let here = scope("H100", "560");
        let got = plan(
            known(Some(stored), vec![], &here, &[]),
            &current,
            set_of(&current),
            3,
        );
        let Plan::Measure { list, entry } = got else {
            panic!("expected a measurement plan, got {got:?}");
        };
        assert!(entry.is_some());
        assert_eq!(list, vec![id("d"), id("b")], "the new one, then the leader");
    }

    #[test]
    fn an_interrupted_tune_resumes_with_what_is_missing() {
        let current = [id("a"), id("b"), id("c")];
        // Recorded under the zero checksum: incomplete.
        let stored = entry(Fingerprint::default(), 1, vec![timed("a", 30.0)]);
        let here = scope("H100", "560");
        let got = plan(
            known(Some(stored), vec![], &here, &[]),
            &current,
            set_of(&current),
            3,
        );
        let Plan::Measure { list, .. } = got else {
            panic!("expected a measurement plan, got {got:?}");
        };
        assert_eq!(list, vec![id("b"), id("c"), id("a")]);
    }

    #[test]
    fn a_shrunk_set_measures_nothing() {
        let stored = entry(
            set_of(&[id("a"), id("b")]),
            1,
            vec![timed("a", 30.0), timed("b", 10.0)],
        );
        let current = [id("a")];
        let here = scope("H100", "560");
        let got = plan(
            known(Some(stored), vec![], &here, &[]),
            &current,
            set_of(&current),
            3,
        );
        assert!(
            matches!(got, Plan::Measure { ref list, .. } if list.is_empty()),
            "{got:?}"
        );
    }

    #[test]
    fn a_compatible_older_scope_gives_its_current_top_to_retime() {
        let current = [id("a"), id("b"), id("c"), id("d")];
        let old_driver = entry(
            set_of(&current),
            5,
            vec![
                timed("a", 40.0),
                timed("b", 10.0),
                timed("c", 20.0),
                timed("gone", 1.0),
            ],
        );
        let older_still = entry(set_of(&current), 1, vec![timed("d", 1.0)]);
        let here = scope("H100", "560");
        let volatile = vec!["driver".to_owned()];
        let others = vec![
            (scope("H100", "540"), older_still),
            (scope("H100", "550"), old_driver),
            (
                scope("A100", "560"),
                entry(set_of(&current), 9, vec![timed("a", 1.0)]),
            ),
        ];
        let got = plan(
            known(None, others, &here, &volatile),
            &current,
            set_of(&current),
            2,
        );
        assert_eq!(
            got,
            Plan::Measure {
                entry: None,
                list: vec![id("b"), id("c")]
            },
            "the latest compatible scope's top two current candidates; another device never counts"
        );
    }

    #[test]
    fn nothing_stored_anywhere_compatible_is_a_miss() {
        let current = [id("a")];
        let here = scope("H100", "560");
        let others = vec![(
            scope("A100", "560"),
            entry(set_of(&current), 1, vec![timed("a", 1.0)]),
        )];
        let volatile = vec!["driver".to_owned()];
        let got = plan(
            known(None, others, &here, &volatile),
            &current,
            set_of(&current),
            3,
        );
        assert_eq!(got, Plan::Miss);
        assert_eq!(
            plan(
                known(None, vec![], &here, &volatile),
                &current,
                set_of(&current),
                3
            ),
            Plan::Miss
        );
    }

    #[test]
    fn only_volatile_fields_may_differ_for_a_warm_start() {
        let volatile = vec!["driver".to_owned()];
        assert!(compatible(
            &scope("H100", "560"),
            &scope("H100", "550"),
            &volatile
        ));
        assert!(
            !compatible(&scope("H100", "560"), &scope("H100", "560"), &volatile),
            "the same scope is not a prior"
        );
        assert!(!compatible(
            &scope("H100", "560"),
            &scope("A100", "550"),
            &volatile
        ));
    }
}
