//! An S3 tier's batches on a bucket that answers each request slowly (a fake S3 endpoint that
//! waits before answering, every object absent): up to `TUNECACHE_REMOTE_PARALLEL` requests
//! (default 64) in flight at once and never more, and a prefetch of 1,000 keys that takes
//! many rounds of requests is given the time they need, so it completes and the tier stays up
//! (it used to time out at 8 requests at once, and the breaker then kept the bucket off); and a
//! reply that stalls in the middle of a value costs one request's answer time (5 s), not the
//! call's whole deadline.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cache_core::Cache;
use cache_remote::{BreakerState, Read, Remote, RemoteBuilder as _, RemoteCache as _, S3Remote};
use test_support::fake_http::{FakeHttp, Reply};

use crate::{key, ns, registry, remote_key, scope};

/// A bucket answering every request with 404 after `latency`, counting requests in flight.
struct SlowBucket {
    server: FakeHttp,
    in_flight: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

impl SlowBucket {
    fn start(latency: Duration) -> SlowBucket {
        let in_flight = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let server = FakeHttp::start({
            let (in_flight, most) = (Arc::clone(&in_flight), Arc::clone(&most));
            move |_| {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(latency);
                in_flight.fetch_sub(1, Ordering::SeqCst);
                Reply::With(
                    404,
                    Vec::new(),
                    b"<Error><Code>NoSuchKey</Code></Error>".to_vec(),
                )
            }
        });
        SlowBucket {
            server,
            in_flight,
            most,
        }
    }

    fn remote(&self, parallel: Option<&str>) -> S3Remote {
        let url = self.server.url();
        S3Remote::open("s3://slow-bucket/p", |name| match name {
            "AWS_ENDPOINT_URL" => Some(url.clone()),
            "AWS_ACCESS_KEY_ID" | "AWS_SECRET_ACCESS_KEY" => Some("testing".to_owned()),
            "TUNECACHE_REMOTE_PARALLEL" => parallel.map(str::to_owned),
            _ => None,
        })
        .expect("a valid address")
    }

    fn most(&self) -> usize {
        self.most.swap(0, Ordering::SeqCst)
    }
}

#[test]
fn a_batch_has_as_many_requests_in_flight_as_the_setting_allows_and_no_more() {
    let bucket = SlowBucket::start(Duration::from_millis(60));
    let keys: Vec<String> = (0..300).map(remote_key).collect();
    let read = Read {
        touch: None,
        limit: 1 << 16,
    };
    for (setting, most) in [(None, 64), (Some("4"), 4), (Some("100"), 100)] {
        let r = bucket.remote(setting);
        let t = Instant::now();
        let got = r
            .get_many(&keys, read, Instant::now() + Duration::from_secs(60))
            .expect("read");
        assert!(got.iter().all(Option::is_none));
        let seen = bucket.most();
        assert!(seen <= most, "{setting:?}: {seen} at once");
        assert!(seen * 2 >= most, "{setting:?}: only {seen} at once");
        println!(
            "{setting:?}: {seen} at once, 300 reads in {:?}",
            t.elapsed()
        );
    }
    assert_eq!(bucket.in_flight.load(Ordering::SeqCst), 0);
    let bad = S3Remote::open("s3://slow-bucket/p", |name| {
        (name == "TUNECACHE_REMOTE_PARALLEL").then(|| "0".to_owned())
    });
    let e = bad.expect_err("0 requests at once").to_string();
    assert!(e.contains("TUNECACHE_REMOTE_PARALLEL"), "{e}");
}

#[test]
fn a_large_prefetch_on_a_slow_bucket_completes_and_the_tier_stays_up() {
    let bucket = SlowBucket::start(Duration::from_millis(100));
    let dir = tempfile::tempdir().expect("temp dir");
    let remote = Arc::new(bucket.remote(None));
    let options = remote.default_options();
    assert_eq!(options.budget, Duration::from_secs(1), "S3's read budget");
    let c = Cache::builder(registry())
        .file(dir.path().join("a.tcache"))
        .ignore_env()
        .scope(scope())
        .refresh_interval(None)
        .remote_with(remote as Arc<dyn Remote>, options)
        .open();
    let fps: Vec<_> = (0..1000).map(|i| key(i).fingerprint()).collect();
    let t = Instant::now();
    assert_eq!(c.prefetch(ns(), &fps), 0, "the bucket has none of them");
    let took = t.elapsed();
    let h = c.remote_health().expect("remote");
    // 1,000 requests, 64 at once, 100 ms each: 16 rounds, 1.6 s against a budget of 1 s a
    // round; at 8 at once the 1 s budget ran out after 80 keys.
    assert_eq!((h.timeouts, h.errors), (0, 0), "{h:?} after {took:?}");
    assert_eq!(h.breaker, BreakerState::Closed, "{h:?}");
    assert_eq!(h.misses, 1000, "{h:?}");
    assert!(took < Duration::from_secs(8), "{took:?}");
    println!("1,000-key prefetch, 100 ms a request: {took:?}");
}

#[test]
fn a_reply_that_stalls_mid_value_costs_one_answer_time_not_the_deadline() {
    use std::io::{BufRead as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let server = std::thread::spawn({
        let stop = Arc::clone(&stop);
        move || {
            listener.set_nonblocking(true).expect("non-blocking");
            let mut held = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let Ok((stream, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                stream.set_nonblocking(false).expect("blocking");
                let mut reader = std::io::BufReader::new(stream.try_clone().expect("clone"));
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let mut out = stream;
                let _ = out.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nabc");
                held.push(out);
            }
        }
    });
    let url = format!("http://127.0.0.1:{port}");
    let r = S3Remote::open("s3://stalling/p", |name| match name {
        "AWS_ENDPOINT_URL" => Some(url.clone()),
        "AWS_ACCESS_KEY_ID" | "AWS_SECRET_ACCESS_KEY" => Some("testing".to_owned()),
        _ => None,
    })
    .expect("address");
    let read = Read {
        touch: None,
        limit: 1 << 16,
    };
    let t = Instant::now();
    let got = r.get_many(
        &[remote_key(1)],
        read,
        Instant::now() + Duration::from_secs(60),
    );
    let took = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    server.join().expect("server");
    assert!(got.is_err(), "{got:?}");
    assert!(took < Duration::from_secs(12), "{took:?}");
    println!("a value stalled mid-reply: {got:?} after {took:?}");
}

/// A publication cut short by a bucket that never answers counts the keys of the round still
/// running as not published (it said "0 entries not published" while all of them were).
#[test]
fn a_publication_cut_short_counts_the_round_still_running() {
    let silent = FakeHttp::start(|_| Reply::Silence);
    let url = silent.url();
    let remote = S3Remote::open("s3://silent-bucket/p", |name| match name {
        "AWS_ENDPOINT_URL" => Some(url.clone()),
        "AWS_ACCESS_KEY_ID" | "AWS_SECRET_ACCESS_KEY" => Some("testing".to_owned()),
        _ => None,
    })
    .expect("address");
    let options = remote.default_options();
    let dir = tempfile::tempdir().expect("temp dir");
    let c = Cache::builder(registry())
        .file(dir.path().join("a.tcache"))
        .ignore_env()
        .scope(scope())
        .refresh_interval(None)
        .remote_with(Arc::new(remote) as Arc<dyn Remote>, options)
        .open();
    for id in 0..6 {
        cache_core::Store::put(&c, ns(), crate::entry(id, "tiled", 10.0));
    }
    let got = c.publish_within(Duration::from_millis(700));
    let said = format!("{got:?}");
    assert!(said.contains("6 entries not published"), "{said}");
}
