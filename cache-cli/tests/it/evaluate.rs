//! `tunecache evaluate`: k-fold cross-validation of prediction on fully tuned keys.

use crate::tunecache;

/// JSON lines for a kernel whose best tile grows with `m` (tile 2^(log2 m / 2)), every tile
/// measured for every key, in one scope and namespace; `extra` keys in another namespace.
fn grid(extra: usize) -> String {
    grid_on("x", 0.0, extra)
}

/// [`grid`] on `device`, its best tile `shift` powers of two larger.
fn grid_on(device: &str, shift: f64, extra: usize) -> String {
    let mut lines = Vec::new();
    for m in (4..=13).flat_map(|p| [1i64 << p, 3 << (p - 2)]) {
        for n in [64, 256, 1024] {
            let ideal = ((m * n) as f64).log2() / 4.0 + shift;
            let candidates: Vec<String> = (3..=8)
                .map(|t| {
                    let median = (m * n) as f64 * (1.0 + 0.2 * (t as f64 - ideal).powi(2));
                    format!(
                        r#"{{"algo":"blocked","params":{{"tile":{}}},"median_ns":{median:.1},"measured_at":1700000000000}}"#,
                        1 << t
                    )
                })
                .collect();
            lines.push(format!(
                r#"{{"scope":{{"device":"{device}"}},"namespace":"matmul","key":{{"m":{m},"n":{n}}},"recorded_at":1700000000000,"candidates":[{}]}}"#,
                candidates.join(",")
            ));
        }
    }
    for i in 0..extra {
        lines.push(format!(
            r#"{{"scope":{{"device":"x"}},"namespace":"rare","key":{{"m":{i}}},"recorded_at":1700000000000,"candidates":[{{"algo":"a","median_ns":5,"measured_at":1700000000000}},{{"algo":"b","median_ns":6,"measured_at":1700000000000}}]}}"#
        ));
    }
    lines.join("\n") + "\n"
}

#[test]
fn prediction_is_cross_validated_per_namespace_and_small_groups_are_said() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("c.tcache");
    let source = dir.path().join("grid.jsonl");
    std::fs::write(&source, grid(4)).expect("lines");
    let out = tunecache(&file, &["import", source.to_str().expect("utf-8")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = tunecache(
        &file,
        &[
            "--json",
            "evaluate",
            "--default",
            r#"blocked {"tile":32}"#,
            "--top",
            "1,3",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(report["folds"], 5);
    let groups = report["groups"].as_array().expect("groups");
    assert_eq!(groups.len(), 1, "{report:#}");
    let g = &groups[0];
    assert_eq!(
        (g["namespace"].as_str(), g["keys"].as_u64()),
        (Some("matmul"), Some(60))
    );
    assert_eq!(g["evaluated"], 60, "every key held out once");
    let methods: Vec<&str> = g["methods"]
        .as_array()
        .expect("methods")
        .iter()
        .filter_map(|m| m["method"].as_str())
        .collect();
    assert_eq!(
        methods,
        [
            r#"default (blocked {"tile":32})"#,
            "nearest key's winner",
            "prediction (k=4)",
            "top-1 tuning",
            "top-3 tuning",
            "static list of 1 per dtype",
            "static list of 3 per dtype",
            "top-1 stopping early",
            "top-3 stopping early"
        ],
        "the default a candidate's label names"
    );
    let share = |i: usize| g["methods"][i]["share_of_optimum"].as_f64().expect("share");
    assert!(
        share(2) > share(0),
        "prediction beats a fixed choice: {g:#}"
    );
    assert!(
        share(4) >= share(2) - 1e-9,
        "measuring three does no worse: {g:#}"
    );
    assert!(g["methods"][4]["measured_per_key"].as_f64().expect("n") >= 3.0);
    // Stopping early measures at most what its top-k measures, and at least one a key.
    let measured = |i: usize| g["methods"][i]["measured_per_key"].as_f64().expect("n");
    assert!((1.0..=measured(4)).contains(&measured(8)), "{g:#}");
    let folds = g["methods"][2]["fold_shares"].as_array().expect("per fold");
    assert_eq!(folds.len(), 5, "{g:#}");
    let worst = folds
        .iter()
        .filter_map(serde_json::Value::as_f64)
        .fold(1.0, f64::min);
    assert_eq!(g["methods"][2]["worst_fold_share"].as_f64(), Some(worst));
    assert!(
        report["skipped"][0]
            .as_str()
            .is_some_and(|s| s.starts_with("rare in {\"device\":\"x\"}: 4 keys")),
        "{report:#}"
    );
    // Few tuned: each fold alone predicts the other four (each key four times).
    let out = tunecache(
        &file,
        &["--json", "evaluate", "--few-tuned", "-n", "matmul"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let few: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(few["groups"][0]["evaluated"], 240, "{few:#}");
    assert_eq!(few["few_tuned"], true);
    // Folds by a field: keys of one m are held out together, and the report says so.
    let out = tunecache(&file, &["--json", "evaluate", "--fold-by", "m"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let by_m: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(by_m["fold_by"], serde_json::json!(["m"]), "{by_m:#}");
    assert_eq!(by_m["groups"][0]["evaluated"], 60, "{by_m:#}");
    let out = tunecache(&file, &["evaluate", "--fold-by", "m", "-n", "matmul"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("5-fold by m (keys that agree on them held out together)"),
        "{text}"
    );
    // Bad arguments are usage errors, not panics.
    for args in [
        &["evaluate", "--folds", "1"][..],
        &["evaluate", "--top", "0"],
        &["evaluate", "--neighbours", "0"],
        &["evaluate", "--fold-by", "k"],
    ] {
        let out = tunecache(&file, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
    let out = tunecache(&file, &["evaluate", "--fold-by", "m,k"]);
    assert!(
        stderr_of(&out).contains("--fold-by k: no key has that field"),
        "{}",
        stderr_of(&out)
    );
    // A huge k or number of neighbours is "all of them", not an allocation that aborts.
    for args in [
        &["evaluate", "--top", "999999999999"][..],
        &["evaluate", "--neighbours", "18446744073709551615"],
    ] {
        let out = tunecache(&file, args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn a_device_never_tuned_is_predicted_from_another_alone() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("c.tcache");
    let source = dir.path().join("two.jsonl");
    // The second device's best tile is twice the first's: its winners all differ, its
    // ranking is near.
    std::fs::write(&source, grid_on("x", 0.0, 0) + &grid_on("y", 1.0, 0)).expect("lines");
    let out = tunecache(&file, &["import", source.to_str().expect("utf-8")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = tunecache(
        &file,
        &[
            "--json",
            "evaluate",
            "--transfer-from",
            r#"{"device":"x"}"#,
            "--top",
            "3",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let groups = report["groups"].as_array().expect("groups");
    assert_eq!(
        groups.len(),
        1,
        "the source is not its own target: {report:#}"
    );
    let g = &groups[0];
    assert_eq!(g["scope"], r#"{"device":"y"}"#);
    assert_eq!(g["from"], r#"{"device":"x"}"#);
    assert_eq!(g["evaluated"], 60);
    let m = |i: usize, f: &str| g["methods"][i][f].as_f64().expect("figure");
    // Moved as it is, the source's winner is seldom the target's; measuring the top three on
    // the target finds a near-best.
    assert!(m(1, "exact_share") < 0.5, "{g:#}");
    assert!(m(3, "share_of_optimum") > m(1, "share_of_optimum"), "{g:#}");
    assert!(
        g["methods"][3]["worst_fold_share"].is_null(),
        "one split, no folds"
    );
    // Each device from all the others together.
    let out = tunecache(
        &file,
        &[
            "--json",
            "evaluate",
            "--transfer-from",
            "others",
            "--top",
            "3",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let groups = report["groups"].as_array().expect("groups");
    assert_eq!(groups.len(), 2, "{report:#}");
    assert!(
        groups
            .iter()
            .all(|g| g["from"] == "the other scopes" && g["evaluated"] == 60),
        "{report:#}"
    );
}

#[test]
fn nothing_evaluated_is_no_score_and_an_unknown_default_is_refused() {
    // Two devices whose candidates have different names: a transfer predicts nothing.
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("c.tcache");
    let source = dir.path().join("two.jsonl");
    let other = grid_on("y", 0.0, 0).replace("\"blocked\"", "\"tiled\"");
    std::fs::write(&source, grid_on("x", 0.0, 0) + &other).expect("lines");
    let out = tunecache(&file, &["import", source.to_str().expect("utf-8")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = tunecache(
        &file,
        &["--json", "evaluate", "--transfer-from", r#"{"device":"x"}"#],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        report["groups"].as_array().map(Vec::len),
        Some(0),
        "{report:#}"
    );
    let skipped = report["skipped"].to_string();
    assert!(skipped.contains("nothing evaluated"), "{report:#}");
    // A default that names no candidate of any key is a usage error, not each key's first.
    let out = tunecache(&file, &["evaluate", "--default", "extern_mm"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--default extern_mm") && err.contains("blocked"),
        "{err}"
    );
}

#[test]
fn a_default_only_a_skipped_group_has_is_refused_and_a_group_without_it_says_so() {
    // matmul (60 keys) is evaluated; rare (4 keys, candidates a and b) is too small.
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("c.tcache");
    let source = dir.path().join("grid.jsonl");
    std::fs::write(&source, grid(4)).expect("lines");
    let out = tunecache(&file, &["import", source.to_str().expect("utf-8")]);
    assert!(out.status.success());
    // `a` is only rare's: no group evaluated has it, with or without -n.
    for args in [
        vec!["evaluate", "--default", "a"],
        vec!["evaluate", "--default", "a", "-n", "rare"],
        vec!["evaluate", "--default", "a", "-n", "matmul"],
    ] {
        let out = tunecache(&file, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("no key evaluated has that candidate"), "{err}");
    }
    // A malformed default is a usage error too, as is a source scope no key has.
    for args in [
        vec!["evaluate", "--default", " "],
        vec!["evaluate", "--default", "blocked {"],
        vec!["evaluate", "--transfer-from", r#"{"device":"nosuch"}"#],
        vec!["evaluate", "--transfer-from", r#"{"device":"x""#],
        vec!["evaluate", "--transfer-from", "[1]"],
        vec!["evaluate", "--default", "a", "-n", "nosuch"],
    ] {
        let out = tunecache(&file, &args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = tunecache(&file, &["evaluate", "--transfer-from", r#"{"device":"x""#]);
    assert!(
        stderr_of(&out).contains("--transfer-from"),
        "{}",
        stderr_of(&out)
    );
    // Nothing to evaluate is said, not an empty screen.
    let out = tunecache(&file, &["evaluate", "-n", "nosuch"]);
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("nothing to evaluate"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // With a second device lacking the default, its group says its baseline is not it.
    let other = dir.path().join("other.jsonl");
    std::fs::write(
        &other,
        grid_on("y", 0.0, 0).replace("\"blocked\"", "\"tiled\""),
    )
    .expect("lines");
    let out = tunecache(&file, &["import", other.to_str().expect("utf-8")]);
    assert!(out.status.success());
    let out = tunecache(
        &file,
        &["--json", "evaluate", "--default", "blocked {\"tile\":32}"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let notes: Vec<bool> = report["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| g["baseline"].is_string())
        .collect();
    assert_eq!(notes.len(), 2, "{report:#}");
    assert_eq!(notes.iter().filter(|n| **n).count(), 1, "{report:#}");
    let skipped = report["skipped"].to_string();
    assert!(skipped.contains("4 keys, 4 of them scored"), "{report:#}");
}

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Imports `lines` into a new cache file `name` in `dir`.
fn imported(dir: &std::path::Path, name: &str, lines: &str) -> std::path::PathBuf {
    let file = dir.join(name);
    let source = dir.join(format!("{name}.jsonl"));
    std::fs::write(&source, lines).expect("lines");
    let out = tunecache(&file, &["import", source.to_str().expect("utf-8")]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    file
}

/// A workload never tuned, on a device whose other workloads were: every key predicted from
/// the other files' keys (a key both have does not vote), with another device's result for
/// the same key beside them when `--transfer-from` names it.
#[test]
fn a_workload_never_tuned_is_predicted_from_the_other_workloads_files() {
    let dir = tempfile::tempdir().expect("dir");
    let every_other = |text: String, keep: usize| -> String {
        let lines: Vec<&str> = text.lines().collect();
        lines
            .iter()
            .skip(keep)
            .step_by(2)
            .map(|l| format!("{l}\n"))
            .collect()
    };
    let target = imported(dir.path(), "target.tcache", &every_other(grid(0), 0));
    // The other workload: the other half of the keys, and one of the target's.
    let first = grid(0).lines().next().expect("a line").to_owned() + "\n";
    let tuned = imported(
        dir.path(),
        "tuned.tcache",
        &(every_other(grid(0), 1) + &first),
    );
    let tuned_arg = tuned.to_str().expect("utf-8");
    let run = |file: &std::path::Path, args: &[&str]| {
        let mut all = vec!["--json", "evaluate", "--top", "3"];
        all.extend_from_slice(args);
        tunecache(file, &all)
    };
    // --top 3 asked twice is one row of each kind.
    let out = run(&target, &["--tuned-in", tuned_arg, "--top", "3"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(report["tuned_in"][0], tuned_arg, "{report:#}");
    assert_eq!(
        report["groups"][0]["methods"].as_array().map(Vec::len),
        Some(6)
    );
    let g = &report["groups"][0];
    assert_eq!(g["evaluated"], 30, "{report:#}");
    assert!(g["from"].as_str().expect("from").contains(tuned_arg));
    let share = |g: &serde_json::Value, i: usize| {
        g["methods"][i]["share_of_optimum"].as_f64().expect("share")
    };
    assert!(
        share(g, 2) > share(g, 0),
        "prediction beats the first: {g:#}"
    );
    // Beside another device's result for each key (the same kernel there).
    let both = imported(
        dir.path(),
        "both.tcache",
        &(every_other(grid(0), 0) + &grid_on("other", 0.0, 0)),
    );
    let out = run(
        &both,
        &[
            "--tuned-in",
            tuned_arg,
            "--transfer-from",
            r#"{"device":"other"}"#,
        ],
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let groups = report["groups"].as_array().expect("groups");
    assert_eq!(
        groups.len(),
        1,
        "the other device is not a target: {report:#}"
    );
    assert!(groups[0]["from"].as_str().expect("from").contains("other"));
    assert!(share(&groups[0], 2) >= share(g, 2), "{report:#}");
    // A key two files hold votes once (a hostile review: a file given twice, or two files
    // sharing keys, weighed those keys twice): the same figures as the file alone.
    let copy = dir.path().join("copy.tcache");
    std::fs::copy(&tuned, &copy).expect("copy");
    let out = run(
        &target,
        &[
            "--tuned-in",
            tuned_arg,
            "--tuned-in",
            copy.to_str().expect("utf-8"),
        ],
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    let twice: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(twice["groups"][0]["methods"], g["methods"], "{twice:#}");
    // What it cannot do is said: the cache itself or a file named twice (usage), a file that
    // is not there, is not a cache or is another application's (exit 1, naming it), and the
    // folds it has no use for.
    for (args, code, says) in [
        (
            vec!["--tuned-in", target.to_str().expect("utf-8")],
            2,
            "the cache evaluated",
        ),
        (
            vec!["--tuned-in", tuned_arg, "--tuned-in", tuned_arg],
            2,
            "the same file",
        ),
        (
            vec!["--tuned-in", tuned_arg, "--few-tuned"],
            2,
            "--few-tuned",
        ),
    ] {
        let out = run(&target, &args);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{args:?}: {}",
            stderr_of(&out)
        );
        assert!(
            stderr_of(&out).contains(says),
            "{args:?}: {}",
            stderr_of(&out)
        );
    }
    let missing = dir.path().join("missing.tcache");
    let out = run(&target, &["--tuned-in", missing.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    assert!(stderr_of(&out).contains("--tuned-in"));
    assert!(stderr_of(&out).contains("missing.tcache: no such file"));
    let theirs = dir.path().join("theirs.tcache");
    let lines = dir.path().join("theirs.jsonl");
    std::fs::write(&lines, every_other(grid(0), 1)).expect("lines");
    let out = tunecache(
        &theirs,
        &[
            "import",
            "--app",
            "otherlib",
            lines.to_str().expect("utf-8"),
        ],
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    let out = run(&target, &["--tuned-in", theirs.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("otherlib's cache"),
        "{}",
        stderr_of(&out)
    );
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, "not a cache\n").expect("notes");
    let out = run(&target, &["--tuned-in", notes.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    assert!(stderr_of(&out).contains("notes.txt"), "{}", stderr_of(&out));
    assert_eq!(std::fs::read(&notes).expect("notes"), b"not a cache\n");
}
