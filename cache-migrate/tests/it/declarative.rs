//! Each declarative operation, the migration file, and the report lines.

use cache_format::{
    Candidate, Entry, Fields, Fingerprint, FormatVersion, Key, Limits, Origin, Scope, Stats, Value,
    encode_payload,
};
use cache_migrate::{MigrateError, Migrations, Op, Step, upgrade};

use crate::support::data;

fn cand(algo: &str, params: &[(&str, i64)]) -> Candidate {
    let params: Fields = params
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Value::Int(*v)))
        .collect();
    let mut c = Candidate::measured(
        algo,
        params,
        Stats {
            median_ns: 10.0,
            min_ns: 9.0,
            spread_ns: 1.0,
            samples: 3,
        },
    );
    c.measured_at = 5;
    c
}

fn entry(key: &[(&str, i64)], cands: Vec<Candidate>) -> Entry {
    let key: Fields = key
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Value::Int(*v)))
        .collect();
    Entry::new(
        Key::new(key),
        Fingerprint::default(),
        Origin::Measured("t".into()),
        5,
        cands,
    )
}

fn run(
    ops: Vec<Op>,
    input: &cache_format::CacheData,
) -> Result<cache_migrate::Upgraded, MigrateError> {
    let reg = Migrations::new("app", 2)
        .with(Step::declarative(1, 2, "test", ops))
        .expect("registry");
    upgrade(
        &reg,
        FormatVersion::CURRENT,
        "app",
        1,
        &encode_payload(input),
        &Limits::default(),
    )
}

fn algos(d: &cache_format::CacheData, ns: &str) -> Vec<String> {
    d.entries()
        .filter(|(_, n, _)| *n == ns)
        .flat_map(|(_, _, e)| e.candidates().iter().map(|c| c.id.algorithm.clone()))
        .collect()
}

#[test]
fn the_seed_rename_reports_like_warpconvnet() {
    let input = data(&[
        (
            "AB_gather_scatter",
            entry(
                &[("ci", 64)],
                vec![
                    cand("production", &[("tile_id", 41)]),
                    cand("explicit_gemm", &[]),
                ],
            ),
        ),
        (
            "AB_gather_scatter",
            entry(&[("ci", 128)], vec![cand("production_fwd_as_dgrad", &[])]),
        ),
        (
            "ABt_gather_scatter",
            entry(&[("ci", 64)], vec![cand("production", &[])]),
        ),
    ]);
    let up = run(
        vec![
            Op::RenameAlgorithm {
                from: "production".into(),
                to: "mask_gemm".into(),
                namespace: None,
            },
            Op::RenameAlgorithm {
                from: "production_fwd_as_dgrad".into(),
                to: "mask_gemm_fwd_as_dgrad".into(),
                namespace: None,
            },
        ],
        &input,
    )
    .expect("migrates");
    let report = up.report.expect("report");
    assert_eq!(
        report.steps[0].lines(),
        [
            "v1→v2 renamed 2 entries (production→mask_gemm)",
            "v1→v2 renamed 1 entries (production_fwd_as_dgrad→mask_gemm_fwd_as_dgrad)"
        ]
    );
    let mut names = algos(&up.data, "AB_gather_scatter");
    names.sort();
    assert_eq!(
        names,
        ["explicit_gemm", "mask_gemm", "mask_gemm_fwd_as_dgrad"]
    );
}

#[test]
fn a_rename_can_be_limited_to_one_namespace() {
    let input = data(&[
        ("a", entry(&[("m", 1)], vec![cand("x", &[])])),
        ("b", entry(&[("m", 1)], vec![cand("x", &[])])),
    ]);
    let up = run(
        vec![Op::RenameAlgorithm {
            from: "x".into(),
            to: "y".into(),
            namespace: Some("a".into()),
        }],
        &input,
    )
    .expect("ok");
    assert_eq!(algos(&up.data, "a"), ["y"]);
    assert_eq!(algos(&up.data, "b"), ["x"]);
}

#[test]
fn params_are_renamed_dropped_and_defaulted() {
    let input = data(&[(
        "ns",
        entry(
            &[("m", 1)],
            vec![
                cand("tiled", &[("tile", 32), ("debug", 1)]),
                cand("naive", &[]),
            ],
        ),
    )]);
    let up = run(
        vec![
            Op::RenameParam {
                from: "tile".into(),
                to: "tile_id".into(),
                algorithm: None,
                namespace: None,
            },
            Op::DropParam {
                name: "debug".into(),
                algorithm: None,
                namespace: None,
            },
            Op::SetParamDefault {
                name: "split_k".into(),
                value: Value::Int(1),
                algorithm: Some("tiled".into()),
                namespace: None,
            },
        ],
        &input,
    )
    .expect("ok");
    let (_, _, e) = up.data.entries().next().expect("entry");
    let tiled = e
        .candidates()
        .iter()
        .find(|c| c.id.algorithm == "tiled")
        .expect("tiled");
    assert_eq!(tiled.id.params.get("tile_id"), Some(&Value::Int(32)));
    assert_eq!(tiled.id.params.get("split_k"), Some(&Value::Int(1)));
    assert!(!tiled.id.params.contains_key("tile") && !tiled.id.params.contains_key("debug"));
    let naive = e
        .candidates()
        .iter()
        .find(|c| c.id.algorithm == "naive")
        .expect("naive");
    assert!(
        naive.id.params.is_empty(),
        "the default was limited to tiled"
    );
}

#[test]
fn renaming_a_param_onto_an_existing_one_fails_the_step() {
    let input = data(&[(
        "ns",
        entry(&[("m", 1)], vec![cand("t", &[("a", 1), ("b", 2)])]),
    )]);
    let err = run(
        vec![Op::RenameParam {
            from: "a".into(),
            to: "b".into(),
            algorithm: None,
            namespace: None,
        }],
        &input,
    )
    .expect_err("clash");
    assert!(err.to_string().contains("\"b\" is already there"), "{err}");
}

#[test]
fn namespaces_are_renamed_merged_and_dropped() {
    let input = data(&[
        ("old", entry(&[("m", 1)], vec![cand("x", &[])])),
        ("new", entry(&[("m", 2)], vec![cand("y", &[])])),
        ("new", entry(&[("m", 1)], vec![cand("z", &[])])),
        ("scratch", entry(&[("m", 3)], vec![cand("w", &[])])),
    ]);
    let up = run(
        vec![
            Op::RenameNamespace {
                from: "old".into(),
                to: "new".into(),
            },
            Op::DropNamespace {
                name: "scratch".into(),
            },
        ],
        &input,
    )
    .expect("ok");
    let report = up.report.expect("report");
    assert_eq!(
        report.steps[0].lines()[1],
        "v1→v2 dropped 1 entries (namespace scratch)"
    );
    assert_eq!(up.data.len(), 2, "m=1 from both namespaces met and merged");
    assert_eq!(
        report.collisions.len(),
        1,
        "the meeting is reported: {report}"
    );
    let mut names = algos(&up.data, "new");
    names.sort();
    assert_eq!(names, ["x", "y", "z"]);
}

#[test]
fn key_fields_change_fingerprints_which_are_recomputed() {
    let input = data(&[("ns", entry(&[("c_in", 64)], vec![cand("x", &[])]))]);
    let up = run(
        vec![
            Op::RenameKeyField {
                from: "c_in".into(),
                to: "ci".into(),
                namespace: None,
            },
            Op::SetKeyFieldDefault {
                name: "groups".into(),
                value: Value::Int(1),
                namespace: None,
            },
        ],
        &input,
    )
    .expect("ok");
    let want = Key::new(Fields::from([
        ("ci".to_owned(), Value::Int(64)),
        ("groups".to_owned(), Value::Int(1)),
    ]));
    assert!(
        up.data
            .get(&Scope::default(), "ns", &want.fingerprint())
            .is_some(),
        "found under the new key's fingerprint"
    );
}

#[test]
fn a_migration_file_round_trips_and_refuses_unknown_fields() {
    let text = r#"{"app": "wcn", "current": 9, "steps": [
        {"from": 8, "to": 9, "description": "production kernels became mask_gemm",
         "ops": [{"op": "rename_algorithm", "from": "production", "to": "mask_gemm"},
                 {"op": "set_param_default", "name": "split_k", "value": 1, "algorithm": "mask_gemm"}]}]}"#;
    let reg = Migrations::from_json(text).expect("valid file");
    assert_eq!((reg.app(), reg.current()), ("wcn", 9));
    let printed = reg.steps().next().expect("a step").to_string();
    assert_eq!(
        printed,
        "v8→v9: production kernels became mask_gemm\n  {\"op\":\"rename_algorithm\",\"from\":\"production\",\"to\":\"mask_gemm\"}\n  {\"op\":\"set_param_default\",\"name\":\"split_k\",\"value\":1,\"algorithm\":\"mask_gemm\"}"
    );
    let back = serde_json::to_string(&reg.to_file().expect("declarative")).expect("json");
    assert_eq!(
        Migrations::from_json(&back).expect("again").to_file(),
        reg.to_file()
    );

    for bad in [
        r#"{"app": "x", "current": 2, "steps": [], "extra": 1}"#,
        r#"{"app": "x", "current": 2, "steps": [{"from": 1, "to": 2, "ops": [{"op": "explode"}]}]}"#,
        r#"{"app": "x", "current": 2, "steps": [{"from": 1, "to": 2, "ops": [{"op": "set_param_default", "name": "a", "value": 0.5}]}]}"#,
        r#"{"app": "x", "current": 2, "steps": [{"from": 2, "to": 3, "ops": []}]}"#,
    ] {
        let err = Migrations::from_json(bad).expect_err(bad);
        assert!(matches!(err, MigrateError::Registry(_)), "{err}");
    }
}

/// Issue 8, case 1: a default nested deeper than readers accept is refused when the step is
/// registered (from code or from a file), naming the step and the field, instead of producing
/// a migrated file that no reader can open.
#[test]
fn a_default_too_deep_to_read_back_is_refused_at_registration() {
    let limits = Limits::default();
    let nested = |depth: u32| {
        let mut v = Value::Int(0);
        for _ in 0..depth {
            v = Value::List(vec![v]);
        }
        v
    };
    let param = |depth| Op::SetParamDefault {
        name: "p".into(),
        value: nested(depth),
        algorithm: None,
        namespace: None,
    };
    let key = |depth| Op::SetKeyFieldDefault {
        name: "k".into(),
        value: nested(depth),
        namespace: None,
    };
    let register = |op| Migrations::new("app", 2).with(Step::declarative(1, 2, "d", vec![op]));
    assert!(register(param(limits.max_param_depth())).is_ok());
    assert!(register(key(limits.max_key_field_depth())).is_ok());
    for (op, field) in [
        (param(limits.max_param_depth() + 1), "param \"p\""),
        (key(limits.max_key_field_depth() + 1), "key field \"k\""),
    ] {
        let err = register(op).expect_err(field).to_string();
        assert!(err.contains("1→2") && err.contains(field), "{err}");
    }
    let deep = "[".repeat(30) + &"]".repeat(30);
    let file = format!(
        r#"{{"app": "x", "current": 2, "steps": [{{"from": 1, "to": 2, "ops": [{{"op": "set_key_field_default", "name": "k", "value": {deep}}}]}}]}}"#
    );
    let err = Migrations::from_json(&file).expect_err("too deep");
    assert!(matches!(err, MigrateError::Registry(_)), "{err}");
}

#[test]
fn a_coded_step_may_create_a_second_namespace_of_one_name_and_it_is_merged() {
    let input = data(&[
        ("a", entry(&[("m", 1)], vec![cand("x", &[])])),
        ("b", entry(&[("m", 2)], vec![cand("y", &[])])),
    ]);
    let reg = Migrations::new("app", 2)
        .with(Step::coded(1, 2, "rename b to a by hand", |view| {
            for scope in &mut view.scopes {
                for ns in &mut scope.namespaces {
                    if ns.name == "b" {
                        ns.name = "a".into();
                    }
                }
            }
            Ok(vec![])
        }))
        .expect("registry");
    let up = upgrade(
        &reg,
        FormatVersion::CURRENT,
        "app",
        1,
        &encode_payload(&input),
        &Limits::default(),
    )
    .expect("ok");
    assert_eq!(
        algos(&up.data, "a").len(),
        2,
        "no entry lost to a duplicate map key"
    );
}
