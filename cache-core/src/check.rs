//! Whether every reader would accept an entry: the one check that `put`, `import`, bundles,
//! the record writer and the table migration make before anything is written. Its own room,
//! below the cache, so the writers beside and below it use it without reaching up into the
//! save queue.
//!
//! The check is made on the model, without encoding the entry: a model entry is always well
//! formed (its fingerprint is its key's, its fields sorted and unique, its strings UTF-8, its
//! origin and outcomes of the kinds a file holds), so what a reader can refuse in its bytes
//! is only nesting, finite and non-negative timings, and the census caps on fields and
//! candidates, all of which the model check counts. Only an entry past a cap or a bound is
//! encoded, for the reader's own check to say why. Writers that have the bytes at hand check
//! them ([`check_encoded`]); a property test holds the two answers equal.

use cache_format::{CacheData, Entry, Fields, Fingerprint, Scope};

use crate::error::Refusal;

/// Whether every reader would accept `entry` (in `scope` and namespace `ns`): finite
/// statistics, and its encoding within the bounds and caps of `limits`. A `Cache` refuses what
/// is not where it enters (`put`, `import`), with a warning, so it never holds back the good
/// entries saved with it; a tool that imports all or nothing checks first with this.
pub fn check_entry(
    scope: &Scope,
    ns: &str,
    entry: &Entry,
    limits: &cache_format::Limits,
) -> Result<(), Refusal> {
    check_alone(scope, ns, entry, limits)?;
    check_context(scope, ns, entry, limits)
}

/// The entry's part of [`check_entry`]: what a reader checks of its own bytes.
fn check_alone(
    scope: &Scope,
    ns: &str,
    entry: &Entry,
    limits: &cache_format::Limits,
) -> Result<(), Refusal> {
    check_model(scope, entry, limits)?;
    if !within_bounds(entry, limits) {
        // Past a cap or a bound: the reader's check of the bytes says whether, and why.
        let key = cache_format::table::TKey::of(scope, ns, &entry.fingerprint());
        let bytes = cache_format::table::encode_entry(entry);
        cache_format::table::check_entry(&key, ns, &bytes, limits).map_err(Refusal::Unreadable)?;
    }
    Ok(())
}

/// What [`check_entry`] checks on the model before the caps: nesting (named by field) and
/// statistics.
fn check_model(scope: &Scope, entry: &Entry, limits: &cache_format::Limits) -> Result<(), Refusal> {
    // Nesting first, so the error names the field (the encoded check below only has an offset).
    // `what` is named only for a refusal: a put that passes formats nothing.
    let too_deep = |what: &dyn Fn() -> String, fields: &Fields, max: u32| {
        fields.iter().find_map(|(name, v)| {
            let depth = v.depth();
            (depth > max).then(|| Refusal::TooDeep {
                what: what(),
                name: name.clone(),
                depth,
                max,
            })
        })
    };
    let nesting = too_deep(
        &|| "scope field".to_owned(),
        scope.fields(),
        limits.max_scope_field_depth(),
    )
    .or_else(|| {
        too_deep(
            &|| "key field".to_owned(),
            entry.key().fields(),
            limits.max_key_field_depth(),
        )
    })
    .or_else(|| {
        entry.candidates().iter().find_map(|c| {
            let what = || format!("{} param", c.id.algorithm);
            let policy = || format!("{} policy", c.id.algorithm);
            too_deep(&what, &c.id.params, limits.max_param_depth()).or_else(|| {
                // A candidate's policy sits where its params do.
                let fields = c.policy.as_ref()?;
                too_deep(&policy, fields, limits.max_param_depth())
            })
        })
    });
    if let Some(why) = nesting {
        return Err(why);
    }
    for c in entry.candidates() {
        if let Some(s) = c.stats()
            && !(s.median_ns.is_finite() && s.min_ns.is_finite() && s.spread_ns.is_finite())
        {
            return Err(Refusal::NonFinite {
                candidate: c.id.to_string(),
            });
        }
        if let Some(s) = c.stats()
            && (s.median_ns < 0.0 || s.min_ns < 0.0 || s.spread_ns < 0.0)
        {
            return Err(Refusal::Negative {
                candidate: c.id.to_string(),
            });
        }
    }
    Ok(())
}

/// Whether a reader surely accepts the encoding of an entry that passed [`check_model`]: its
/// fields and candidates within the census caps, and its own containers within the nesting
/// bound (FORMAT.md, "Payload": an entry's map sits 6 containers into a payload, its origin
/// and a non-empty key or candidate list at 7, a candidate at 8, non-empty params or policy
/// at 9; the values in them [`check_model`] has bounded). `false` is "not sure": the reader's
/// own check of the bytes decides, and names what it refuses.
fn within_bounds(entry: &Entry, limits: &cache_format::Limits) -> bool {
    let within = |count: usize, limit: u64| count as u64 <= limit;
    let candidates = entry.candidates();
    let nested = |c: &cache_format::Candidate| {
        !c.id.params.is_empty() || c.policy.as_ref().is_some_and(|p| !p.is_empty())
    };
    let deepest = if candidates.iter().any(|c| nested(c)) {
        9
    } else if candidates.is_empty() {
        7
    } else {
        8
    };
    deepest <= limits.max_depth
        && within(entry.key().fields().len(), limits.max_fields)
        && within(candidates.len(), limits.max_candidates)
        && candidates
            .iter()
            .all(|c| within(c.id.params.len(), limits.max_fields))
}

/// [`check_entry`] of an entry already encoded as a table stores it (`bytes`, under `key`),
/// for writers that write those bytes next: the checks that do not need the bytes, then the
/// entry as a table's reader checks it (the quick check first; the decoder, for its message,
/// only when that declines).
pub(crate) fn check_encoded(
    scope: &Scope,
    ns: &str,
    entry: &Entry,
    key: &cache_format::table::TKey,
    bytes: &[u8],
    limits: &cache_format::Limits,
) -> Result<(), Refusal> {
    check_model(scope, entry, limits)?;
    cache_format::table::check_entry(key, ns, bytes, limits).map_err(Refusal::Unreadable)?;
    check_context(scope, ns, entry, limits)
}

/// The scope and namespace as a journal record or a table's directory holds them: checked in
/// a payload with this entry, once per thread for each scope, namespace and bounds.
fn check_context(
    scope: &Scope,
    ns: &str,
    entry: &Entry,
    limits: &cache_format::Limits,
) -> Result<(), Refusal> {
    thread_local! {
        static CHECKED: std::cell::RefCell<Vec<(Fingerprint, String, cache_format::Limits)>> =
            const { std::cell::RefCell::new(Vec::new()) };
    }
    let fp = scope.fingerprint();
    let known =
        CHECKED.with_borrow(|c| c.iter().any(|(s, n, l)| *s == fp && n == ns && l == limits));
    if !known {
        let mut one = CacheData::new();
        one.insert(scope, ns, entry.clone());
        cache_format::check_payload(&cache_format::encode_payload(&one), limits)
            .map_err(Refusal::Unreadable)?;
        CHECKED.with_borrow_mut(|c| {
            if c.len() >= 64 {
                c.remove(0);
            }
            c.push((fp, ns.to_owned(), *limits));
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cache_format::{Candidate, Fields, Key, Limits, Origin, Stats, Value};

    fn entry(fields: usize, candidates: usize, depth: usize) -> Entry {
        let mut nested = Value::Int(1);
        for _ in 0..depth {
            nested = Value::List(vec![nested]);
        }
        let key = Key::new(
            (0..fields)
                .map(|i| (format!("f{i}"), Value::Int(i as i64)))
                .chain([("deep".to_owned(), nested)])
                .collect::<Fields>(),
        );
        let stats = Stats {
            median_ns: 10.0,
            min_ns: 9.0,
            spread_ns: 1.0,
            samples: 3,
        };
        Entry::new(
            key,
            Fingerprint::default(),
            Origin::Imported("t".into()),
            5,
            (0..candidates).map(|i| Candidate::measured(format!("a{i}"), Fields::new(), stats)),
        )
    }

    /// The quick check says what the whole-payload check says, on entries at and past every
    /// bound it looks at (fields, candidates, nesting), under tight and default limits.
    #[test]
    fn check_entry_agrees_with_the_payload_check() {
        let scope = Scope::default();
        let tight = Limits {
            max_fields: 8,
            max_candidates: 4,
            max_depth: 14,
            ..Limits::default()
        };
        for limits in [tight, Limits::default()] {
            for fields in [0, 6, 7, 8, 9, 300] {
                for candidates in [0, 1, 4, 5] {
                    for depth in [0, 3, 6, 7, 30] {
                        let e = entry(fields, candidates, depth);
                        let mut one = CacheData::new();
                        one.insert(&scope, "mm", e.clone());
                        let whole = cache_format::check_payload(
                            &cache_format::encode_payload(&one),
                            &limits,
                        );
                        let quick = check_entry(&scope, "mm", &e, &limits);
                        assert_eq!(
                            quick.is_ok(),
                            whole.is_ok(),
                            "fields {fields}, candidates {candidates}, depth {depth}, \
                             {limits:?}: {quick:?} against {whole:?}"
                        );
                    }
                }
            }
        }
    }
}

/// The model check against the reader's check of the encoded bytes, on entries generated
/// around tight bounds (nesting, fields, candidates), with timings of every kind.
#[cfg(test)]
mod agree {
    use super::*;
    use cache_format::{Candidate, CandidateId, Key, Limits, Origin, Outcome, Stats, Value};
    use proptest::prelude::*;

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::Int),
            ".{0,4}".prop_map(Value::Str),
        ]
    }

    fn value() -> impl Strategy<Value = Value> {
        leaf().prop_recursive(9, 40, 3, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::List),
                prop::collection::vec(("[a-c]{0,2}", inner), 0..3)
                    .prop_map(|m| Value::Map(m.into_iter().collect())),
            ]
        })
    }

    fn fields() -> impl Strategy<Value = Fields> {
        // Mostly scalars, so that many entries pass the nesting bounds and reach the others.
        let value = prop_oneof![3 => leaf(), 1 => value()];
        prop::collection::vec((".{0,3}", value), 0..5).prop_map(|m| m.into_iter().collect())
    }

    fn timing() -> impl Strategy<Value = f64> {
        let measurable =
            prop::sample::select(vec![0.0, -0.0, 1.5, 2.5e6, 1e308, f64::MIN_POSITIVE]);
        let refused = prop::sample::select(vec![-1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY]);
        prop_oneof![19 => measurable, 1 => refused]
    }

    fn candidate() -> impl Strategy<Value = Candidate> {
        let outcome = prop_oneof![
            (timing(), timing(), timing(), any::<u32>()).prop_map(|(m, n, s, k)| {
                Outcome::Measured(Stats {
                    median_ns: m,
                    min_ns: n,
                    spread_ns: s,
                    samples: k,
                })
            }),
            ".{0,6}".prop_map(Outcome::Failed),
            ".{0,6}".prop_map(Outcome::Chosen),
        ];
        (
            ".{0,3}",
            fields(),
            outcome,
            any::<u64>(),
            any::<Option<u64>>(),
            prop::option::of(fields()),
        )
            .prop_map(|(algo, params, outcome, measured_at, tuning_ns, policy)| {
                Candidate {
                    id: CandidateId::with_params(algo, params),
                    outcome,
                    measured_at,
                    tuning_ns,
                    policy,
                }
            })
    }

    fn entry() -> impl Strategy<Value = Entry> {
        let origin = prop_oneof![
            ".{0,6}".prop_map(Origin::Measured),
            ".{0,6}".prop_map(Origin::Imported),
            ".{0,6}".prop_map(Origin::Remote),
        ];
        (
            fields(),
            any::<[u8; 16]>(),
            origin,
            any::<u64>(),
            prop::collection::vec(candidate(), 0..5),
        )
            .prop_map(|(key, set, origin, at, candidates)| {
                Entry::new(Key::new(key), Fingerprint(set), origin, at, candidates)
            })
    }

    fn limits() -> impl Strategy<Value = Limits> {
        // Most around the bounds of an entry's own containers (7 to 9), some far from them.
        let depth = prop_oneof![3 => 6u32..11, 1 => 0u32..20];
        (depth, 0u64..5, 0u64..5).prop_map(|(max_depth, max_fields, max_candidates)| Limits {
            max_depth,
            max_fields,
            max_candidates,
            ..Limits::default()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        /// `check_entry` (the model alone) refuses exactly what the reader refuses in the
        /// entry's encoding, with the same words.
        #[test]
        fn the_model_check_says_what_the_reader_says(
            scope in fields().prop_map(Scope::new),
            ns in prop::sample::select(vec!["mm", "a b", "ünï", ""]),
            entry in entry(),
            limits in limits(),
        ) {
            let key = cache_format::table::TKey::of(&scope, ns, &entry.fingerprint());
            let bytes = cache_format::table::encode_entry(&entry);
            // Without the scope's and namespace's check, which both make alike once per
            // thread (and which would catch an entry the model let through on its first use).
            let reader = check_model(&scope, &entry, &limits).and_then(|()| {
                cache_format::table::check_entry(&key, ns, &bytes, &limits)
                    .map_err(Refusal::Unreadable)
            });
            let model = check_alone(&scope, ns, &entry, &limits);
            prop_assert_eq!(
                model.as_ref().map_err(ToString::to_string),
                reader.as_ref().map_err(ToString::to_string),
                "{:?} under {:?}", entry, limits
            );
        }
    }
}
