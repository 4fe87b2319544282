//! `tunecache diff`: exact counts for seeded differences of every category, and `--fail-on`.

use std::path::Path;
use std::time::Duration;

use cache_core::cache_format::{
    Candidate, CandidateId, Entry, Fields, Fingerprint, Key, Origin, Outcome, Stats, Value,
};
use cache_core::cache_migrate::Migrations;
use cache_core::{Cache, Namespace, Store};

use crate::tunecache;

pub(crate) type Cands<'a> = &'a [(&'a str, Option<(f64, f64)>)];

pub(crate) fn entry(id: i64, set: u8, cands: Cands<'_>) -> Entry {
    let key = Key::new(Fields::from([("id".to_owned(), Value::Int(id))]));
    Entry::new(
        key,
        Fingerprint([set; 16]),
        Origin::Imported("seed".into()),
        1_000,
        cands.iter().map(|(name, t)| {
            let outcome = match t {
                Some((median_ns, spread_ns)) => Outcome::Measured(Stats {
                    median_ns: *median_ns,
                    min_ns: *median_ns,
                    spread_ns: *spread_ns,
                    samples: 5,
                }),
                None => Outcome::Failed("wrong result".into()),
            };
            let mut c = Candidate::new(CandidateId::new(*name, &[]), outcome);
            c.measured_at = 1_000;
            c
        }),
    )
}

pub(crate) fn write(path: &Path, entries: Vec<Entry>) {
    write_as(path, Migrations::new("difftest", 1), entries);
}

/// [`write`] for another application or schema.
pub(crate) fn write_as(path: &Path, registry: Migrations, entries: Vec<Entry>) {
    let cache = Cache::builder(registry)
        .file(path)
        .ignore_env()
        .refresh_interval(None)
        .flush_timeout(Duration::from_secs(30))
        .open();
    let ns = Namespace::new("mm").expect("name");
    for e in entries {
        cache.try_put(ns, e).expect("put");
    }
    cache.close().expect("saved");
}

const BASE: Cands<'static> = &[("x", Some((100.0, 5.0))), ("y", Some((200.0, 5.0)))];

fn seeded(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (a, b) = (dir.join("a.tcache"), dir.join("b.tcache"));
    write(
        &a,
        [1, 2, 4, 5, 6, 7, 8, 10]
            .into_iter()
            .map(|id| entry(id, 0, BASE))
            .collect(),
    );
    write(
        &b,
        vec![
            entry(1, 0, BASE),
            entry(3, 0, BASE),
            entry(9, 0, BASE),
            entry(
                4,
                0,
                &[("x", Some((104.0, 5.0))), ("y", Some((101.0, 5.0)))],
            ),
            entry(5, 0, &[("x", Some((100.0, 5.0))), ("y", Some((50.0, 5.0)))]),
            entry(
                6,
                0,
                &[("x", Some((150.0, 5.0))), ("y", Some((200.0, 5.0)))],
            ),
            entry(
                10,
                0,
                &[("x", Some((400.0, 5.0))), ("y", Some((300.0, 5.0)))],
            ),
            entry(7, 1, BASE),
            entry(8, 0, &[("x", None), ("y", Some((200.0, 5.0)))]),
        ],
    );
    (a, b)
}

fn run(a: &Path, b: &Path, extra: &[&str]) -> std::process::Output {
    let (a, b) = (a.to_str().expect("utf-8"), b.to_str().expect("utf-8"));
    let mut args = vec!["--json", "diff", a, b];
    args.extend_from_slice(extra);
    // --cache-file is not used by diff; any path will do.
    tunecache(Path::new(a), &args)
}

#[test]
fn every_seeded_difference_is_counted_exactly() {
    let dir = tempfile::tempdir().expect("dir");
    let (a, b) = seeded(dir.path());
    let o = run(&a, &b, &[]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let counts = &r["counts"];
    for (category, n) in [
        ("same", 1),
        ("only-in-a", 1),
        ("only-in-b", 2),
        ("winner-changed-within-noise", 1),
        ("winner-changed", 1),
        ("regression", 2),
        ("candidates-changed", 1),
        ("failure-changed", 1),
    ] {
        assert_eq!(counts[category], n, "{category}: {r:#}");
    }
    assert_eq!(r["changes"].as_array().map(Vec::len), Some(9), "{r:#}");
    // Winners' times over the 7 keys both have measured winners for:
    // 1, 1, 1.01, 0.5, 1.5, 3, 1 (k7 keeps x at 100), k8 moves to y: 2.
    let want = [1.0f64, 1.01, 0.5, 1.5, 3.0, 1.0, 2.0]
        .iter()
        .map(|r| r.ln())
        .sum::<f64>()
        / 7.0;
    let got = r["geomean_ratio"].as_f64().expect("a ratio");
    assert!((got - want.exp()).abs() < 1e-9, "{got} vs {}", want.exp());
}

#[test]
fn fail_on_exits_3_exactly_when_the_category_was_found() {
    let dir = tempfile::tempdir().expect("dir");
    let (a, b) = seeded(dir.path());
    let o = run(&a, &b, &["--fail-on", "regression"]);
    assert_eq!(
        o.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(r["failed_on"], serde_json::json!(["regression"]));
    let same = run(
        &a,
        &a,
        &["--fail-on", "regression", "--fail-on", "only-in-b"],
    );
    assert_eq!(same.status.code(), Some(0));
    let r: serde_json::Value = serde_json::from_slice(&same.stdout).expect("JSON");
    assert_eq!(r["counts"]["same"], 8, "{r:#}");
    let bad = run(&a, &b, &["--fail-on", "sometimes"]);
    assert_eq!(
        bad.status.code(),
        Some(2),
        "a wrong category is a usage error"
    );
}

/// Issue 24, case 19: caches of two applications (or schemas) are not compared key by key:
/// their fingerprints may coincide and their candidates mean other things.
#[test]
fn caches_of_another_application_or_schema_are_refused() {
    let dir = tempfile::tempdir().expect("dir");
    let same: Cands<'static> = &[("x", Some((100.0, 5.0)))];
    let slower: Cands<'static> = &[("x", Some((900.0, 5.0)))];
    let a = dir.path().join("a.tcache");
    write(&a, vec![entry(1, 0, same)]);
    for (name, registry) in [
        ("other-app.tcache", Migrations::new("unrelated", 1)),
        ("other-schema.tcache", Migrations::new("difftest", 2)),
    ] {
        let b = dir.path().join(name);
        write_as(&b, registry, vec![entry(1, 0, slower)]);
        let o = run(&a, &b, &["--fail-on", "regression"]);
        assert_eq!(
            o.status.code(),
            Some(1),
            "{name}: {}",
            String::from_utf8_lossy(&o.stdout)
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("one application and schema"), "{name}: {err}");
    }
}
