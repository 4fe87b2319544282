//! Property tests: a chain in one jump equals its steps one by one; migration never panics
//! on arbitrary schema-less input; a migrated cache round-trips.

use cache_format::rmpv::Value as Raw;
use cache_format::{
    CacheData, Candidate, Entry, Fields, Fingerprint, FormatVersion, Key, Limits, Origin, Scope,
    Stats, Value, encode_payload, encode_snapshot, read_snapshot,
};
use cache_migrate::{Migrations, Op, Step, upgrade};
use proptest::prelude::*;

const ALGOS: [&str; 4] = ["a", "b", "c", "d"];
const NAMES: [&str; 3] = ["p", "q", "r"];
const NSS: [&str; 3] = ["n1", "n2", "n3"];

fn name(pool: &'static [&'static str]) -> BoxedStrategy<String> {
    prop::sample::select(pool).prop_map(str::to_owned).boxed()
}

pub(crate) fn op() -> impl Strategy<Value = Op> {
    let ns = prop::option::of(name(&NSS));
    prop_oneof![
        (name(&ALGOS), name(&ALGOS), ns.clone()).prop_map(|(from, to, namespace)| {
            Op::RenameAlgorithm {
                from,
                to,
                namespace,
            }
        }),
        (
            name(&NAMES),
            name(&NAMES),
            prop::option::of(name(&ALGOS)),
            ns.clone()
        )
            .prop_map(|(from, to, algorithm, namespace)| Op::RenameParam {
                from,
                to,
                algorithm,
                namespace
            }),
        (name(&NAMES), prop::option::of(name(&ALGOS)), ns.clone()).prop_map(
            |(name, algorithm, namespace)| Op::DropParam {
                name,
                algorithm,
                namespace
            }
        ),
        (
            name(&NAMES),
            0i64..3,
            prop::option::of(name(&ALGOS)),
            ns.clone()
        )
            .prop_map(|(name, v, algorithm, namespace)| Op::SetParamDefault {
                name,
                value: Value::Int(v),
                algorithm,
                namespace
            }),
        (name(&NSS), name(&NSS)).prop_map(|(from, to)| Op::RenameNamespace { from, to }),
        name(&NSS).prop_map(|name| Op::DropNamespace { name }),
        (name(&NAMES), name(&NAMES), ns.clone()).prop_map(|(from, to, namespace)| {
            Op::RenameKeyField {
                from,
                to,
                namespace,
            }
        }),
        (name(&NAMES), ns.clone())
            .prop_map(|(name, namespace)| Op::DropKeyField { name, namespace }),
        (name(&NAMES), 0i64..3, ns).prop_map(|(name, v, namespace)| Op::SetKeyFieldDefault {
            name,
            value: Value::Int(v),
            namespace
        }),
    ]
}

fn fields() -> impl Strategy<Value = Fields> {
    prop::collection::btree_map(name(&NAMES), (0i64..3).prop_map(Value::Int), 0..3)
        .prop_map(|m| m.into_iter().collect())
}

pub(crate) fn data() -> impl Strategy<Value = CacheData> {
    let candidate =
        (name(&ALGOS), fields(), 1.0f64..100.0, 0u64..3).prop_map(|(algo, params, t, at)| {
            let mut c = Candidate::measured(
                algo,
                params,
                Stats {
                    median_ns: t,
                    min_ns: t,
                    spread_ns: 0.0,
                    samples: 1,
                },
            );
            c.measured_at = at;
            c
        });
    let entry =
        (fields(), prop::collection::vec(candidate, 0..4), 0u64..3).prop_map(|(key, cands, at)| {
            Entry::new(
                Key::new(key),
                Fingerprint::default(),
                Origin::Measured("p".into()),
                at,
                cands,
            )
        });
    prop::collection::vec((name(&NSS), entry, any::<bool>()), 0..10).prop_map(|items| {
        let scopes = [
            Scope::default(),
            Scope::new(Fields::from([("device".to_owned(), Value::from("x"))])),
        ];
        let mut d = CacheData::new();
        for (ns, e, second_scope) in items {
            d.insert(&scopes[usize::from(second_scope)], &ns, e);
        }
        d
    })
}

pub(crate) fn registry(steps: &[Vec<Op>], first: u32, last: u32) -> Migrations {
    let mut reg = Migrations::new("app", last);
    for (i, ops) in steps.iter().enumerate() {
        let from = i as u32 + 1;
        if from >= first && from < last {
            reg = reg
                .with(Step::declarative(
                    from,
                    from + 1,
                    format!("step {from}"),
                    ops.clone(),
                ))
                .expect("valid");
        }
    }
    reg
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn one_jump_equals_the_steps_one_by_one(input in data(), steps in prop::collection::vec(prop::collection::vec(op(), 0..4), 1..4)) {
        let last = steps.len() as u32 + 1;
        let limits = Limits::default();
        let jump = upgrade(&registry(&steps, 1, last), FormatVersion::CURRENT, "app", 1, &encode_payload(&input), &limits).map(|u| u.data);
        let mut by_steps = Ok(input);
        for from in 1..last {
            by_steps = by_steps.and_then(|d: CacheData| {
                upgrade(&registry(&steps, from, from + 1), FormatVersion::CURRENT, "app", from, &encode_payload(&d), &limits).map(|u| u.data)
            });
        }
        match (jump, by_steps) {
            (Ok(a), Ok(b)) => prop_assert_eq!(a, b),
            (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
            (a, b) => prop_assert!(false, "one jump {a:?} but step by step {b:?}"),
        }
    }

    #[test]
    fn a_migrated_cache_round_trips(input in data(), ops in prop::collection::vec(op(), 0..5)) {
        let reg = registry(&[ops], 1, 2);
        if let Ok(up) = upgrade(&reg, FormatVersion::CURRENT, "app", 1, &encode_payload(&input), &Limits::default()) {
            let bytes = encode_snapshot("app", 2, &up.data);
            let snap = read_snapshot(&bytes, &Limits::default()).expect("valid");
            prop_assert_eq!(cache_format::raw::decode_payload(snap.payload_bytes(), &Limits::default()).expect("decodes"), up.data.clone());
            // Migrating current data again changes nothing.
            let again = upgrade(&reg, FormatVersion::CURRENT, "app", 2, snap.payload_bytes(), &Limits::default()).expect("current");
            prop_assert!(again.report.is_none());
            prop_assert_eq!(again.data, up.data);
        }
    }

    #[test]
    fn migration_never_panics_on_arbitrary_schema_less_input(raw in arbitrary_payload(), ops in prop::collection::vec(op(), 0..5)) {
        let mut bytes = Vec::new();
        cache_format::rmpv::encode::write_value(&mut bytes, &raw).expect("encode");
        let reg = registry(&[ops], 1, 2);
        let _ = upgrade(&reg, FormatVersion::CURRENT, "app", 1, &bytes, &Limits::default());
    }
}

/// Schema-less values biased toward the payload's shape, so migrations get past the first
/// check and meet odd shapes deep inside (wrong types, missing fields, strange maps).
fn arbitrary_payload() -> impl Strategy<Value = Raw> {
    const WORDS: [&str; 16] = [
        "scopes",
        "scope",
        "namespaces",
        "key",
        "candidates",
        "algo",
        "params",
        "fp",
        "candidate_set",
        "recorded_at",
        "origin",
        "status",
        "median_ns",
        "n1",
        "p",
        "a",
    ];
    let leaf = prop_oneof![
        Just(Raw::Nil),
        any::<bool>().prop_map(Raw::from),
        any::<i64>().prop_map(Raw::from),
        any::<f64>().prop_map(Raw::from),
        prop::sample::select(&WORDS[..]).prop_map(Raw::from),
        prop::collection::vec(any::<u8>(), 0..20).prop_map(Raw::Binary),
    ];
    leaf.prop_recursive(6, 64, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Raw::Array),
            prop::collection::vec(
                (
                    prop_oneof![
                        prop::sample::select(&WORDS[..]).prop_map(Raw::from),
                        inner.clone()
                    ],
                    inner
                ),
                0..5
            )
            .prop_map(Raw::Map),
        ]
    })
}
