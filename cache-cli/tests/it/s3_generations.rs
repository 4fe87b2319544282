//! Whole-cache generations on an S3 bucket served by moto (`tunecache generation`, and ranks
//! pinned with `TUNECACHE_GENERATION`): ranks pinned to one read the same bytes while newer
//! results arrive; a publisher killed at any moment leaves no half generation.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use test_support::s3_server::S3Server;

use crate::EXE;
use crate::s3::{BUCKET, lines_with, text, with_bucket};

/// The best candidate `get --json` answers for key `m` on `file`, with `extra` environment.
fn best(server: &S3Server, file: &Path, m: u64, extra: &[(&str, &str)]) -> String {
    let out = with_bucket(
        server,
        &format!("s3://{BUCKET}/gen"),
        file,
        &[
            "--json",
            "get",
            "-n",
            "matmul",
            "-k",
            &format!(r#"{{"m":{m}}}"#),
        ],
    )
    .envs(extra.iter().copied())
    .output()
    .expect("get");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let entry: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    entry["candidates"][0]["algo"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn ranks_pinned_to_a_generation_read_the_same_bytes_while_newer_results_arrive() {
    let Some(server) = S3Server::start(BUCKET) else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let remote = format!("s3://{BUCKET}/gen");
    let import = |file: &str, algo: &str, median: u32| {
        let source = dir.path().join(format!("{algo}.jsonl"));
        std::fs::write(&source, lines_with(algo, median, 10)).expect("lines");
        let out = with_bucket(
            &server,
            &remote,
            &dir.path().join(file),
            &["import", &source.to_string_lossy()],
        )
        .output()
        .expect("import");
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    };
    import("a.tcache", "old", 500);
    let snapshot = |file: &str| -> String {
        let out = with_bucket(
            &server,
            &remote,
            &dir.path().join(file),
            &["--json", "generation", "snapshot"],
        )
        .output()
        .expect("snapshot");
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        report["published"].as_str().expect("an id").to_owned()
    };
    let first = snapshot("a.tcache");
    assert_eq!(first.len(), 64, "{first}");
    // A ninth process publishes faster results for the same keys.
    import("b.tcache", "new", 100);
    // Eight ranks pinned to the generation, each on a machine of its own, answer from it.
    let pinned: Vec<String> = (0..8)
        .map(|rank| {
            best(
                &server,
                &dir.path().join(format!("rank{rank}.tcache")),
                3,
                &[("TUNECACHE_GENERATION", &first)],
            )
        })
        .collect();
    assert!(pinned.iter().all(|b| b == "old"), "{pinned:?}");
    // A rank not pinned reads the bucket's newer entry.
    assert_eq!(
        best(&server, &dir.path().join("free.tcache"), 3, &[]),
        "new"
    );
    // `current` follows the pointer; a second snapshot moves it, and prune keeps it.
    let second = snapshot("b.tcache");
    assert_ne!(first, second);
    let rank = dir.path().join("late.tcache");
    assert_eq!(
        best(&server, &rank, 3, &[("TUNECACHE_GENERATION", "current")]),
        "new"
    );
    // An age of 2^54 days is older than anything: nothing pruned (the days were once
    // multiplied into seconds without saturating, and milliseconds cast to u64 wrapped).
    let none = with_bucket(
        &server,
        &remote,
        &rank,
        &[
            "--json",
            "generation",
            "--timeout",
            "18446744073709551615",
            "prune",
            "--older-than-days",
            "18014398509481984",
        ],
    )
    .output()
    .expect("prune");
    assert_eq!(none.status.code(), Some(0), "{}", text(&none));
    let report: serde_json::Value = serde_json::from_slice(&none.stdout).expect("JSON");
    assert_eq!(
        report["pruned"].as_array().map_or(0, Vec::len),
        0,
        "{report:#}"
    );
    assert!(report["current"].is_string(), "{report:#}");
    let pruned = with_bucket(
        &server,
        &remote,
        &rank,
        &["--json", "generation", "prune", "--older-than-days", "0"],
    )
    .output()
    .expect("prune");
    assert_eq!(pruned.status.code(), Some(0), "{}", text(&pruned));
    let report: serde_json::Value = serde_json::from_slice(&pruned.stdout).expect("JSON");
    assert_eq!(report["pruned"], serde_json::json!([first]), "{report:#}");
    assert_eq!(report["current"], serde_json::json!(second), "{report:#}");
}

/// A publisher killed (SIGKILL) at any moment of a snapshot, or while the store is frozen
/// mid-upload, leaves no half generation: the pointer still names a complete one, and every
/// generation listed downloads and hashes to its name.
#[test]
#[allow(
    clippy::print_stdout,
    reason = "the test reports where its kills landed"
)]
fn a_killed_publisher_leaves_no_half_generation_and_the_pointer_names_a_whole_one() {
    let Some(server) = S3Server::start(BUCKET) else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let remote = format!("s3://{BUCKET}/killed");
    let cli =
        |file: &str, args: &[&str]| with_bucket(&server, &remote, &dir.path().join(file), args);
    let ok = |file: &str, args: &[&str]| -> serde_json::Value {
        let out = cli(file, args).output().expect("run");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
    };
    let import = |file: &str, algo: &str, count: u64| {
        let source = dir.path().join(format!("{algo}.jsonl"));
        std::fs::write(&source, lines_with(algo, 300, count)).expect("lines");
        // Local only: a generation is made of the file, not of the bucket's entries.
        let out = test_support::cli::run(
            EXE,
            &dir.path().join(file),
            &["import", &source.to_string_lossy()],
        );
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    };
    import("small.tcache", "small", 10);
    import("big.tcache", "big", 20_000);
    import("timed.tcache", "timed", 20_000);
    // How long a whole snapshot of that size takes here, to kill others along the way.
    let t = Instant::now();
    ok("timed.tcache", &["--json", "generation", "snapshot"]);
    let whole_ms = t.elapsed().as_millis() as u64;
    println!("a whole snapshot of 20,000 entries: {whole_ms} ms");
    let first = ok("small.tcache", &["--json", "generation", "snapshot"])["published"]
        .as_str()
        .expect("an id")
        .to_owned();
    let check = |when: &str| {
        let listed = ok("reader.tcache", &["--json", "generation", "list"]);
        let current = listed["current"].as_str().expect("a current generation");
        let ids: Vec<&str> = listed["generations"]
            .as_array()
            .expect("a list")
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        assert!(
            ids.contains(&current),
            "{when}: the pointer names {current}, not in {ids:?}"
        );
        // Every generation listed is whole: fetched, it hashes to its name.
        for id in ids {
            ok(
                &format!("reader-{id}.tcache"),
                &["--json", "generation", "fetch", id],
            );
        }
        current.to_owned()
    };
    for percent in [0, 30, 60, 80, 95, 110] {
        let delay_ms = whole_ms * percent / 100;
        let mut child = cli("big.tcache", &["generation", "snapshot"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("snapshot");
        std::thread::sleep(Duration::from_millis(delay_ms));
        let _ = child.kill();
        let _ = child.wait();
        let current = check(&format!("killed after {delay_ms} ms"));
        println!(
            "killed after {delay_ms} ms: current is the {} generation",
            if current == first { "first" } else { "new" }
        );
    }
    // Killed while the store is frozen mid-request: the pointer has not moved.
    let before = check("before the freeze");
    {
        let mut child = cli("big.tcache", &["generation", "snapshot"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("snapshot");
        std::thread::sleep(Duration::from_millis(150));
        let frozen = server.freeze();
        std::thread::sleep(Duration::from_millis(300));
        let _ = child.kill();
        let _ = child.wait();
        drop(frozen);
    }
    let after = check("killed while the store was frozen");
    println!(
        "killed while frozen: the pointer {}",
        if after == before {
            "did not move"
        } else {
            "moved to a whole generation"
        }
    );
    // Left alone, a snapshot completes and moves the pointer.
    let whole = ok("big.tcache", &["--json", "generation", "snapshot"])["published"]
        .as_str()
        .expect("an id")
        .to_owned();
    assert_eq!(check("after a whole snapshot"), whole);
}

/// `tune` reads a generation the environment pins, as the library does (it once took only the
/// shared tier from the environment and never read one): a machine tuning against a bucket
/// that holds a generation of another machine's results, and no per-key object, measures
/// nothing.
#[test]
fn tune_reads_the_generation_the_environment_pins() {
    let Some(server) = S3Server::start(BUCKET) else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let remote = format!("s3://{BUCKET}/tune");
    let tune = [
        "--json",
        "tune",
        "--backend",
        "cpu",
        "--steps",
        "2",
        "--no-progress",
    ];
    // Tuned on one machine without the bucket: no per-key object is published.
    let first = dir.path().join("a.tcache");
    let local = test_support::cli::command(EXE, &first, &tune)
        .output()
        .expect("tune");
    assert_eq!(local.status.code(), Some(0), "{}", text(&local));
    let snapshot = with_bucket(&server, &remote, &first, &["generation", "snapshot"])
        .output()
        .expect("snapshot");
    assert_eq!(snapshot.status.code(), Some(0), "{}", text(&snapshot));
    let pinned = with_bucket(&server, &remote, &dir.path().join("b/b.tcache"), &tune)
        .env("TUNECACHE_GENERATION", "current")
        .output()
        .expect("tune");
    assert_eq!(pinned.status.code(), Some(0), "{}", text(&pinned));
    let report: serde_json::Value = serde_json::from_slice(&pinned.stdout).expect("JSON");
    for ns in ["matmul", "reduce"] {
        assert_eq!(report["namespaces"][ns]["keys_tuned"], 0, "{report:#}");
        assert_eq!(
            report["namespaces"][ns]["candidates_measured"], 0,
            "{report:#}"
        );
    }
}
