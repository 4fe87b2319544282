//! Triton cache directories: the Triton adapter's entries, from Triton's own files.

use cache_core::cache_format::{Fields, Fingerprint, Outcome, Value};
use cache_import::{Format, ImportOptions};

use crate::support::{fixture, read, read_with};

#[test]
fn tritons_own_files_become_the_adapters_entries() {
    let scope = Fields::from([("device".to_owned(), Value::from("NVIDIA H200"))]);
    let options = ImportOptions {
        scope: scope.clone(),
        ..ImportOptions::default()
    };
    let (data, summary) =
        read_with(Format::Triton, &fixture("real/triton"), &options).expect("imports");
    assert_eq!((summary.files, summary.entries), (2, 2));
    assert!(
        summary.notes.iter().any(|n| n.contains("tuning key")),
        "{:?}",
        summary.notes
    );
    for (s, ns, entry) in data.entries() {
        assert_eq!((s.fields(), ns), (&scope, "triton/scale"));
        let names: Vec<&str> = entry
            .candidates()
            .iter()
            .map(|c| c.id.algorithm.as_str())
            .collect();
        // The adapter's names; the bench's [k, k/2, 3k/2] ms timings.
        assert_eq!(names[0], "BLOCK=32,num_warps=4,num_stages=3,num_ctas=1");
        let s = entry
            .best()
            .and_then(|c| c.stats())
            .copied()
            .expect("measured");
        assert!(s.median_ns > 0.0 && s.min_ns == s.median_ns / 2.0 && s.spread_ns == s.median_ns);
        let set = Fingerprint::of_candidate_set(
            entry
                .candidates()
                .iter()
                .map(|c| (c.id.algorithm.as_str(), &c.id.params)),
            &Fields::new(),
        );
        assert_eq!(entry.candidate_set(), set, "the adapter's candidate set");
        let Some(Value::Str(hash)) = entry.key().fields().get("hash") else {
            panic!("hash")
        };
        assert_eq!(hash.len(), 52);
        // Null fields are left out of the params, as the adapter leaves them out.
        assert!(
            entry
                .candidates()
                .iter()
                .all(|c| c.id.params.get("maxnreg").is_none())
        );
    }
}

#[test]
fn an_infinite_timing_is_a_failure_and_a_float_config_is_kept_as_json() {
    let (data, summary) = read(Format::Triton, &fixture("hand/triton")).expect("imports");
    assert!(
        summary.notes.iter().any(|n| n.contains("empty scope")),
        "{:?}",
        summary.notes
    );
    let (_, ns, entry) = data.entries().next().expect("one");
    assert_eq!(ns, "triton/matmul");
    let c = entry.candidates();
    assert_eq!(
        c[0].id.algorithm,
        "BLOCK_M=64,BLOCK_N=64,SPLIT=True,num_warps=4,num_stages=2,num_ctas=1"
    );
    assert_eq!(
        c[1].id.algorithm,
        "BLOCK_M=32,BLOCK_N=32,SCALE=0.5,num_warps=2,num_stages=1,num_ctas=1,maxnreg=128"
    );
    assert!(
        matches!(c[1].id.params.get("json"), Some(Value::Str(j)) if j.contains("\"SCALE\":0.5"))
    );
    assert_eq!(c[1].stats().map(|s| s.median_ns), Some(0.5e6));
    assert!(
        matches!(&c[2].outcome, Outcome::Failed(r) if r.contains("inf")),
        "{:?}",
        c[2]
    );
}

#[test]
fn a_damaged_triton_file_is_refused_with_its_line() {
    let good =
        std::fs::read_to_string(fixture("hand/triton/ABCDEF/matmul.autotune.json")).expect("read");
    for (bad, line, what) in [
        (
            good.replacen("[0.25, 0.2, 0.3]", "\"fast\"", 1),
            2,
            "timing",
        ),
        (
            good.replacen("\"configs_timings\"", "\"timings\"", 1),
            1,
            "configs_timings",
        ),
        (good.replacen(", 0.5]", "]", 1), 4, "[config, timing]"),
    ] {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::create_dir(dir.path().join("H")).expect("dir");
        std::fs::write(dir.path().join("H/f.autotune.json"), bad).expect("write");
        let err = read(Format::Triton, dir.path()).expect_err("refused");
        assert!(
            err.to_string().contains("f.autotune.json") && err.to_string().contains(what),
            "{err}"
        );
        assert_eq!(err.line, Some(line), "{err}");
    }
}

/// Hardening IV, case 10: Triton names its files after kernels of 150 characters and more;
/// the 128-byte namespace limit refused the whole directory. Such a kernel is read, and its
/// entries go into a cache through `read_entries`' checks and `Namespace::new`.
#[test]
fn a_kernel_with_a_long_real_name_is_taken_in() {
    let good =
        std::fs::read_to_string(fixture("hand/triton/ABCDEF/matmul.autotune.json")).expect("read");
    let kernel = format!(
        "triton_red_fused__native_batch_norm_legit_functional_add_addmm_{}_sum_0",
        "convolution_backward_native_batch_norm_backward_threshold_backward_".repeat(2)
    );
    assert!(kernel.len() >= 150, "{}", kernel.len());
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::create_dir(dir.path().join("H")).expect("dir");
    std::fs::write(dir.path().join(format!("H/{kernel}.autotune.json")), good).expect("write");
    let (lines, summary) = cache_import::read_entries(
        Format::Triton,
        dir.path(),
        &cache_import::ImportOptions::default(),
    )
    .expect("read");
    assert_eq!(summary.files, 1);
    let registry = cache_core::cache_migrate::Migrations::new("app", 1);
    let spill = lines
        .into_entries(&registry, &cache_core::cache_format::Limits::default())
        .expect("every entry passes the checks");
    let data = spill.into_data().expect("entries");
    let (_, ns, _) = data.entries().next().expect("one entry");
    assert_eq!(ns, format!("triton/{kernel}"));
    cache_core::Namespace::new(ns).expect("a namespace this long is valid");
}

/// Hardening IV, case 9: an entry the cache's checks refuse (a p50 of 1e303 ms is infinite in
/// nanoseconds) was named by the directory imported, not its file. The refusal names the file.
#[test]
fn a_refused_entry_names_its_file() {
    let good =
        std::fs::read_to_string(fixture("hand/triton/ABCDEF/matmul.autotune.json")).expect("read");
    let bad = good.replacen("[0.25, 0.2, 0.3]", "[1e303, 1e303, 1e303]", 1);
    assert_ne!(bad, good);
    let dir = tempfile::tempdir().expect("tmp");
    for sub in ["A", "B"] {
        std::fs::create_dir(dir.path().join(sub)).expect("dir");
    }
    std::fs::write(dir.path().join("A/fine.autotune.json"), &good).expect("write");
    std::fs::write(dir.path().join("B/huge.autotune.json"), bad).expect("write");
    let err = cache_import::read_entries(
        Format::Triton,
        dir.path(),
        &cache_import::ImportOptions::default(),
    )
    .expect_err("refused");
    assert!(
        err.file.ends_with("B/huge.autotune.json"),
        "names the file: {err}"
    );
    assert!(err.to_string().contains("refused"), "{err}");
}
