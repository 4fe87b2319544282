//! A store that lies (issue 49, cases 7 and 8), served by test-support's hostile HTTP server:
//! a listing whose pages never end (the same token again, or new tokens with nothing new) is
//! refused at once instead of growing memory until the deadline; listed names with `.` or `..`
//! segments, which a URL would resolve to other objects, are left out with one warning and
//! never requested.

use std::process::Output;
use std::time::{Duration, Instant};

use test_support::cli::{command, stderr};
use test_support::fake_http::{FakeHttp, Reply, Request, list_page};

use crate::EXE;

fn pull(server: &FakeHttp, file: &std::path::Path) -> (Output, Duration) {
    let started = Instant::now();
    let out = command(EXE, file, &["remote", "pull", "--wait", "20"])
        .env("TUNECACHE_REMOTE", "s3://bucket/team")
        .env("AWS_ENDPOINT_URL", server.url())
        .env("AWS_ACCESS_KEY_ID", "k")
        .env("AWS_SECRET_ACCESS_KEY", "s")
        .output()
        .expect("run tunecache");
    (out, started.elapsed())
}

fn keys(from: usize, n: usize) -> Vec<String> {
    (from..from + n)
        .map(|i| format!("team/tc1:tunecache:1:{i:032x}:mm:{i:032x}"))
        .collect()
}

fn is_listing(r: &Request) -> bool {
    r.method == "GET" && r.target.contains("list-type=2")
}

fn not_found() -> Reply {
    Reply::With(
        404,
        vec![],
        b"<Error><Code>NoSuchKey</Code></Error>".to_vec(),
    )
}

#[test]
fn a_listing_that_never_ends_is_refused_at_once() {
    let dir = test_support::temp_dir();
    // The same page and token, for ever.
    let same = FakeHttp::start(|r| {
        if is_listing(r) {
            Reply::With(200, vec![], list_page(&keys(0, 1000), Some("again")))
        } else {
            not_found()
        }
    });
    // A new token each time, the same keys.
    let counter = std::sync::atomic::AtomicUsize::new(0);
    let fresh_tokens = FakeHttp::start(move |r| {
        if is_listing(r) {
            let n = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Reply::With(
                200,
                vec![],
                list_page(&keys(0, 1000), Some(&format!("t{n}"))),
            )
        } else {
            not_found()
        }
    });
    for server in [&same, &fresh_tokens] {
        let (out, took) = pull(server, &dir.path().join("c.tcache"));
        assert_ne!(out.status.code(), Some(0), "{}", stderr(&out));
        assert!(stderr(&out).contains("listing"), "{}", stderr(&out));
        assert!(
            took < Duration::from_secs(10),
            "refused at once, not at the deadline: {took:?}"
        );
        let pages = server.requests().iter().filter(|r| is_listing(r)).count();
        assert!(pages <= 4, "{pages} pages asked for");
    }
}

#[test]
fn listed_names_with_dot_segments_are_never_requested() {
    let dir = test_support::temp_dir();
    let mut listed = keys(0, 2);
    listed.push(format!("team/tc1:tunecache:1:{:032x}:mm:x/../../secret", 7));
    listed.push("team/./tc1:tunecache:1:x:mm:y".to_owned());
    let server = FakeHttp::start(move |r| {
        if is_listing(r) {
            Reply::With(200, vec![], list_page(&listed, None))
        } else {
            not_found()
        }
    });
    let (out, _) = pull(&server, &dir.path().join("c.tcache"));
    let requested: Vec<String> = server.requests().iter().map(|r| r.target.clone()).collect();
    assert!(
        requested
            .iter()
            .all(|t| !t.contains("secret") && !t.contains("/./")),
        "{requested:#?}"
    );
    assert!(
        requested.iter().filter(|t| t.contains("tc1")).count() >= 2,
        "the sound names are read: {requested:#?}"
    );
    let err = stderr(&out);
    assert_eq!(
        err.matches("`.` or `..` segment").count(),
        1,
        "one warning: {err}"
    );
}
