//! The CLI's shared tier under faults and in the corner cases of issue 24: one deadline bounds
//! a command's shared-tier work whatever the number of keys, a full server is said once, a
//! pulled key measured here again reaches the server, a pull of refused values says so, and
//! a machine with no cache file yet reads the shared tier.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use test_support::cli::{command, stderr, stdout};
use test_support::redis_server::Server;

use crate::EXE;

fn with_remote(url: &str, file: &Path, args: &[&str]) -> Output {
    command(EXE, file, args)
        .env("TUNECACHE_REMOTE", url)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run tunecache")
}

fn text(o: &Output) -> String {
    format!("stdout:\n{}\nstderr:\n{}", stdout(o), stderr(o))
}

/// JSON lines of `n` entries of one scope and namespace, `algo` measured at `median` ns.
fn lines(n: usize, algo: &str, median: f64) -> String {
    (0..n)
        .map(|i| {
            format!(
                r#"{{"scope":{{}},"namespace":"mm","key":{{"m":{i}}},"candidates":[{{"algo":"{algo}","params":{{}},"status":"ok","median_ns":{median},"min_ns":{median},"spread_ns":0.0,"samples":3}}]}}"#
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn import(url: &str, file: &Path, text: &str) -> Output {
    let input = file.with_extension("jsonl");
    std::fs::write(&input, text).expect("lines");
    with_remote(url, file, &["import", input.to_str().expect("utf-8")])
}

/// Case 4: publishing 8 keys to a frozen server took 8 × 2 s; one deadline bounds it now.
#[test]
fn an_import_publishing_to_a_frozen_server_is_bounded_by_one_wait() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    server.signal(libc::SIGSTOP);
    let t = Instant::now();
    let o = import(
        &server.url(),
        &dir.path().join("c.tcache"),
        &lines(8, "a", 1.0),
    );
    let took = t.elapsed();
    server.signal(libc::SIGCONT);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(stdout(&o).contains("imported 8"), "{}", text(&o));
    assert!(took < Duration::from_secs(4), "{took:?}: {}", text(&o));
}

/// Case 8: a full server's refusal of 2,000 writes is said in a line, not 2,000 times.
#[test]
fn a_full_server_is_said_once_in_a_short_line() {
    let Some(server) = Server::start() else {
        return;
    };
    server.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
    let dir = tempfile::tempdir().expect("dir");
    let o = import(
        &server.url(),
        &dir.path().join("c.tcache"),
        &lines(2000, "a", 1.0),
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        stderr(&o).len() < 2_000,
        "{} bytes of stderr",
        stderr(&o).len()
    );
    assert!(stderr(&o).contains("full"), "{}", text(&o));
}

/// Case 9: a key pulled from the server and measured here again (another candidate) is
/// published by `remote push`: the server reaches the join.
#[test]
fn a_pulled_key_measured_here_again_reaches_the_server() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let (a, b) = (dir.path().join("a.tcache"), dir.path().join("b.tcache"));
    let url = server.url();
    assert_eq!(
        import(&url, &a, &lines(1, "from_a", 10.0)).status.code(),
        Some(0)
    );
    let pull = with_remote(&url, &b, &["remote", "pull"]);
    assert_eq!(pull.status.code(), Some(0), "{}", text(&pull));
    let put = command(
        EXE,
        &b,
        &[
            "put",
            "-n",
            "mm",
            "-k",
            r#"{"m":0}"#,
            "--algo",
            "from_b",
            "--median-ns",
            "5",
        ],
    )
    .output()
    .expect("put without a remote");
    assert_eq!(put.status.code(), Some(0), "{}", text(&put));
    let push = with_remote(&url, &b, &["--json", "remote", "push"]);
    assert_eq!(push.status.code(), Some(0), "{}", text(&push));
    let fresh = dir.path().join("c.tcache");
    let get = with_remote(
        &url,
        &fresh,
        &["--json", "get", "-n", "mm", "-k", r#"{"m":0}"#],
    );
    assert_eq!(get.status.code(), Some(0), "{}", text(&get));
    let out = stdout(&get);
    assert!(
        out.contains("from_a") && out.contains("from_b"),
        "{}",
        text(&get)
    );
}

/// Case 11: a pull whose values were all refused says so, not that the server holds nothing.
#[test]
fn a_pull_of_refused_values_says_they_were_refused() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let a = dir.path().join("a.tcache");
    assert_eq!(
        import(&server.url(), &a, &lines(1, "x", 1.0)).status.code(),
        Some(0)
    );
    let keys = match server.cmd(&["KEYS", "*"]) {
        redis::Value::Array(keys) => keys,
        other => panic!("KEYS answered {other:?}"),
    };
    let key: String = redis::from_redis_value(keys[0].clone()).expect("a key");
    server.set_raw(&key, b"damaged");
    let pull = with_remote(
        &server.url(),
        &dir.path().join("b.tcache"),
        &["remote", "pull"],
    );
    assert_eq!(pull.status.code(), Some(0), "{}", text(&pull));
    assert!(!stderr(&pull).contains("holds nothing"), "{}", text(&pull));
    assert!(stderr(&pull).contains("all refused"), "{}", text(&pull));
}

/// Case 12: a machine with no cache file yet reads the shared tier on `get`.
#[test]
fn get_on_a_machine_with_no_cache_file_reads_the_shared_tier() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let url = server.url();
    assert_eq!(
        import(&url, &dir.path().join("a.tcache"), &lines(1, "shared", 3.0))
            .status
            .code(),
        Some(0)
    );
    let new = dir.path().join("new.tcache");
    let get = with_remote(&url, &new, &["get", "-n", "mm", "-k", r#"{"m":0}"#]);
    assert_eq!(get.status.code(), Some(0), "{}", text(&get));
    assert!(stdout(&get).contains("shared"), "{}", text(&get));
    assert!(!new.exists(), "a get creates no file");
    // Without a shared tier, a missing file is still an error.
    let plain = command(EXE, &new, &["get", "-n", "mm", "-k", r#"{"m":0}"#])
        .output()
        .expect("get");
    assert_ne!(plain.status.code(), Some(0), "{}", text(&plain));
}

/// Seen once: `rediss://` against a plaintext server said only "timed out"; it names TLS now.
#[test]
fn rediss_against_a_plaintext_server_names_tls() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let url = server.url().replacen("redis://", "rediss://", 1);
    assert!(url.starts_with("rediss://"), "{url}");
    let t = Instant::now();
    let o = with_remote(&url, &dir.path().join("c.tcache"), &["remote", "stats"]);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    assert!(stderr(&o).contains("TLS"), "{}", text(&o));
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

/// Case 10: a writer on the server gives each key's slowest candidate a false, tiny median.
/// Every machine ran the slowest candidate and `tune` said "warm run … saved"; now each
/// false winner is timed on its verification run, distrusted, and its key tuned here.
#[test]
fn tune_distrusts_winners_far_slower_here_than_the_server_says() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let tune = [
        "--json",
        "tune",
        "--backend",
        "cpu",
        "--steps",
        "1",
        "--no-progress",
    ];
    let honest = with_remote(&server.url(), &dir.path().join("a.tcache"), &tune);
    assert_eq!(honest.status.code(), Some(0), "{}", text(&honest));
    // The liar: the honest export with each key's slowest candidate timed at 1 ns, measured
    // now (no timestamps: the import's time), published by importing it.
    let export = with_remote(&server.url(), &dir.path().join("a.tcache"), &["export"]);
    let mut lies = String::new();
    let mut slowest = std::collections::BTreeMap::new();
    for line in stdout(&export).lines() {
        let mut e: serde_json::Value = serde_json::from_str(line).expect("JSON line");
        let candidates = e["candidates"].as_array_mut().expect("candidates");
        let slow = candidates
            .iter_mut()
            .filter(|c| c["status"] == "ok")
            .max_by(|a, b| {
                a["median_ns"]
                    .as_f64()
                    .partial_cmp(&b["median_ns"].as_f64())
                    .expect("finite")
            })
            .expect("a measured candidate");
        for (field, value) in [("median_ns", 1.0), ("min_ns", 1.0), ("spread_ns", 0.0)] {
            slow[field] = serde_json::json!(value);
        }
        slow["samples"] = serde_json::json!(20);
        let name = format!("{} {}", slow["algo"], slow["params"]);
        for c in candidates.iter_mut() {
            c.as_object_mut().expect("object").remove("measured_at");
        }
        e.as_object_mut().expect("object").remove("recorded_at");
        slowest.insert(e["key"].to_string(), name);
        lies.push_str(&format!("{e}\n"));
    }
    assert!(slowest.len() >= 4, "{slowest:?}");
    let liar = import(&server.url(), &dir.path().join("liar.tcache"), &lies);
    assert_eq!(liar.status.code(), Some(0), "{}", text(&liar));

    let b = with_remote(&server.url(), &dir.path().join("b.tcache"), &tune);
    assert_eq!(b.status.code(), Some(0), "{}", text(&b));
    let report: serde_json::Value = serde_json::from_slice(&b.stdout).expect("JSON");
    let (mut distrusted, mut tuned) = (0, 0);
    for ns in report["namespaces"]
        .as_object()
        .expect("namespaces")
        .values()
    {
        distrusted += ns["remote_distrusted"].as_u64().expect("counted");
        tuned += ns["keys_tuned"].as_u64().expect("counted");
        assert_eq!(ns["keys_reused"], 0, "{report:#}");
    }
    assert_eq!(distrusted as usize, slowest.len(), "{report:#}");
    assert_eq!(tuned, distrusted, "{report:#}");
    assert!(stderr(&b).contains("slower here"), "{}", text(&b));
    // No key runs the candidate the liar made win.
    let winners = test_support::cli::run(EXE, &dir.path().join("b.tcache"), &["--json", "export"]);
    for line in stdout(&winners).lines() {
        let e: serde_json::Value = serde_json::from_str(line).expect("JSON line");
        let best = &e["candidates"][0];
        let name = format!("{} {}", best["algo"], best["params"]);
        assert_ne!(Some(&name), slowest.get(&e["key"].to_string()), "{line}");
        assert!(best["median_ns"].as_f64().expect("timed") > 1.0, "{line}");
    }
}

/// Hardening IV, case 2: `TUNECACHE_REMOTE_CA` naming a FIFO blocked every command for ever,
/// and `/dev/zero` was read until memory ran out. It is read as every path is: a regular file
/// only, bounded; anything else is a clear error naming it, at once.
#[test]
fn a_ca_file_that_is_a_fifo_or_a_device_is_refused_at_once() {
    let dir = tempfile::tempdir().expect("dir");
    let fifo = dir.path().join("ca.pem");
    let c = std::ffi::CString::new(fifo.to_str().expect("utf-8")).expect("path");
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let big = dir.path().join("big.pem");
    std::fs::write(&big, vec![b'A'; 5 << 20]).expect("write");
    // A file with no certificate in it: said now, not later as an unknown issuer.
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").expect("write");
    for ca in [
        fifo.as_path(),
        Path::new("/dev/zero"),
        big.as_path(),
        empty.as_path(),
    ] {
        let mut child = command(EXE, &dir.path().join("c.tcache"), &["remote", "ping"])
            .env("TUNECACHE_REMOTE", "rediss://127.0.0.1:1")
            .env("TUNECACHE_REMOTE_CA", ca)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run tunecache");
        let started = std::time::Instant::now();
        while child.try_wait().expect("wait").is_none() {
            if started.elapsed() > std::time::Duration::from_secs(20) {
                let _ = child.kill();
                panic!("{}: the command did not end", ca.display());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let o = child.wait_with_output().expect("output");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{}: {err}", ca.display());
        assert!(
            err.contains("TUNECACHE_REMOTE_CA") && err.contains(&*ca.to_string_lossy()),
            "{}: {err}",
            ca.display()
        );
    }
}

/// A wait too long for the clock (`--wait 1e19`) is as good as forever, not a panic: against
/// a server that refuses connections, push and pull fail in a line (exit 1), not exit 101.
#[test]
fn a_wait_too_long_for_the_clock_is_forever_not_a_panic() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("c.tcache");
    let put = command(
        EXE,
        &file,
        &[
            "put",
            "-n",
            "mm",
            "-k",
            r#"{"m":1}"#,
            "--algo",
            "a",
            "--median-ns",
            "5",
        ],
    )
    .output()
    .expect("put");
    assert_eq!(put.status.code(), Some(0), "{}", text(&put));
    // Port 1: nothing listens there (as the unreachable-server test of shared.rs uses).
    let url = "redis://127.0.0.1:1/0";
    for action in ["push", "pull"] {
        let o = with_remote(url, &file, &["remote", action, "--wait", "1e19"]);
        assert_eq!(o.status.code(), Some(1), "{action}: {}", text(&o));
        assert!(!stderr(&o).contains("panicked"), "{action}: {}", text(&o));
    }
}

/// Issue 49's hostile review: a pull cut short by a short `--wait`, run again, read nothing:
/// it spent the wait asking which keys the cache lacked (a lookup per comparison of a sort).
/// Each run now reads as it finds what the cache lacks, so every run adds entries.
#[test]
fn a_pull_cut_short_goes_on_when_run_again_with_the_same_short_wait() {
    let Some(server) = Server::start() else {
        return;
    };
    let url = server.url();
    let dir = tempfile::tempdir().expect("dir");
    let (a, b) = (dir.path().join("a.tcache"), dir.path().join("b.tcache"));
    let total = 8_000;
    let out = import(&url, &a, &lines(total, "x", 5.0));
    assert!(out.status.success(), "{}", text(&out));
    let entries = |file: &Path| -> usize {
        let out = command(EXE, file, &["export"])
            .output()
            .expect("run tunecache");
        stdout(&out).lines().count()
    };
    let mut had = 0;
    for run in 0..60 {
        let pull = with_remote(&url, &b, &["--json", "remote", "pull", "--wait", "0.5"]);
        let r: serde_json::Value = serde_json::from_slice(&pull.stdout).expect("JSON");
        let now = entries(&b);
        if r["complete"] == true || now == total {
            // (Once every key is here, a run rereads the server's values of keys it has.)
            assert_eq!(now, total, "{r:#}");
            assert!(
                run > 0,
                "one pull read everything: the wait is too long to test this"
            );
            return;
        }
        assert!(
            now > had,
            "run {run} added nothing ({had} entries): {}",
            text(&pull)
        );
        had = now;
    }
    panic!("60 pulls of 0.5 s did not read {total} keys ({had} read)");
}
