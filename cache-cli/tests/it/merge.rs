//! `tunecache merge`: the same bytes whatever the order or grouping of the inputs, an exact
//! conflict report, filters, and a refusal to overwrite.

use std::path::{Path, PathBuf};

use crate::diff::{Cands, entry, write};
use crate::tunecache;

const X_WINS: Cands<'static> = &[("x", Some((100.0, 5.0))), ("y", Some((200.0, 5.0)))];
const Y_WINS: Cands<'static> = &[("x", Some((300.0, 5.0))), ("y", Some((150.0, 5.0)))];
const Z_WINS: Cands<'static> = &[("z", Some((50.0, 1.0)))];

fn merge(out: &Path, inputs: &[&Path], extra: &[&str]) -> serde_json::Value {
    let mut args: Vec<String> = vec!["--json".into(), "merge".into(), "-o".into()];
    args.push(out.display().to_string());
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    args.extend(inputs.iter().map(|p| p.display().to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = tunecache(out, &args);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("JSON")
}

fn seeded(dir: &Path) -> [PathBuf; 3] {
    let [a, b, c] = ["a", "b", "c"].map(|n| dir.join(format!("{n}.tcache")));
    write(&a, (1..=5).map(|id| entry(id, 0, X_WINS)).collect());
    write(
        &b,
        vec![
            entry(3, 0, Y_WINS),
            entry(4, 0, Y_WINS),
            entry(
                5,
                0,
                &[("x", Some((110.0, 5.0))), ("y", Some((210.0, 5.0)))],
            ),
            entry(6, 0, X_WINS),
            entry(7, 1, X_WINS),
            entry(8, 0, Y_WINS),
        ],
    );
    write(
        &c,
        vec![
            entry(1, 0, Z_WINS),
            entry(8, 0, Y_WINS),
            entry(9, 0, X_WINS),
        ],
    );
    [a, b, c]
}

#[test]
fn the_merge_does_not_depend_on_order_or_grouping_and_reports_conflicts_exactly() {
    let dir = tempfile::tempdir().expect("dir");
    let [a, b, c] = seeded(dir.path());
    let o = |name: &str| dir.path().join(format!("{name}.tcache"));
    let abc = merge(&o("abc"), &[&a, &b, &c], &[]);
    assert_eq!(abc["entries"], 9, "{abc:#}");
    // Keys 3 and 4 (A: x, B: y) and 1 (A: x, C: z); key 5 keeps x, key 8 keeps y.
    let conflicts = abc["conflicts"].as_array().expect("list");
    assert_eq!(conflicts.len(), 3, "{abc:#}");
    let ratios: Vec<f64> = conflicts
        .iter()
        .map(|c| c["ratio"].as_f64().expect("f"))
        .collect();
    assert!(ratios.contains(&2.0) && ratios.contains(&1.5), "{ratios:?}");
    merge(&o("cba"), &[&c, &b, &a], &[]);
    merge(&o("bac"), &[&b, &a, &c], &[]);
    merge(&o("ab"), &[&a, &b], &[]);
    merge(&o("ab_c"), &[&o("ab"), &c], &[]);
    merge(&o("bc"), &[&b, &c], &[]);
    merge(&o("a_bc"), &[&a, &o("bc")], &[]);
    let bytes = |name: &str| std::fs::read(o(name)).expect("written");
    for other in ["cba", "bac", "ab_c", "a_bc"] {
        assert!(bytes("abc") == bytes(other), "{other} differs from abc");
    }
}

#[test]
fn filters_apply_before_the_join_and_an_existing_output_is_refused() {
    let dir = tempfile::tempdir().expect("dir");
    let [a, b, c] = seeded(dir.path());
    let out = dir.path().join("none.tcache");
    let r = merge(&out, &[&a, &b, &c], &["-n", "other"]);
    assert_eq!(r["entries"], 0, "{r:#}");
    let out = dir.path().join("old.tcache");
    let r = merge(&out, &[&a, &b], &["--max-age", "1"]);
    assert_eq!(r["entries"], 0, "recorded in 1970: {r:#}");
    let out = dir.path().join("samples.tcache");
    let r = merge(&out, &[&a, &c], &["--min-samples", "6"]);
    assert_eq!(r["entries"], 0, "every measurement had 5 samples: {r:#}");
    // The output exists: refused, untouched.
    let before = std::fs::read(&a).expect("a");
    let o = tunecache(
        &a,
        &[
            "merge",
            "-o",
            a.to_str().expect("utf-8"),
            b.to_str().expect("utf-8"),
        ],
    );
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(std::fs::read(&a).expect("a"), before);
    let o = tunecache(
        &out,
        &[
            "merge",
            "-o",
            out.to_str().expect("utf-8"),
            a.to_str().expect("utf-8"),
        ],
    );
    assert_eq!(o.status.code(), Some(1), "an existing output");
    assert!(String::from_utf8_lossy(&o.stderr).contains("already there"));
}

/// Inputs that together hold more candidates for one key than one entry keeps: the merge keeps
/// 65,536 and says how many it dropped (it once dropped them without a word).
#[test]
fn a_merge_past_the_candidate_bound_says_what_it_dropped() {
    use cache_core::cache_format::{
        Candidate, CandidateId, Entry, Fields, Fingerprint, Key, Origin, Outcome, Stats, Value,
    };
    let dir = tempfile::tempdir().expect("dir");
    let wide = |first: i64| {
        let key = Key::new(Fields::from([("id".to_owned(), Value::Int(1))]));
        let candidates = (first..first + 40_000).map(|i| {
            let stats = Stats {
                median_ns: 100.0 + i as f64,
                min_ns: 100.0,
                spread_ns: 1.0,
                samples: 5,
            };
            let mut c =
                Candidate::new(CandidateId::new("c", &[("i", i)]), Outcome::Measured(stats));
            c.measured_at = 1_000 + i as u64;
            c
        });
        Entry::new(
            key,
            Fingerprint([0; 16]),
            Origin::Imported("seed".into()),
            1_000,
            candidates,
        )
    };
    let (a, b) = (dir.path().join("a.tcache"), dir.path().join("b.tcache"));
    write(&a, vec![wide(0)]);
    write(&b, vec![wide(40_000)]);
    let report = merge(&dir.path().join("ab.tcache"), &[&a, &b], &[]);
    let bounded = report["bounded"].as_array().expect("list");
    assert_eq!(bounded.len(), 1, "{report:#}");
    assert_eq!(bounded[0]["dropped"], 80_000 - 65_536, "{report:#}");
}
