//! Real processes: two asking for one key measure it once; a tune killed mid-way resumes;
//! the CPU backend end to end, cold then warm.

use std::io::BufRead;

use crate::support::{as_map, messages, spawn};

#[test]
fn two_processes_asking_for_one_key_at_once_measure_it_once() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("c.tcache");
    // Candidates slow enough (~0.1-0.5 s to tune) that both processes ask while it is tuned.
    let mut a = spawn("tune-one", &path, &["30000"]);
    let mut b = spawn("tune-one", &path, &["30000"]);
    let (ma, mb) = (as_map(&messages(&mut a)), as_map(&messages(&mut b)));
    assert!(a.0.wait().expect("a").success() && b.0.wait().expect("b").success());
    let measured: u32 =
        ma["measured"].parse::<u32>().expect("n") + mb["measured"].parse::<u32>().expect("n");
    assert_eq!(
        measured, 3,
        "three candidates measured once in all, not per process: {ma:?} {mb:?}"
    );
    assert_eq!(ma["winner"], "a");
    assert_eq!(mb["winner"], "a");
    assert_eq!(
        (ma["provisional"].as_str(), mb["provisional"].as_str()),
        ("false", "false"),
        "the waiter read the result"
    );
}

/// A tune killed mid-way resumes where it stopped: the keys finished before the kill are not
/// measured again. (A key's candidates are measured together, interleaved, and recorded in
/// one write, so the key in flight at the kill is measured again whole.)
#[test]
fn a_tune_killed_mid_way_resumes_where_it_stopped() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("c.tcache");
    let mut first = spawn("tune-slow", &path, &[]);
    let out = first.0.stdout.take().expect("stdout");
    for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
        if line.contains("TC> tuned 2 ") {
            break;
        }
    }
    first.0.kill().expect("SIGKILL mid-tune");
    first.0.wait().expect("reap");

    let mut second = spawn("tune-slow", &path, &[]);
    let lines = messages(&mut second);
    assert!(second.0.wait().expect("wait").success());
    let tuned: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("tuning "))
        .collect();
    for done in [r#"{"size":1}"#, r#"{"size":2}"#] {
        assert!(
            !tuned.contains(&done),
            "{done} was durable before the kill: {lines:?}"
        );
    }
    for left in [r#"{"size":4}"#, r#"{"size":5}"#, r#"{"size":6}"#] {
        assert!(tuned.contains(&left), "{left} is tuned now: {lines:?}");
    }
    for size in 1..=6 {
        assert!(
            lines.contains(&format!("tuned {size} a")),
            "key {size} chose the fastest: {lines:?}"
        );
    }
}

#[test]
fn the_cpu_backend_tunes_cold_and_a_second_process_only_hits() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("c.tcache");
    let mut cold = spawn("cpu-workload", &path, &[]);
    let cold_lines = messages(&mut cold);
    assert!(cold.0.wait().expect("cold").success());
    let c = as_map(&cold_lines);
    assert!(c["measured"].parse::<u32>().expect("n") > 0);
    assert_eq!(
        c["tuned"], "4",
        "four distinct buckets (two matmul, two reduce): {cold_lines:?}"
    );
    assert_eq!(c["hits"], "2", "the repeated calls hit in the same process");

    let mut warm = spawn("cpu-workload", &path, &[]);
    let warm_lines = messages(&mut warm);
    assert!(warm.0.wait().expect("warm").success());
    let w = as_map(&warm_lines);
    assert_eq!(
        w["measured"], "0",
        "the second process measures nothing: {warm_lines:?}"
    );
    assert_eq!(w["reused"], "4");
    assert_eq!(w["tuned"], "0");
    let winners = |lines: &[String]| {
        lines
            .iter()
            .filter(|l| l.starts_with("winner "))
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        winners(&cold_lines),
        winners(&warm_lines),
        "the same winners"
    );
}
