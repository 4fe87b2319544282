//! The CLI with its shared tier on an S3 bucket (`TUNECACHE_REMOTE=s3://BUCKET/PREFIX`) served
//! by a real S3 API server (moto, on a free loopback port): a second machine reuses what the
//! first tuned; eight processes on two machines publishing the same 50 keys at once lose no
//! candidate (conditional writes, retried on 412 after a jittered pause); a frozen server costs one budget; a bucket
//! that does not exist is one clear line.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use test_support::cli::{command, stderr, stdout};
use test_support::s3_server::S3Server;

use crate::EXE;

pub(crate) const BUCKET: &str = "tunecache-test";

pub(crate) fn with_bucket(server: &S3Server, remote: &str, file: &Path, args: &[&str]) -> Command {
    let mut cmd = command(EXE, file, args);
    cmd.env("TUNECACHE_REMOTE", remote)
        .envs(server.env())
        .stdin(Stdio::null());
    cmd
}

pub(crate) fn run(server: &S3Server, file: &Path, args: &[&str]) -> Output {
    with_bucket(server, &format!("s3://{BUCKET}/team"), file, args)
        .output()
        .expect("run tunecache")
}

pub(crate) fn text(o: &Output) -> String {
    format!("stdout:\n{}\nstderr:\n{}", stdout(o), stderr(o))
}

#[test]
fn a_second_machine_reuses_what_the_first_tuned_through_a_bucket() {
    let Some(server) = S3Server::start(BUCKET) else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let args = [
        "--json",
        "tune",
        "--backend",
        "cpu",
        "--steps",
        "2",
        "--no-progress",
    ];
    let first = run(&server, &dir.path().join("a.tcache"), &args);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first));
    assert!(stderr(&first).contains("published"), "{}", text(&first));
    let second = run(&server, &dir.path().join("b.tcache"), &args);
    assert_eq!(second.status.code(), Some(0), "{}", text(&second));
    let report: serde_json::Value = serde_json::from_slice(&second.stdout).expect("JSON");
    for ns in ["matmul", "reduce"] {
        assert_eq!(report["namespaces"][ns]["keys_tuned"], 0, "{report:#}");
        assert_eq!(
            report["namespaces"][ns]["candidates_measured"], 0,
            "{report:#}"
        );
    }
    // b's own file holds them now, with the bucket as their origin.
    let export = test_support::cli::run(EXE, &dir.path().join("b.tcache"), &["export"]);
    let lines = stdout(&export);
    assert!(
        !lines.is_empty()
            && lines
                .lines()
                .all(|l| l.contains("\"remote\"") && l.contains("s3://")),
        "{}",
        text(&export)
    );
}

/// `count` JSON lines for keys `0..count`, each with one candidate named for `writer`.
fn lines_of(writer: usize, count: u64) -> String {
    lines_from(writer, 0..count)
}

/// Whether an import's publication was whole: it said "published ..." with nothing left over.
/// On a starved machine a command's 2 s for the shared tier can run out (it then says "could
/// not publish" or "N not published", and the local save counts), so the bucket is held to
/// holding every result of the writers whose publication was whole, and a silent overwrite of
/// any of them still fails the test.
fn published_whole(out: &Output) -> bool {
    let err = stderr(out);
    err.contains("published to the shared tier")
        && !err.contains("not published")
        && !err.contains("could not publish")
}

/// Publishes `source` (a writer's JSON lines) again from a fresh file until the publication
/// is whole: for a writer whose first one ran out of time. Only such writers are published
/// again, so a silent overwrite of a whole publication is still seen.
fn publish_again(server: &S3Server, remote: &str, dir: &Path, writer: usize, source: &Path) {
    for attempt in 0..10 {
        let file = dir.join(format!("again-{writer}-{attempt}.tcache"));
        let arg = source.to_string_lossy().into_owned();
        let out = with_bucket(server, remote, &file, &["import", &arg])
            .output()
            .expect("an import");
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        if published_whole(&out) {
            return;
        }
    }
    panic!("writer {writer} could not publish its results in 10 tries");
}

/// Waits for the writers' imports (`children`, writer `w` reading `w{w}.jsonl` in `dir`),
/// each of which must succeed; a writer whose publication was not whole is published again
/// ([`publish_again`]).
fn settle(server: &S3Server, remote: &str, dir: &Path, children: Vec<std::process::Child>) {
    let writers = children.len();
    let mut again = 0;
    for (writer, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().expect("an import");
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        if !published_whole(&out) {
            let source = dir.join(format!("w{writer}.jsonl"));
            publish_again(server, remote, dir, writer, &source);
            again += 1;
        }
    }
    eprintln!(
        "publications whole at the first try: {} of {writers}",
        writers - again
    );
}

/// The candidates (algorithm names) of each key `m` the bucket holds, pulled into a fresh
/// cache by a third machine.
fn pulled(server: &S3Server, remote: &str, dir: &Path) -> BTreeMap<u64, BTreeSet<String>> {
    let fresh = dir.join("fresh.tcache");
    let pulled = with_bucket(server, remote, &fresh, &["remote", "pull"])
        .output()
        .expect("pull");
    assert_eq!(pulled.status.code(), Some(0), "{}", text(&pulled));
    let export = test_support::cli::run(EXE, &fresh, &["export"]);
    let mut keys = BTreeMap::new();
    for line in stdout(&export).lines() {
        let entry: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        let m = entry["key"]["m"].as_u64().expect("m");
        let algos: BTreeSet<String> = entry["candidates"]
            .as_array()
            .expect("candidates")
            .iter()
            .filter_map(|c| c["algo"].as_str().map(str::to_owned))
            .collect();
        keys.insert(m, algos);
    }
    keys
}

/// JSON lines for the keys `keys`, each with one candidate named for `writer`.
fn lines_from(writer: usize, keys: std::ops::Range<u64>) -> String {
    keys.map(|m| {
            format!(
                r#"{{"scope":{{}},"namespace":"matmul","key":{{"m":{m}}},"recorded_at":1700000000000,"candidates":[{{"algo":"p{writer}","median_ns":{},"measured_at":1700000000000}}]}}"#,
                10 + writer
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

#[test]
fn eight_processes_on_two_machines_publishing_the_same_keys_lose_no_candidate() {
    let Some(server) = S3Server::start(BUCKET) else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    // 50 keys each (400 results, every key written by all eight): moto answers about 40
    // conditional writes a second under this contention on 2 cores, and every publication must
    // end within its 30 s budget for the bucket alone to show that no write overwrote another.
    const KEYS: u64 = 50;
    let children: Vec<_> = (0..8)
        .map(|writer| {
            let machine = dir.path().join(format!("machine{}.tcache", writer % 2));
            let source = dir.path().join(format!("w{writer}.jsonl"));
            std::fs::write(&source, lines_of(writer, KEYS)).expect("write lines");
            let arg = source.to_string_lossy().into_owned();
            with_bucket(
                &server,
                &format!("s3://{BUCKET}/race"),
                &machine,
                &["import", &arg],
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start an import")
        })
        .collect();
    let remote = format!("s3://{BUCKET}/race");
    settle(&server, &remote, dir.path(), children);
    // A third machine pulls the bucket: every key holds all eight writers' candidates.
    let keys = pulled(&server, &remote, dir.path());
    assert_eq!(keys.len() as u64, KEYS);
    for (m, algos) in &keys {
        assert_eq!(algos.len(), 8, "key {m}: a candidate was lost: {algos:?}");
    }
}

/// The issue's size: 200 results from each of 8 processes on 2 machines, each key written by
/// two of them (writer `w` writes keys `100w` to `100w + 199`): 1,600 results on 900 keys.
#[test]
fn eight_processes_publishing_200_results_each_on_overlapping_keys_lose_none() {
    let Some(server) = S3Server::start(BUCKET) else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let remote = format!("s3://{BUCKET}/overlap");
    let children: Vec<_> = (0..8u64)
        .map(|writer| {
            let machine = dir.path().join(format!("machine{}.tcache", writer % 2));
            let source = dir.path().join(format!("w{writer}.jsonl"));
            let lines = lines_from(writer as usize, writer * 100..writer * 100 + 200);
            std::fs::write(&source, lines).expect("write lines");
            let arg = source.to_string_lossy().into_owned();
            with_bucket(&server, &remote, &machine, &["import", &arg])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start an import")
        })
        .collect();
    settle(&server, &remote, dir.path(), children);
    let keys = pulled(&server, &remote, dir.path());
    for (m, algos) in &keys {
        let writers = if (100..800).contains(m) { 2 } else { 1 };
        assert_eq!(
            algos.len(),
            writers,
            "key {m}: a result was lost: {algos:?}"
        );
    }
    let results: usize = keys.values().map(BTreeSet::len).sum();
    assert_eq!((keys.len(), results), (900, 1600));
}

#[test]
fn a_frozen_server_costs_one_budget_and_a_missing_bucket_is_one_clear_line() {
    let Some(server) = S3Server::start(BUCKET) else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("c.tcache");
    let missing = with_bucket(&server, "s3://no-such-bucket/x", &file, &["remote", "ping"])
        .output()
        .expect("ping");
    assert_eq!(missing.status.code(), Some(1), "{}", text(&missing));
    assert!(
        stderr(&missing).contains("no such bucket"),
        "{}",
        text(&missing)
    );
    // SIGSTOP: the server accepts connections and never answers (thawed again on the way
    // out, even if an assertion fails, so nothing else is left waiting on it).
    let frozen = server.freeze();
    let started = Instant::now();
    let get = run(&server, &file, &["get", "-n", "matmul", "-k", r#"{"m":1}"#]);
    let took = started.elapsed();
    drop(frozen);
    assert_eq!(
        get.status.code(),
        Some(4),
        "a miss, not a failure: {}",
        text(&get)
    );
    assert!(
        took < Duration::from_secs(10),
        "a frozen server cost {took:?}"
    );
    // A short command that publishes (issue 49, case 10: 31 s before, the whole publish
    // budget): a few seconds, then it says what was not published and how to publish it.
    let frozen = server.freeze();
    let started = Instant::now();
    let put = run(
        &server,
        &file,
        &[
            "put",
            "-n",
            "matmul",
            "-k",
            r#"{"m":2}"#,
            "--algo",
            "x",
            "--median-ns",
            "5",
        ],
    );
    let took = started.elapsed();
    drop(frozen);
    assert_eq!(put.status.code(), Some(0), "saved locally: {}", text(&put));
    assert!(
        took < Duration::from_secs(8),
        "a frozen store cost put {took:?}"
    );
    assert!(
        stderr(&put).contains("1 results were not published")
            && stderr(&put).contains("tunecache remote push"),
        "{}",
        text(&put)
    );
}

/// `count` JSON lines for keys `0..count` with one candidate `algo` at `median` ns.
pub(crate) fn lines_with(algo: &str, median: u32, count: u64) -> String {
    (0..count)
        .map(|m| {
            format!(
                r#"{{"scope":{{}},"namespace":"matmul","key":{{"m":{m}}},"recorded_at":1700000000000,"candidates":[{{"algo":"{algo}","median_ns":{median},"measured_at":1700000000000}}]}}"#
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

#[test]
fn a_pull_cut_short_keeps_what_it_read_and_the_next_goes_on() {
    // Issue 49, case 12: 3,000 entries took 6.2 s on moto; a pull with --wait 5 downloaded for
    // 5 s and kept nothing, so repeated pulls never made progress on a slow bucket. Here each
    // pull has 1.5 s for 1,000 keys (moto answers one request at a time).
    let Some(server) = S3Server::start(BUCKET) else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let source = dir.path().join("source.tcache");
    let lines = dir.path().join("lines.jsonl");
    const N: u64 = 1000;
    std::fs::write(&lines, lines_with("x", 7, N)).expect("lines");
    let import = run(
        &server,
        &source,
        &["import", lines.to_str().expect("utf-8")],
    );
    assert!(import.status.success(), "{}", text(&import));
    let push = run(&server, &source, &["remote", "push", "--wait", "120"]);
    assert!(push.status.success(), "{}", text(&push));
    let target = dir.path().join("target.tcache");
    // Each pull has 1.5 s; on a loaded machine one may not even finish its listing (it says
    // so and keeps nothing), but none loses what an earlier one kept, and they get there.
    let (mut kept, mut cut_short) = (vec![0usize], 0);
    for _ in 0..60 {
        let pull = run(
            &server,
            &target,
            &["--json", "remote", "pull", "--wait", "1.5"],
        );
        let have = tunecache_len(&target);
        assert!(
            have >= *kept.last().expect("a count"),
            "a pull lost entries: {kept:?} then {have}"
        );
        kept.push(have);
        let Ok(r) = serde_json::from_slice::<serde_json::Value>(&pull.stdout) else {
            assert_eq!(pull.status.code(), Some(1), "{}", text(&pull));
            continue;
        };
        if r["complete"] == true || have == N as usize {
            break;
        }
        assert_eq!(pull.status.code(), Some(1), "cut short: {}", text(&pull));
        // Cut short while reading keys, or (on a loaded machine) before its listing ended:
        // either says to run it again (the second asks for a longer wait).
        assert!(
            stderr(&pull).contains("run `tunecache remote pull` again")
                || stderr(&pull).contains("run it again with a longer --wait"),
            "{}",
            text(&pull)
        );
        if have > kept[kept.len() - 2] {
            cut_short += 1;
        }
    }
    assert!(
        cut_short >= 1,
        "a pull cut short kept what it read: {kept:?}"
    );
    assert_eq!(kept.last().copied(), Some(N as usize), "{kept:?}");
}

/// The number of entries `tunecache stats --json` counts in `file`.
fn tunecache_len(file: &Path) -> usize {
    let out = command(EXE, file, &["--json", "list"])
        .output()
        .expect("list");
    stdout(&out)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count()
}
