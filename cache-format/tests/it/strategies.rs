//! proptest strategies for the model.

use cache_format::{
    CacheData, Candidate, CandidateId, Entry, Fields, Fingerprint, Key, Origin, Outcome, Scope,
    Stats, Value,
};
use proptest::prelude::*;

pub(crate) fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::Int),
        (-300i64..300).prop_map(Value::Int),
        "[a-z0-9_]{0,40}".prop_map(Value::Str),
        ".{0,8}".prop_map(Value::Str),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::List),
            prop::collection::btree_map("[a-z]{1,6}", inner, 0..4)
                .prop_map(|m| Value::Map(m.into_iter().collect())),
        ]
    })
}

pub(crate) fn fields() -> impl Strategy<Value = Fields> {
    prop::collection::btree_map("[a-z_]{1,10}", value(), 0..6).prop_map(|m| m.into_iter().collect())
}

fn stats() -> impl Strategy<Value = Stats> {
    (0.0f64..1e9, 0.0f64..1e9, 0.0f64..1e6, 1u32..1000).prop_map(
        |(median, min, spread, samples)| Stats {
            median_ns: median,
            min_ns: min,
            spread_ns: spread,
            samples,
        },
    )
}

pub(crate) fn candidate() -> impl Strategy<Value = Candidate> {
    (
        prop::sample::select(vec!["naive", "tiled", "mask_gemm", "split_k"]),
        prop::collection::btree_map(
            prop::sample::select(vec!["tile", "block", "order"]),
            (0i64..4).prop_map(Value::Int),
            0..3,
        ),
        prop_oneof![
            stats().prop_map(Outcome::Measured),
            "[a-z ]{0,20}".prop_map(Outcome::Failed),
            "[a-z ]{0,20}".prop_map(Outcome::Chosen)
        ],
        0u64..5,
        prop::option::of(0u64..1_000_000),
        policy(),
    )
        .prop_map(
            |(algo, params, outcome, measured_at, tuning_ns, policy)| Candidate {
                id: CandidateId::with_params(
                    algo,
                    params.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
                ),
                outcome,
                measured_at,
                tuning_ns,
                policy,
            },
        )
}

/// A measurement policy: unknown, or a timer with a few precision and L2 settings (so merges
/// and rankings meet comparable and incomparable policies alike).
fn policy() -> impl Strategy<Value = Option<cache_format::Fields>> {
    prop::option::of(
        (
            prop::sample::select(vec!["wall", "cuda-events"]),
            1i64..3,
            prop::sample::select(vec![0i64, 50_000_000]),
        )
            .prop_map(|(timer, samples, l2)| {
                cache_format::Fields::from([
                    ("timer".to_owned(), Value::from(timer)),
                    ("samples".to_owned(), Value::Int(samples)),
                    ("l2_flush_bytes".to_owned(), Value::Int(l2)),
                ])
            }),
    )
}

pub(crate) fn origin() -> impl Strategy<Value = Origin> {
    prop_oneof![
        "[a-z]{0,8}".prop_map(Origin::Measured),
        "[a-z]{0,8}".prop_map(Origin::Imported),
        "[a-z]{0,8}".prop_map(Origin::Remote),
    ]
}

/// An entry for `key` with random candidates and header.
pub(crate) fn entry_for(key: Key) -> impl Strategy<Value = Entry> {
    (
        prop::collection::vec(candidate(), 0..5),
        any::<[u8; 16]>(),
        0u64..4,
        origin(),
    )
        .prop_map(move |(candidates, set, recorded_at, origin)| {
            Entry::new(
                key.clone(),
                Fingerprint(set),
                origin,
                recorded_at,
                candidates,
            )
        })
}

pub(crate) fn entry() -> impl Strategy<Value = Entry> {
    fields().prop_flat_map(|f| entry_for(Key::new(f)))
}

pub(crate) fn cache_data() -> impl Strategy<Value = CacheData> {
    prop::collection::vec(
        (
            prop::sample::select(vec![0usize, 1, 2]),
            prop::sample::select(vec!["matmul", "conv_fwd", "reduce"]),
            entry(),
        ),
        0..12,
    )
    .prop_map(|items| {
        let scopes = [
            Scope::default(),
            Scope::new(Fields::from([("device".to_owned(), Value::from("cpu"))])),
            Scope::new(Fields::from([
                ("device".to_owned(), Value::from("H100")),
                ("sm".to_owned(), Value::Int(132)),
            ])),
        ];
        let mut data = CacheData::new();
        for (scope, ns, entry) in items {
            data.insert(&scopes[scope], ns, entry);
        }
        data
    })
}

/// The first `n` cases of [`cache_data`], the same every run: for tests that count how often a
/// property is exercised.
pub(crate) fn sample_data(n: usize) -> impl Iterator<Item = CacheData> {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    (0..n).map(move |_| {
        cache_data()
            .new_tree(&mut runner)
            .expect("a case")
            .current()
    })
}
