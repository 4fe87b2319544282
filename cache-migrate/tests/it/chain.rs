//! Chaining, gating and the report of coded steps.

use cache_format::rmpv::Value as Raw;
use cache_format::{FormatVersion, Limits, encode_payload};
use cache_migrate::{
    Change, Gate, MigrateError, Migrations, PayloadView, Step, field_mut, upgrade,
};

use crate::support::{data, entry};

/// A coded step that renames algorithm `from` to `to` in every candidate.
fn rename(v_from: u32, old: &'static str, new: &'static str) -> Step {
    Step::coded(
        v_from,
        v_from + 1,
        format!("rename {old}→{new}"),
        move |view: &mut PayloadView| {
            let mut n = 0;
            for (_, e) in view.entries_mut() {
                let mut touched = false;
                if let Some(Raw::Array(cands)) = field_mut(e, "candidates") {
                    for c in cands {
                        if let Some(algo) = field_mut(c, "algo")
                            && algo.as_str() == Some(old)
                        {
                            *algo = Raw::from(new);
                            touched = true;
                        }
                    }
                }
                n += u64::from(touched);
            }
            Ok(vec![Change::new("renamed", format!("{old}→{new}"), n)])
        },
    )
}

fn registry() -> Migrations {
    Migrations::new("app", 4)
        .with(rename(1, "a", "b"))
        .and_then(|m| m.with(rename(2, "b", "c")))
        .and_then(|m| m.with(rename(3, "c", "d")))
        .expect("valid registry")
}

#[test]
fn a_jump_over_several_versions_chains_every_step() {
    let old = data(&[("ns", entry(1, &["a", "x"])), ("ns", entry(2, &["x"]))]);
    let up = upgrade(
        &registry(),
        FormatVersion::CURRENT,
        "app",
        1,
        &encode_payload(&old),
        &Limits::default(),
    )
    .expect("migrates");
    let report = up.report.expect("a report");
    assert_eq!((report.from, report.to, report.steps.len()), (1, 4, 3));
    assert_eq!(report.steps[0].to_string(), "v1→v2 renamed 1 entries (a→b)");
    let names: Vec<_> = up
        .data
        .entries()
        .flat_map(|(_, _, e)| e.candidates().iter().map(|c| c.id.algorithm.clone()))
        .collect();
    assert!(
        names.contains(&"d".to_owned()) && !names.contains(&"a".to_owned()),
        "{names:?}"
    );
}

#[test]
fn current_data_is_decoded_without_a_report() {
    let d = data(&[("ns", entry(1, &["a"]))]);
    let up = upgrade(
        &registry(),
        FormatVersion::CURRENT,
        "app",
        4,
        &encode_payload(&d),
        &Limits::default(),
    )
    .expect("current");
    assert_eq!(up.report, None);
    assert_eq!(up.data, d);
}

#[test]
fn a_missing_step_is_an_error_value_naming_the_gap() {
    let reg = Migrations::new("app", 4)
        .with(rename(1, "a", "b"))
        .and_then(|m| m.with(rename(3, "c", "d")))
        .expect("valid");
    let err = upgrade(
        &reg,
        FormatVersion::CURRENT,
        "app",
        1,
        &encode_payload(&data(&[])),
        &Limits::default(),
    )
    .expect_err("no path");
    assert_eq!(
        err,
        MigrateError::NoPath {
            from: 1,
            to: 4,
            missing: 2
        }
    );
    assert!(err.to_string().contains("no step starts at schema 2"));
}

#[test]
fn newer_schemas_and_foreign_apps_are_refused() {
    let reg = registry();
    assert_eq!(reg.gate("app", 5), Gate::Newer(5));
    assert_eq!(reg.gate("other", 4), Gate::Foreign("other".into()));
    assert!(matches!(
        upgrade(
            &reg,
            FormatVersion::CURRENT,
            "app",
            9,
            &encode_payload(&data(&[])),
            &Limits::default()
        ),
        Err(MigrateError::NewerSchema {
            found: 9,
            current: 4
        })
    ));
    assert!(matches!(
        upgrade(
            &reg,
            FormatVersion::CURRENT,
            "other",
            4,
            &encode_payload(&data(&[])),
            &Limits::default()
        ),
        Err(MigrateError::Foreign { .. })
    ));
}

#[test]
fn bad_registrations_are_refused() {
    assert!(
        Migrations::new("app", 4).with(rename(4, "a", "b")).is_err(),
        "past current"
    );
    assert!(
        Migrations::new("app", 4)
            .with(Step::coded(2, 2, "x", |_| Ok(vec![])))
            .is_err(),
        "not forward"
    );
    assert!(
        registry().with(rename(1, "q", "r")).is_err(),
        "duplicate start"
    );
}

#[test]
fn a_failing_step_is_reported_with_its_versions() {
    let reg = Migrations::new("app", 2)
        .with(Step::coded(1, 2, "boom", |_| Err("bad data".into())))
        .expect("valid");
    let err = upgrade(
        &reg,
        FormatVersion::CURRENT,
        "app",
        1,
        &encode_payload(&data(&[])),
        &Limits::default(),
    )
    .expect_err("fails");
    assert_eq!(err.to_string(), "migration step 1→2 failed: bad data");
}

#[test]
fn a_step_that_changes_keys_refingerprints_and_reports_collisions() {
    // Drop the key field "m": keys {m:1} and {m:2} both become {} and collide.
    let reg = Migrations::new("app", 2)
        .with(Step::coded(1, 2, "drop m", |view: &mut PayloadView| {
            for (_, e) in view.entries_mut() {
                if let Some(k) = field_mut(e, "key") {
                    cache_migrate::remove_field(k, "m");
                }
            }
            Ok(vec![])
        }))
        .expect("valid");
    let old = data(&[("ns", entry(1, &["a"])), ("ns", entry(2, &["b"]))]);
    let up = upgrade(
        &reg,
        FormatVersion::CURRENT,
        "app",
        1,
        &encode_payload(&old),
        &Limits::default(),
    )
    .expect("migrates");
    let report = up.report.expect("report");
    assert_eq!(report.collisions.len(), 1);
    assert_eq!(report.collisions[0].merged, 2);
    assert_eq!(up.data.len(), 1, "merged into one entry");
    let (_, _, e) = up.data.entries().next().expect("one");
    assert_eq!(e.candidates().len(), 2, "both candidates kept by the merge");
}

/// A format 1 payload (what this build writes, less the policy a format 1 writer never wrote)
/// is lifted by the container step first, then the schema steps run; its results' policy is
/// unknown.
#[test]
fn a_format_1_file_is_lifted_to_the_current_format_with_its_policies_unknown() {
    let old = data(&[("ns", entry(1, &["a", "x"]))]);
    let up = upgrade(
        &registry(),
        FormatVersion::V1,
        "app",
        1,
        &encode_payload(&old),
        &Limits::default(),
    )
    .expect("migrates");
    let report = up.report.expect("a report");
    assert_eq!(
        report.steps.len(),
        5,
        "the container steps 1→2 and 2→3, then three schema steps"
    );
    for step in &report.steps[..2] {
        assert!(step.to_string().contains("container format"), "{step}");
    }
    assert!(
        up.data
            .entries()
            .flat_map(|(_, _, e)| e.candidates().iter())
            .all(|c| c.policy.is_none())
    );
}
