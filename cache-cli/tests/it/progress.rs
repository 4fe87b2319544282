//! Progress on long commands: forced on (`TUNECACHE_PROGRESS=always`, stderr being a pipe
//! here), the bar appears once the work has lasted a second and its line is cleared at the
//! end, also when Ctrl-C stops an import, which then leaves the cache as it was. The import
//! reads stdin, which the test feeds slowly, so the timing is the test's, not the machine's.

use std::io::{Read, Write};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::EXE;

/// `n` JSON lines of distinct keys (`from` onwards).
fn lines(from: usize, n: usize) -> String {
    (from..from + n)
        .map(|i| {
            format!(
                r#"{{"scope":{{"device":"x"}},"namespace":"mm","key":{{"m":{i}}},"recorded_at":1700000000000,"candidates":[{{"algo":"a","median_ns":{}.0,"measured_at":1700000000000}}]}}"#,
                100 + i % 7
            ) + "\n"
        })
        .collect()
}

/// `tunecache import -` with the bar forced on, stdin and stderr piped.
fn import(file: &std::path::Path) -> Child {
    test_support::cli::command(EXE, file, &["import", "-"])
        .env("TUNECACHE_PROGRESS", "always")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tunecache import")
}

/// Reads `child`'s stderr on a thread; returns what it said, once it ends.
fn drain(child: &mut Child) -> std::thread::JoinHandle<Vec<u8>> {
    let mut err = child.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        let mut all = Vec::new();
        let _ = err.read_to_end(&mut all);
        all
    })
}

/// Feeds half the lines, waits past the bar's delay, feeds more so it draws.
fn feed_past_the_delay(child: &mut Child) -> std::process::ChildStdin {
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(lines(0, 500).as_bytes()).expect("feed");
    stdin.flush().expect("flush");
    std::thread::sleep(Duration::from_millis(1500));
    stdin.write_all(lines(500, 500).as_bytes()).expect("feed");
    stdin.flush().expect("flush");
    stdin
}

fn wait(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        assert!(start.elapsed() < limit, "the import did not end");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The bar was drawn and its last drawing was cleared: nothing of it follows the last clear.
fn drawn_then_cleared(stderr: &str) {
    assert!(stderr.contains("importing"), "no bar was drawn: {stderr:?}");
    let last_clear = stderr
        .rfind("\r\x1b[2K")
        .expect("the bar's line is cleared");
    let after = &stderr[last_clear + 4..];
    assert!(
        !after.contains("importing") && !after.contains('\r'),
        "the bar was left on screen: {after:?}"
    );
}

#[test]
fn a_forced_bar_is_drawn_then_cleared_and_the_summary_has_the_pace() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("c.tcache");
    let mut child = import(&file);
    let err = drain(&mut child);
    let stdin = feed_past_the_delay(&mut child);
    std::thread::sleep(Duration::from_millis(400));
    drop(stdin);
    let mut out = String::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut out)
        .expect("stdout");
    let status = wait(&mut child, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&err.join().expect("stderr")).into_owned();
    assert!(status.success(), "{stderr}");
    drawn_then_cleared(&stderr);
    assert!(out.contains("imported 1000 entries"), "{out}");
    // With --json, no bar even when forced; the summary has the count and the rate.
    let more = dir.path().join("more.jsonl");
    std::fs::write(&more, lines(2000, 300)).expect("lines");
    let o = test_support::cli::command(
        EXE,
        &file,
        &["--json", "import", more.to_str().expect("utf-8")],
    )
    .env("TUNECACHE_PROGRESS", "always")
    .output()
    .expect("import");
    assert!(o.status.success());
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains('\r'),
        "no bar with --json"
    );
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON summary");
    assert_eq!(summary["imported"], 300);
    has_pace(&summary, 300);
}

/// A `--json` summary's pace: `done` units, in some time, at a rate.
pub(crate) fn has_pace(summary: &serde_json::Value, done: u64) {
    assert_eq!(summary["pace"]["done"], done, "{summary:#}");
    assert!(
        summary["pace"]["seconds"].as_f64().is_some_and(|s| s > 0.0),
        "{summary:#}"
    );
    assert!(
        summary["pace"]["per_second"]
            .as_f64()
            .is_some_and(|r| r > 0.0),
        "{summary:#}"
    );
}

#[test]
fn ctrl_c_mid_import_clears_the_bar_and_leaves_the_cache_as_it_was() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("c.tcache");
    let first = dir.path().join("first.jsonl");
    std::fs::write(&first, lines(10_000, 10)).expect("lines");
    let o = crate::tunecache(&file, &["import", first.to_str().expect("utf-8")]);
    assert!(o.status.success());
    let before = std::fs::read(&file).expect("cache");
    let journal = dir.path().join("c.tcache.journal");
    let journal_before = std::fs::read(&journal).ok();
    let mut child = import(&file);
    let err = drain(&mut child);
    let mut stdin = feed_past_the_delay(&mut child);
    std::thread::sleep(Duration::from_millis(400));
    // SAFETY: signalling our own child by its pid.
    assert_eq!(
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) },
        0
    );
    // The read was restarted after the signal: more input wakes it to see the request.
    let _ = stdin.write_all(lines(1000, 100).as_bytes());
    let _ = stdin.flush();
    let status = wait(&mut child, Duration::from_secs(60));
    drop(stdin);
    let stderr = String::from_utf8_lossy(&err.join().expect("stderr")).into_owned();
    assert_eq!(status.code(), Some(130), "{stderr}");
    drawn_then_cleared(&stderr);
    assert!(stderr.contains("interrupted (Ctrl-C)"), "{stderr}");
    assert!(stderr.contains("the cache is as it was"), "{stderr}");
    assert_eq!(
        std::fs::read(&file).expect("cache"),
        before,
        "the cache changed"
    );
    assert_eq!(
        std::fs::read(&journal).ok(),
        journal_before,
        "the journal changed"
    );
    let o = crate::tunecache(&file, &["--json", "stats"]);
    let stats: serde_json::Value = serde_json::from_slice(&o.stdout).expect("stats");
    assert_eq!(stats["entries"], 10);
}
