//! PyTorch Inductor AutoHeuristic collection files.

use cache_core::cache_format::Value;
use cache_import::Format;

use crate::support::{fixture, read};

#[test]
fn every_problem_becomes_an_entry_with_every_choice_measured() {
    let (data, summary) =
        read(Format::AutoHeuristic, &fixture("hand/autoheuristic")).expect("imports");
    assert_eq!((summary.files, summary.entries), (1, 3));
    let mut seen = Vec::new();
    for (scope, ns, entry) in data.entries() {
        assert_eq!(ns, "inductor/mm");
        assert_eq!(scope.fields().get("arch"), Some(&Value::from("sm80")));
        let fields = entry.key().fields();
        seen.push((
            fields.get("m").cloned(),
            fields.get("mat1_dtype").cloned(),
            entry.candidates().len(),
            entry
                .best()
                .map(|b| (b.id.to_string(), b.stats().map(|s| s.median_ns))),
        ));
    }
    seen.sort_by_key(|s| format!("{s:?}"));
    // Repeats are one candidate: the median of three 0.025, 0.027, 0.026 ms is 26,000 ns.
    let small = seen
        .iter()
        .find(|s| s.0 == Some(Value::Int(256)))
        .expect("the small problem");
    assert_eq!(small.2, 3);
    let (best, median) = small.3.clone().expect("a winner");
    assert!(best.starts_with("triton"), "{best}");
    assert!((median.expect("measured") - 26_000.0).abs() < 1e-6);
    // The same sizes in two dtypes are two keys.
    assert_eq!(
        seen.iter()
            .filter(|s| s.0 == Some(Value::Int(4096)))
            .count(),
        2
    );
}

#[test]
fn a_damaged_file_is_refused_with_its_line() {
    let dir = tempfile::tempdir().expect("tmp");
    let good = std::fs::read_to_string(fixture("hand/autoheuristic/mm.txt")).expect("fixture");
    for (damage, line) in [
        (good.replacen("0.090", "fast", 1), 9),
        (
            good.replacen("256,512,1024,torch.float16,extern_mm,0.031", "256,512", 1),
            4,
        ),
        (good.replacen("\"device_capa\": [8, 0], ", "", 1), 1),
        (good.replacen("choice,feedback", "choice", 1), 2),
    ] {
        std::fs::write(dir.path().join("mm.txt"), &damage).expect("write");
        let err = read(Format::AutoHeuristic, dir.path()).expect_err("refused");
        assert_eq!(err.line, Some(line), "{err}");
        assert!(err.to_string().contains("mm.txt"), "{err}");
    }
    std::fs::write(dir.path().join("mm.txt"), "").expect("write");
    assert!(read(Format::AutoHeuristic, dir.path()).is_err());
}
