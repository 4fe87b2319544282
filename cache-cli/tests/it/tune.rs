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
            "2",
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
    assert!(c["tuning_seconds"].as_f64().expect("f") > 0.0);

    let warm = tunecache(
        &path,
        &[
            "--json",
            "tune",
            "--backend",
            "cpu",
            "--steps",
            "2",
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

    let text_run = tunecache(&path, &["tune", "--backend", "cpu", "--steps", "2"]);
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
