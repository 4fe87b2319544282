//! TunableOp CSV and Kernel Tuner JSON: mappings, real files, damaged files.

use cache_core::cache_format::{CacheData, Fields, Key, Outcome, Scope, Value};
use cache_import::Format;

use crate::support::{fixture, read};

fn only(data: &CacheData, ns: &str) -> (Scope, cache_core::cache_format::Entry) {
    let mut found = data.entries().filter(|(_, n, _)| *n == ns);
    let (scope, _, entry) = found.next().unwrap_or_else(|| panic!("an entry of {ns}"));
    assert!(found.next().is_none(), "one entry of {ns}");
    (scope.clone(), entry.clone())
}

#[test]
fn tunableop_results_map_validators_to_scope_and_lines_to_entries() {
    let (data, summary) = read(Format::TunableOp, &fixture("hand/tunableop")).expect("imports");
    assert_eq!((summary.files, summary.entries), (1, 4));
    let (scope, entry) = only(&data, "tunableop/GemmTunableOp_Half_TN");
    assert_eq!(
        scope.fields().get("CUDA_DEVICE"),
        Some(&Value::from("NVIDIA H200"))
    );
    assert_eq!(
        scope.fields().get("PT_VERSION"),
        Some(&Value::from("2.15.0"))
    );
    assert_eq!(
        entry.key(),
        &Key::new(Fields::from([(
            "params".to_owned(),
            Value::from("tn_1024_1024_1024")
        )]))
    );
    let best = entry.best().expect("winner");
    assert_eq!(
        (best.id.algorithm.as_str(), &best.outcome),
        ("Default", &Outcome::Chosen("tunableop".into()))
    );
    let timed = data
        .entries()
        .filter(|(_, n, _)| *n == "tunableop/GemmTunableOp_float_NT")
        .find(|(_, _, e)| e.key().fields().get("params") == Some(&Value::from("nt_4096_4096_64")))
        .map(|(_, _, e)| e.clone())
        .expect("the 4096 row");
    let stats = timed
        .best()
        .and_then(|c| c.stats())
        .copied()
        .expect("measured");
    assert!((stats.median_ns - 33_000.0).abs() < 1e-6, "0.033 ms");
    assert_eq!(
        timed
            .best()
            .and_then(|c| c.policy.clone())
            .and_then(|p| p.get("timer").cloned()),
        Some(Value::from("tunableop"))
    );
}

#[test]
fn damaged_tunableop_lines_are_refused_with_their_line() {
    let good =
        std::fs::read_to_string(fixture("hand/tunableop/tunableop_results0.csv")).expect("read");
    for (bad, line, what) in [
        (
            good.replacen(",1.262", ",fast", 1),
            5,
            "not a non-negative number",
        ),
        (good.replacen(",0.033", ",0.033,extra", 1), 6, "5 fields"),
        (
            good.replacen("Validator,CUDA_VERSION,13.2", "Validator,CUDA_VERSION", 1),
            2,
            "not 3",
        ),
        (format!("{good}Validator,LATE,1\n"), 9, "after the results"),
        (good.replacen("Default", "", 1), 7, "empty"),
    ] {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("tunableop_results3.csv");
        std::fs::write(&path, bad).expect("write");
        let err = read(Format::TunableOp, dir.path()).expect_err("refused");
        assert_eq!(err.line, Some(line), "{err}");
        assert!(
            err.to_string().contains("tunableop_results3.csv:") && err.to_string().contains(what),
            "{err}"
        );
    }
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(
        dir.path().join("tunableop_results0.csv"),
        b"Validator,PT_VERSION,2\xff\n",
    )
    .expect("write");
    let err = read(Format::TunableOp, dir.path()).expect_err("not UTF-8");
    assert_eq!(err.line, Some(1), "{err}");
}

#[test]
fn an_endless_line_is_refused_without_reading_it_whole() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("tunableop_results0.csv");
    let mut text = b"Validator,PT_VERSION,2\n".to_vec();
    text.resize(text.len() + (3 << 20), b'x');
    std::fs::write(&path, text).expect("write");
    let err = read(Format::TunableOp, dir.path()).expect_err("refused");
    assert_eq!(err.line, Some(2), "{err}");
    assert!(err.to_string().contains("longer than"), "{err}");
}

#[test]
fn files_from_the_future_give_the_same_entries_at_every_import() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("tunableop_results0.csv");
    std::fs::copy(fixture("hand/tunableop/tunableop_results0.csv"), &path).expect("copy");
    let made = std::process::Command::new("touch")
        .args(["-d", "2999-01-01"])
        .arg(&path)
        .status()
        .expect("touch");
    assert!(made.success());
    let (first, _) = read(Format::TunableOp, dir.path()).expect("imports");
    std::thread::sleep(std::time::Duration::from_millis(5));
    let (again, _) = read(Format::TunableOp, dir.path()).expect("imports");
    assert_eq!(first, again);
    assert!(
        first.entries().all(|(_, _, e)| e.recorded_at() == 0),
        "an unknown time"
    );
}

#[test]
fn a_kernel_tuner_cache_is_one_entry_ranked_by_measured_time() {
    let (data, _) = read(Format::KernelTuner, &fixture("hand/kernel_tuner")).expect("imports");
    let (scope, entry) = only(&data, "kernel_tuner/matmul_kernel");
    assert_eq!(
        scope.fields().get("device"),
        Some(&Value::from("NVIDIA H200"))
    );
    assert_eq!(
        entry.key().fields().get("problem_size"),
        Some(&Value::List(vec![Value::Int(4096), Value::Int(4096)]))
    );
    let ranked: Vec<String> = entry
        .candidates()
        .iter()
        .map(|c| Value::Map(c.id.params.clone()).to_string())
        .collect();
    assert_eq!(ranked.len(), 4);
    let best = entry.best().expect("winner");
    assert_eq!(best.id.params.get("block_size_y"), Some(&Value::Int(16)));
    let s = best.stats().expect("measured");
    // times [1.5, 1.25, 1.0, 1.25] ms: median 1.25, min 1.0, MAD 0.125, 4 samples.
    assert_eq!(
        (s.median_ns, s.min_ns, s.spread_ns, s.samples),
        (1.25e6, 1.0e6, 0.125e6, 4)
    );
    let last = entry.candidates().last().expect("last");
    assert!(
        matches!(&last.outcome, Outcome::Failed(r) if r.contains("InvalidConfig")),
        "{last:?}"
    );
}

/// MI250X files in the benchmark hub have `"device_name": ""`: a scope of an empty device
/// would lump every such GPU together; the device comes from `--scope` instead.
#[test]
fn an_empty_kernel_tuner_device_name_says_nothing() {
    let dir = tempfile::tempdir().expect("tmp");
    let text = std::fs::read_to_string(fixture("hand/kernel_tuner/matmul_cache.json"))
        .expect("fixture")
        .replace("\"NVIDIA H200\"", "\"\"");
    std::fs::write(dir.path().join("mi250x.json"), text).expect("write");
    let options = cache_import::ImportOptions {
        scope: Fields::from([("device".to_owned(), Value::from("MI250X"))]),
        ..Default::default()
    };
    let (data, summary) =
        crate::support::read_with(Format::KernelTuner, dir.path(), &options).expect("imports");
    let (scope, _) = only(&data, "kernel_tuner/matmul_kernel");
    assert_eq!(scope.fields().get("device"), Some(&Value::from("MI250X")));
    assert!(
        summary
            .notes
            .iter()
            .any(|n| n.contains("device_name is empty")),
        "{summary:?}"
    );
}

#[test]
fn real_kernel_tuner_files_finished_and_cut_short_both_import() {
    let (data, summary) =
        read(Format::KernelTuner, &fixture("real/kernel_tuner")).expect("imports");
    assert_eq!(summary.files, 2);
    for (_, ns, entry) in data.entries() {
        assert_eq!(ns, "kernel_tuner/vector_add");
        assert_eq!(
            entry.key().fields().get("problem_size"),
            Some(&Value::Int(65536))
        );
        // Two finished runs measured 8 configs; the cut-short one fewer, all measured.
        assert!(entry.candidates().len() >= 2, "{entry:?}");
        assert!(
            entry
                .candidates()
                .iter()
                .all(|c| c.stats().is_some_and(|s| s.samples == 7))
        );
    }
}

#[test]
fn a_damaged_kernel_tuner_file_is_refused_with_its_line() {
    let good =
        std::fs::read_to_string(fixture("hand/kernel_tuner/matmul_cache.json")).expect("read");
    for (bad, line, what) in [
        (
            good.replacen("\"time\": 1.75}", "\"time\": -1}", 1),
            11,
            "no time",
        ),
        (
            good.replacen("\"tile_size_x\": 1, ", "", 1),
            9,
            "tile_size_x",
        ),
        (
            good.replacen("\"kernel_name\"", "\"kernel\"", 1),
            1,
            "kernel_name",
        ),
        (
            good.replacen("\"16,8,1\": {", "\"16,8,1\": [", 1),
            9,
            "expected",
        ),
        // Complete JSON without "cache" (hardening IV, "seen once": it was called "text after
        // the end of the document").
        (
            "{\"device_name\": \"x\", \"kernel_name\": \"k\"}".to_owned(),
            1,
            "has no \"cache\"",
        ),
    ] {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(dir.path().join("k.json"), bad).expect("write");
        let err = read(Format::KernelTuner, dir.path()).expect_err("refused");
        assert!(
            err.to_string().contains("k.json") && err.to_string().contains(what),
            "{err}"
        );
        assert_eq!(err.line, Some(line), "{err}");
    }
}
