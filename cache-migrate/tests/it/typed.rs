//! The typed path of `upgrade` (declarative steps on the decoded model) against the general
//! one (the schema-less view): where the typed path answers, it answers the same.

use cache_format::{
    CacheData, Fields, Fingerprint, FormatVersion, Key, Limits, Origin, Value, encode_payload,
};
use cache_migrate::testing::{upgrade_typed, upgrade_view};
use cache_migrate::{Migrations, Op, Step, upgrade, upgrade_snapshot, upgrade_streamed};
use proptest::prelude::*;

use crate::properties::{data, op, registry};
use crate::support;

fn both(
    reg: &Migrations,
    payload: &[u8],
) -> (
    Option<cache_migrate::Upgraded>,
    Result<cache_migrate::Upgraded, cache_migrate::MigrateError>,
) {
    let limits = Limits::default();
    (
        upgrade_typed(reg, 1, payload, &limits),
        upgrade_view(reg, FormatVersion::CURRENT, 1, payload, &limits),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn where_the_typed_path_answers_it_equals_the_view(input in data(), steps in prop::collection::vec(prop::collection::vec(op(), 0..5), 1..4)) {
        let last = steps.len() as u32 + 1;
        let reg = registry(&steps, 1, last);
        let payload = encode_payload(&input);
        let (typed, view) = both(&reg, &payload);
        if let Some(typed) = typed {
            let view = view.expect("the view succeeds where the typed path does");
            prop_assert_eq!(&typed.data, &view.data);
            prop_assert_eq!(&typed.report, &view.report);
            // And upgrade itself gives that answer.
            let up = upgrade(&reg, FormatVersion::CURRENT, "app", 1, &payload, &Limits::default()).expect("upgrades");
            prop_assert_eq!(&up, &typed);
            // And so does a snapshot read whole, which is not scanned a second time.
            let file = cache_format::encode_snapshot("app", 1, &input);
            let snap = cache_format::read_snapshot(&file, &Limits::default()).expect("reads");
            let from_snapshot = upgrade_snapshot(&reg, &snap, &Limits::default()).expect("upgrades");
            prop_assert_eq!(from_snapshot, typed);
        }
    }

    #[test]
    fn the_streamed_path_answers_where_the_typed_one_does_with_its_bytes(input in data(), steps in prop::collection::vec(prop::collection::vec(op(), 0..5), 1..4)) {
        let last = steps.len() as u32 + 1;
        let reg = registry(&steps, 1, last);
        let payload = encode_payload(&input);
        let limits = Limits::default();
        let typed = upgrade_typed(&reg, 1, &payload, &limits);
        let streamed = upgrade_streamed(&reg, 1, &payload, &limits).and_then(|s| {
            let bytes = s.snapshot.finish("app", last);
            // Where a default added fields, the writer checks the bounds (the typed path
            // checks them itself).
            let snap = cache_format::read_snapshot(&bytes, &limits).ok()?;
            (!s.grew || cache_format::check_payload(snap.payload_bytes(), &limits).is_ok())
                .then_some((bytes, s.report))
        });
        prop_assert_eq!(typed.is_some(), streamed.is_some());
        if let (Some(typed), Some((bytes, report))) = (typed, streamed) {
            prop_assert_eq!(bytes, cache_format::encode_snapshot("app", last, &typed.data));
            prop_assert_eq!(Some(report), typed.report);
        }
    }
}

#[test]
fn the_streamed_path_declines_a_payload_out_of_the_written_order() {
    let reg = production_renamed();
    let limits = Limits::default();
    let payload = encode_payload(&sample());
    assert!(upgrade_streamed(&reg, 1, &payload, &limits).is_some());
    // The two entries of n1 swapped: the same entries, not in fingerprint order.
    let mut entries = Vec::new();
    cache_format::raw::walk_payload(&payload, &limits, |_, ns, bytes| {
        entries.push((ns.to_owned(), bytes.to_vec()));
        std::ops::ControlFlow::Continue(())
    })
    .expect("walks");
    let (a, b) = (entries[0].1.clone(), entries[1].1.clone());
    assert_eq!(entries[0].0, entries[1].0);
    let at = payload
        .windows(a.len())
        .position(|w| w == a.as_slice())
        .expect("found");
    let mut swapped = payload.clone();
    swapped[at..at + b.len()].copy_from_slice(&b);
    swapped[at + b.len()..at + b.len() + a.len()].copy_from_slice(&a);
    assert!(upgrade_streamed(&reg, 1, &swapped, &limits).is_none());
    // The typed path takes it (it holds the model, so it sees every key), with the same data.
    let typed = upgrade_typed(&reg, 1, &swapped, &limits).expect("answers");
    assert_eq!(Some(typed), upgrade_typed(&reg, 1, &payload, &limits));
}

/// Schema 1 → 2: algorithm `production` renamed `mask_gemm`.
fn production_renamed() -> Migrations {
    Migrations::new("app", 2)
        .with(Step::declarative(
            1,
            2,
            "renamed",
            vec![Op::RenameAlgorithm {
                from: "production".into(),
                to: "mask_gemm".into(),
                namespace: None,
            }],
        ))
        .expect("valid")
}

fn sample() -> CacheData {
    support::data(&[
        ("n1", support::entry(1, &["production", "naive"])),
        ("n1", support::entry(2, &["production"])),
        ("n2", support::entry(3, &["naive"])),
    ])
}

#[test]
fn a_declarative_rename_takes_the_typed_path_and_reports_like_the_view() {
    let reg = production_renamed();
    let payload = encode_payload(&sample());
    let (typed, view) = both(&reg, &payload);
    let typed = typed.expect("declarative steps on clean data take the typed path");
    let view = view.expect("migrates");
    assert_eq!(typed, view);
    let report = typed.report.expect("a report");
    assert_eq!(report.entries, 3);
    assert_eq!(report.steps[0].changes[0].entries, 2);
}

#[test]
fn the_typed_path_declines_where_the_answers_could_differ() {
    let payload = encode_payload(&sample());
    // A coded step.
    let coded = Migrations::new("app", 2)
        .with(Step::coded(1, 2, "coded", |_view| Ok(Vec::new())))
        .expect("valid");
    assert!(upgrade_typed(&coded, 1, &payload, &Limits::default()).is_none());
    // Keys that collide after the step: the view reports the collision.
    let collide = Migrations::new("app", 2)
        .with(Step::declarative(
            1,
            2,
            "dropped m",
            vec![Op::DropKeyField {
                name: "m".into(),
                namespace: None,
            }],
        ))
        .expect("valid");
    let (typed, view) = both(&collide, &payload);
    assert!(typed.is_none());
    assert!(
        !view
            .expect("migrates")
            .report
            .expect("report")
            .collisions
            .is_empty()
    );
    // A rename onto a param that is there: the view fails the step.
    let mut data = CacheData::new();
    let mut params = Fields::new();
    params.insert("p", Value::Int(1));
    params.insert("q", Value::Int(2));
    data.insert(
        &Default::default(),
        "n1",
        cache_format::Entry::new(
            Key::new(Fields::new()),
            Fingerprint::default(),
            Origin::Measured("t".into()),
            1,
            [cache_format::Candidate::measured(
                "a",
                params,
                cache_format::Stats {
                    median_ns: 1.0,
                    min_ns: 1.0,
                    spread_ns: 0.0,
                    samples: 1,
                },
            )],
        ),
    );
    let conflict = Migrations::new("app", 2)
        .with(Step::declarative(
            1,
            2,
            "p to q",
            vec![Op::RenameParam {
                from: "p".into(),
                to: "q".into(),
                algorithm: None,
                namespace: None,
            }],
        ))
        .expect("valid");
    let (typed, view) = both(&conflict, &encode_payload(&data));
    assert!(typed.is_none());
    assert!(view.is_err());
}

/// The comparison above means something only if the typed path answers often: count it.
#[test]
fn the_typed_path_answers_most_random_migrations() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    let mut runner = TestRunner::deterministic();
    let strategy = (
        data(),
        prop::collection::vec(prop::collection::vec(op(), 0..5), 1..4),
    );
    let (mut answered, cases) = (0, 300);
    for _ in 0..cases {
        let (input, steps) = strategy.new_tree(&mut runner).expect("a case").current();
        let reg = registry(&steps, 1, steps.len() as u32 + 1);
        if upgrade_typed(&reg, 1, &encode_payload(&input), &Limits::default()).is_some() {
            answered += 1;
        }
    }
    eprintln!("typed path answered {answered} of {cases} random migrations");
    assert!(answered * 2 > cases, "only {answered} of {cases}");
}
