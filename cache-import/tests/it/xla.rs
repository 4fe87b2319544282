//! XLA autotune results (text format).

use cache_core::cache_format::{Outcome, Value};
use cache_import::Format;

use crate::support::{fixture, read};

#[test]
fn xlas_own_dump_becomes_a_measured_triton_entry_per_fusion() {
    let (data, summary) = read(Format::Xla, &fixture("real/xla")).expect("imports");
    assert_eq!((summary.files, summary.entries), (1, 1));
    let (scope, ns, entry) = data.entries().next().expect("one");
    assert_eq!(ns, "xla/results");
    assert_eq!(
        scope.fields().get("xla.autotune_version"),
        Some(&Value::Int(3))
    );
    assert!(matches!(scope.fields().get("device"), Some(Value::Str(d)) if d.starts_with("sm_8.0")));
    assert!(
        matches!(entry.key().fields().get("hlo"), Some(Value::Str(h)) if h.contains("ROOT tmp_6"))
    );
    let best = entry.best().expect("winner");
    assert_eq!(best.id.algorithm, "triton");
    assert_eq!(best.id.params.get("block_k"), Some(&Value::Int(32)));
    assert_eq!(best.id.params.get("enable_tma"), Some(&Value::Bool(false)));
    assert!(
        matches!(best.id.params.get("cluster_dims"), Some(Value::Map(m)) if m.get("z") == Some(&Value::Int(1)))
    );
    assert_eq!(best.stats().map(|s| s.median_ns), Some(31744.0));
}

#[test]
fn older_dots_and_convs_and_failures_map_too() {
    let (data, _) = read(Format::Xla, &fixture("hand/xla")).expect("imports");
    let mut seen: Vec<(String, String)> = data
        .entries()
        .map(|(_, ns, e)| (ns.to_owned(), format!("{:?}", e.candidates()[0].outcome)))
        .collect();
    seen.sort();
    assert_eq!(seen[0].0, "xla/convs");
    assert!(
        seen[0].1.contains("DISQUALIFIED out of scratch"),
        "{seen:?}"
    );
    assert_eq!(seen[1].0, "xla/dots");
    let dot = data
        .entries()
        .find(|(_, ns, _)| *ns == "xla/dots")
        .map(|(_, _, e)| e.clone())
        .expect("dot");
    assert!(
        matches!(dot.best().map(|c| &c.outcome), Some(Outcome::Measured(s)) if s.median_ns == 2500.0)
    );
}

#[test]
fn binary_and_damaged_results_are_refused_with_file_and_line() {
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(dir.path().join("results.pb"), b"\x08\x03").expect("write");
    let err = read(Format::Xla, dir.path()).expect_err("binary");
    assert!(
        err.to_string().contains("results.pb") && err.to_string().contains(".textproto"),
        "{err}"
    );
    let good = std::fs::read_to_string(fixture("hand/xla/autotune_results.txt")).expect("read");
    for (bad, line, what) in [
        (
            good.replacen(
                "    gemm { algorithm: 13 }\n",
                "    gemm { algorithm: 13 \n",
                1,
            ),
            21,
            "not closed",
        ),
        (
            good.replacen("  hlo: \"(f32", "  hl0: \"(f32", 1),
            13,
            "no hlo",
        ),
        (good.replacen("version: 2\n", "", 1), 1, "no version"),
    ] {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(dir.path().join("r.textproto"), bad).expect("write");
        let err = read(Format::Xla, dir.path()).expect_err("refused");
        assert!(
            err.to_string().contains("r.textproto") && err.to_string().contains(what),
            "{err}"
        );
        assert_eq!(err.line, Some(line), "{err}");
    }
}

/// Hardening IV ("seen once"): a file saying `version: 99` was read as version 3. A version
/// whose layout is not known is refused, naming the file and the version.
#[test]
fn an_unknown_version_is_refused() {
    let text =
        std::fs::read_to_string(fixture("real/xla/test_autotune_cache.textproto")).expect("read");
    let dir = tempfile::tempdir().expect("tmp");
    let bad = dir.path().join("r.textproto");
    let replaced = text.replacen("version: 3", "version: 99", 1);
    assert_ne!(replaced, text, "the fixture says version 3");
    std::fs::write(&bad, replaced).expect("write");
    let err = read(Format::Xla, dir.path()).expect_err("refused");
    assert!(
        err.to_string().contains("r.textproto") && err.to_string().contains("version 99"),
        "{err}"
    );
}
