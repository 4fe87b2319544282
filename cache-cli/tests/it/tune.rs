//! `tunecache tune` end to end on this machine (the CPU backend without a GPU), and `show`.

use std::process::Output;

use crate::tunecache;

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(o)))
}

#[test]
fn a_cold_run_tunes_and_a_second_run_only_hits() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("t.tcache");
    let cold = tunecache(
        &path,
        &[
            "--json",
            "tune",
            "--backend",
            "cpu",
            "--steps",
            "3",
            "--no-progress",
        ],
    );
    assert_eq!(cold.status.code(), Some(0), "{}", text(&cold));
    let c = json(&cold);
    assert_eq!(c["backend"], "cpu");
    let tuned: u64 = ["matmul", "reduce"]
        .iter()
        .map(|ns| c["namespaces"][ns]["keys_tuned"].as_u64().expect("n"))
        .sum();
    assert!(tuned >= 6, "{c:#}");
    // An empty cache reuses nothing: a key served by another key of its bucket, which this
    // run tuned, is counted as such (the third step has two).
    let count = |f: &str| -> u64 {
        ["matmul", "reduce"]
            .iter()
            .map(|ns| c["namespaces"][ns][f].as_u64().expect("n"))
            .sum()
    };
    assert_eq!(count("keys_reused"), 0, "{c:#}");
    assert!(count("keys_bucketed") >= 1, "{c:#}");
    assert!(c["tuning_seconds"].as_f64().expect("f") > 0.0);

    let warm = tunecache(
        &path,
        &[
            "--json",
            "tune",
            "--backend",
            "cpu",
            "--steps",
            "3",
            "--no-progress",
        ],
    );
    assert_eq!(warm.status.code(), Some(0), "{}", text(&warm));
    let w = json(&warm);
    for ns in ["matmul", "reduce"] {
        assert_eq!(w["namespaces"][ns]["keys_tuned"], 0, "{w:#}");
        assert_eq!(w["namespaces"][ns]["candidates_measured"], 0, "{w:#}");
        assert_eq!(
            w["namespaces"][ns]["winners"], c["namespaces"][ns]["winners"],
            "the same winners"
        );
    }
    assert!(
        w["saved_seconds"].as_f64().expect("f") > 0.0,
        "the warm run reports the tuning time it saved"
    );

    let help = tunecache(&path, &["tune", "--help"]);
    for column in [
        "calls", "keys", "tuned", "bucket", "reused", "hits", "saved",
    ] {
        assert!(
            text(&help).contains(&format!("\n  {column} ")),
            "`tune --help` explains {column}: {}",
            text(&help)
        );
    }

    let text_run = tunecache(&path, &["tune", "--backend", "cpu", "--steps", "3"]);
    assert!(
        text(&text_run).contains("warm run: every key came from the cache"),
        "{}",
        text(&text_run)
    );
}

#[test]
fn show_draws_a_key_s_candidates_best_first() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("t.tcache");
    assert!(
        tunecache(
            &path,
            &["tune", "--backend", "cpu", "--steps", "1", "--no-progress"]
        )
        .status
        .success()
    );
    let list = tunecache(&path, &["--json", "list", "-n", "reduce", "--limit", "1"]);
    let first: serde_json::Value = serde_json::from_str(
        String::from_utf8_lossy(&list.stdout)
            .lines()
            .next()
            .expect("a line"),
    )
    .expect("json");
    let key = first["key"].to_string();
    let o = tunecache(&path, &["show", "-n", "reduce", "-k", &key]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("█") && out.contains("← best"), "{out}");
    let missing = tunecache(&path, &["show", "-n", "reduce", "-k", r#"{"n":1}"#]);
    assert_eq!(missing.status.code(), Some(4));
}

#[test]
fn asking_for_cuda_where_there_is_none_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("dir");
    let o = tunecache(
        &dir.path().join("t.tcache"),
        &["tune", "--backend", "cuda", "--steps", "1", "--no-progress"],
    );
    if o.status.success() {
        eprintln!("CUDA is usable on this machine: `tune --backend cuda` ran for real");
        return;
    }
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).contains("CUDA is not usable here")
            || text(&o).contains("without the cuda feature"),
        "{}",
        text(&o)
    );
}

#[test]
fn stability_measures_stored_keys_again_without_recording_and_fails_past_its_thresholds() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("t.tcache");
    let tuned = tunecache(
        &path,
        &["tune", "--backend", "cpu", "--steps", "1", "--no-progress"],
    );
    assert_eq!(tuned.status.code(), Some(0), "{}", text(&tuned));
    let before = std::fs::read(&path).expect("saved");
    let args = ["--json", "stability", "--runs", "2", "--sample", "2"];
    let ok = tunecache(&path, &args);
    assert_eq!(ok.status.code(), Some(0), "{}", text(&ok));
    let r = json(&ok);
    assert_eq!(r["runs"], 2);
    let keys: usize = r["namespaces"]
        .as_array()
        .expect("namespaces")
        .iter()
        .map(|ns| ns["keys"].as_array().expect("keys").len())
        .sum();
    crate::progress::has_pace(&r, keys as u64);
    for ns in r["namespaces"].as_array().expect("namespaces") {
        let keys = ns["keys"].as_array().expect("keys");
        assert!(!keys.is_empty() && keys.len() <= 2, "{ns:#}");
        for k in keys {
            assert!(
                k["stored"].is_string(),
                "a stored key has its stored winner: {k:#}"
            );
            let runs: u64 = k["winners"]
                .as_object()
                .expect("winners")
                .values()
                .map(|n| n.as_u64().expect("n"))
                .sum();
            assert_eq!(runs, 2);
            assert!(k["regret"].as_f64().expect("regret") >= 0.0);
        }
    }
    assert_eq!(
        std::fs::read(&path).expect("still there"),
        before,
        "nothing recorded"
    );
    // Per namespace: the keys clearly won, the agreement on them, the cross-run regret.
    for ns in r["namespaces"].as_array().expect("namespaces") {
        let clear = ns["clear_keys"].as_u64().expect("clear keys");
        assert!(clear as usize <= ns["keys"].as_array().expect("keys").len());
        assert_eq!(ns["agreement"].is_null(), clear == 0, "{ns:#}");
        let (p50, p90, max) = (
            ns["cross_regret_p50"].as_f64().expect("p50"),
            ns["cross_regret_p90"].as_f64().expect("p90"),
            ns["cross_regret_max"].as_f64().expect("max"),
        );
        assert!(0.0 <= p50 && p50 <= p90 && p90 <= max, "{ns:#}");
    }
    // A stored winner made false (the slowest sum kernel recorded as taking 1 ns): every run
    // finds another winner, and the regret threshold makes it exit 3 (a flip-rate threshold
    // counts only keys clearly won, and the true winner of a sum may be a near-tie).
    let export = tunecache(&path, &["export"]);
    let line = String::from_utf8_lossy(&export.stdout)
        .lines()
        .find(|l| l.contains("\"reduce\""))
        .expect("a reduce entry")
        .to_owned();
    let mut entry: serde_json::Value = serde_json::from_str(&line).expect("json");
    let at = entry["recorded_at"].as_u64().expect("ms") + 1;
    entry["candidates"] = serde_json::json!([{
        "algo": "threaded", "params": {"threads": 4}, "status": "ok", "median_ns": 1.0,
        "min_ns": 1.0, "spread_ns": 0.0, "samples": 9, "measured_at": at
    }]);
    let poison = dir.path().join("poison.jsonl");
    std::fs::write(&poison, format!("{entry}\n")).expect("write");
    let imported = tunecache(&path, &["import", poison.to_str().expect("utf-8")]);
    assert_eq!(imported.status.code(), Some(0), "{}", text(&imported));
    let strict = [
        "--json",
        "stability",
        "--runs",
        "2",
        "--sample",
        "100",
        "--max-regret",
        "3",
    ];
    let failed = tunecache(&path, &strict);
    assert_eq!(failed.status.code(), Some(3), "{}", text(&failed));
    let r = json(&failed);
    assert!(!r["failed"].as_array().expect("failed").is_empty());
    let poisoned = r["namespaces"]
        .as_array()
        .expect("namespaces")
        .iter()
        .flat_map(|ns| ns["keys"].as_array().expect("keys"))
        .find(|k| k["stored"] == "threaded {\"threads\":4}")
        .expect("the poisoned key was measured");
    assert_eq!(poisoned["flip_rate"], 1.0);
    assert!(
        poisoned["regret"].as_f64().expect("regret") > 0.5,
        "{poisoned:#}"
    );
    // Bad thresholds are refused.
    let bad = tunecache(&path, &["stability", "--max-regret", "nan"]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
}
