//! Fleet leases on a real S3 API server (moto): a lease object's operations and its form,
//! a race for one lease won once, foreign objects left alone, a dead holder's lease taken over
//! once the store's clock says it expired, and publications fenced by the lease.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cache_core::Store as _;
use cache_remote::{
    FinishError, FleetClaim, LeaseOp, LeaseReply, Read, Remote, RemoteBuilder as _,
    RemoteCache as _, RemoteOptions, S3Remote, Swap, Swapped, lease_key,
};
use test_support::s3_server::S3Server;

use crate::{entry, key, ns, registry, remote_key, scope};

const BUCKET: &str = "fleet-leases";

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(5)
}

fn other_holder(n: u64) -> Vec<u8> {
    format!("tclease1 {n:032x} pid=1 host=elsewhere").into_bytes()
}

fn remote(server: &S3Server) -> S3Remote {
    let env = server.env();
    S3Remote::open(&format!("s3://{BUCKET}/fleet"), |name| {
        env.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone())
    })
    .expect("a valid address")
}

fn cache(path: &std::path::Path, server: &S3Server, lease_ms: u64) -> cache_core::Cache {
    let options = RemoteOptions {
        budget: Duration::from_secs(2),
        lease_ttl: Some(Duration::from_millis(lease_ms)),
        ..RemoteOptions::default()
    };
    cache_core::Cache::builder(registry())
        .file(path)
        .ignore_env()
        .scope(scope())
        .save_delay(Duration::from_millis(20))
        .refresh_interval(None)
        .remote_with(Arc::new(remote(server)) as Arc<dyn Remote>, options)
        .open()
}

/// The bytes of the object at `key`, whatever they are.
fn raw(r: &S3Remote, key: &str) -> Option<Vec<u8>> {
    let read = Read {
        touch: None,
        limit: 1 << 20,
    };
    r.get_many(&[key.to_owned()], read, soon())
        .expect("read")
        .remove(0)
}

/// Replaces the object at `key` with `value`, whatever it held.
fn plant(r: &S3Remote, key: &str, value: &[u8]) {
    let now = raw(r, key);
    let swap = Swap {
        key,
        expected: now.as_deref(),
        value,
        fence: None,
    };
    assert_eq!(
        r.compare_and_set_many(&[swap], None, soon()),
        Ok(vec![Swapped::Set])
    );
}

#[test]
fn a_lease_object_is_taken_renewed_and_released_only_by_its_holder() {
    let Some(server) = S3Server::start(BUCKET) else {
        return;
    };
    let r = remote(&server);
    let k = lease_key(&remote_key(1));
    let (mine, theirs) = (other_holder(1), other_holder(2));
    let ttl = Duration::from_secs(5);
    let acquire = |v: &[u8]| r.lease(&k, LeaseOp::Acquire { value: v, ttl }, soon());
    assert_eq!(r.lease(&k, LeaseOp::Peek, soon()), Ok(LeaseReply::Absent));
    assert_eq!(acquire(&mine), Ok(LeaseReply::Done));
    let mut form = b"tcs3lease1 5000\n".to_vec();
    form.extend_from_slice(&mine);
    assert_eq!(raw(&r, &k), Some(form.clone()), "FORMAT.md's form");
    assert_eq!(acquire(&mine), Ok(LeaseReply::Done), "taken again: renewed");
    match acquire(&theirs) {
        Ok(LeaseReply::Held {
            value,
            ttl: Some(left),
        }) => {
            assert_eq!(value, mine);
            assert!(left <= ttl && left >= Duration::from_secs(2), "{left:?}");
        }
        other => panic!("{other:?}"),
    }
    for op in [
        LeaseOp::Renew {
            value: &theirs,
            ttl,
        },
        LeaseOp::Release { value: &theirs },
    ] {
        assert!(matches!(
            r.lease(&k, op, soon()),
            Ok(LeaseReply::Held { .. })
        ));
    }
    assert_eq!(raw(&r, &k), Some(form), "another token changed nothing");
    assert_eq!(
        r.lease(&k, LeaseOp::Renew { value: &mine, ttl }, soon()),
        Ok(LeaseReply::Done)
    );
    assert_eq!(
        r.lease(&k, LeaseOp::Release { value: &mine }, soon()),
        Ok(LeaseReply::Done)
    );
    assert_eq!(raw(&r, &k), Some(b"tcs3lease1 released\n".to_vec()));
    assert_eq!(r.lease(&k, LeaseOp::Peek, soon()), Ok(LeaseReply::Absent));
    assert_eq!(
        r.lease(&k, LeaseOp::Renew { value: &mine, ttl }, soon()),
        Ok(LeaseReply::Absent),
        "a released lease is not renewed"
    );
    assert_eq!(
        acquire(&theirs),
        Ok(LeaseReply::Done),
        "a released lease is free"
    );
}

#[test]
fn of_eight_clients_racing_for_one_lease_one_takes_it() {
    let Some(server) = S3Server::start(BUCKET) else {
        return;
    };
    for round in 0..3u64 {
        let k = lease_key(&remote_key(10 + round));
        let ttl = Duration::from_secs(30);
        let done: Vec<bool> = std::thread::scope(|s| {
            let racers: Vec<_> = (0..8u64)
                .map(|i| {
                    let (server, k) = (&server, &k);
                    s.spawn(move || {
                        // One client each, as separate processes would have.
                        let r = remote(server);
                        let v = other_holder(100 + i);
                        r.lease(k, LeaseOp::Acquire { value: &v, ttl }, soon())
                            .expect("answered")
                            == LeaseReply::Done
                    })
                })
                .collect();
            racers
                .into_iter()
                .map(|h| h.join().expect("racer"))
                .collect()
        });
        assert_eq!(
            done.iter().filter(|d| **d).count(),
            1,
            "round {round}: {done:?}"
        );
    }
}

#[test]
fn foreign_and_crafted_lease_objects_are_never_trusted_or_touched() {
    let Some(server) = S3Server::start(BUCKET) else {
        return;
    };
    let r = remote(&server);
    let dir = tempfile::tempdir().expect("temp dir");
    let c = cache(&dir.path().join("a.tcache"), &server, 10_000);
    let mut a_day = b"tcs3lease1 86400000\n".to_vec();
    a_day.extend_from_slice(&other_holder(8));
    let cases: [(&str, Vec<u8>); 4] = [
        (
            "an object tunecache did not write",
            b"locked by cron".to_vec(),
        ),
        ("an empty object", Vec::new()),
        ("a lease that lasts a day", a_day),
        (
            "a lease whose value is not tunecache's",
            b"tcs3lease1 60000\nsomeone".to_vec(),
        ),
    ];
    for (id, (what, bytes)) in (20..).zip(cases) {
        let k = lease_key(&remote_key(id));
        plant(&r, &k, &bytes);
        let t = Instant::now();
        let claim =
            c.remote()
                .expect("remote")
                .claim(ns(), &key(id).fingerprint(), Duration::from_secs(5));
        assert!(matches!(claim, FleetClaim::Alone(_)), "{what}: {claim:?}");
        assert!(t.elapsed() < Duration::from_secs(1), "{what}: waited");
        assert_eq!(raw(&r, &k), Some(bytes), "{what}: left as it was");
    }
}

#[test]
fn a_dead_holders_lease_expires_by_the_stores_clock_and_is_taken_over() {
    let Some(server) = S3Server::start(BUCKET) else {
        return;
    };
    let r = remote(&server);
    let k = lease_key(&remote_key(30));
    let dead = other_holder(3);
    let ttl = Duration::from_secs(1);
    assert_eq!(
        r.lease(&k, LeaseOp::Acquire { value: &dead, ttl }, soon()),
        Ok(LeaseReply::Done)
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let c = cache(&dir.path().join("a.tcache"), &server, 1_000);
    let t = Instant::now();
    let claim =
        c.remote()
            .expect("remote")
            .claim(ns(), &key(30).fingerprint(), Duration::from_secs(10));
    let took = t.elapsed();
    let FleetClaim::Lead(lease) = claim else {
        panic!("not taken over: {claim:?}");
    };
    // Expired only once the store's clock says two whole seconds passed: 1 to 3 s here.
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "{took:?}"
    );
    let h = c.remote_health().expect("remote");
    assert_eq!((h.leases, h.takeovers), (1, 1), "{h:?}");
    // Held past several of its times to live: the renewer keeps it.
    std::thread::sleep(Duration::from_millis(3500));
    assert!(!lease.lost());
    assert!(matches!(
        r.lease(&k, LeaseOp::Peek, soon()),
        Ok(LeaseReply::Held { .. })
    ));
    drop(lease);
    assert_eq!(r.lease(&k, LeaseOp::Peek, soon()), Ok(LeaseReply::Absent));
}

fn lead(c: &cache_core::Cache, id: u64) -> cache_remote::LeaseGuard {
    match c
        .remote()
        .expect("remote")
        .claim(ns(), &key(id).fingerprint(), Duration::from_secs(2))
    {
        FleetClaim::Lead(lease) => lease,
        other => panic!("key {id}: {other:?}"),
    }
}

fn on_server(reader: &cache_core::Cache, id: u64) -> Vec<String> {
    reader
        .get(ns(), &key(id).fingerprint())
        .map(|e| {
            e.candidates()
                .iter()
                .map(|c| c.id.algorithm.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// As on Redis (leases.rs), with expiry simulated by releasing the lease under its holder.
#[test]
fn a_holder_that_lost_its_s3_lease_cannot_publish_over_the_key() {
    let Some(server) = S3Server::start(BUCKET) else {
        return;
    };
    let r = remote(&server);
    let dir = tempfile::tempdir().expect("temp dir");
    let open = |name: &str| cache(&dir.path().join(name), &server, 10_000);
    let (late, taker) = (open("late.tcache"), open("taker.tcache"));
    let expire = |id: u64| plant(&r, &lease_key(&remote_key(id)), b"tcs3lease1 released\n");

    // Taken over and published by the new holder before the late one finishes.
    let late_lease = lead(&late, 90);
    expire(90);
    let taker_lease = lead(&taker, 90);
    taker.put(ns(), entry(90, "taker", 50.0));
    taker_lease
        .finish(Duration::from_secs(5))
        .expect("published");
    late.put(ns(), entry(90, "late", 10.0));
    let refused = late_lease.finish(Duration::from_secs(5));
    assert!(
        matches!(refused, Err(FinishError::Lost { .. })),
        "{refused:?}"
    );
    let reader = open("reader.tcache");
    assert_eq!(on_server(&reader, 90), ["taker"]);
    let h = late.remote_health().expect("remote");
    assert_eq!(h.rejected.get("fenced"), Some(&1), "{h:?}");

    // Taken over and still being measured: the late holder writes nothing, and the new
    // holder's lease is left as it is.
    let late_lease = lead(&late, 91);
    expire(91);
    let taker_lease = lead(&taker, 91);
    let held = raw(&r, &lease_key(&remote_key(91)));
    late.put(ns(), entry(91, "late", 10.0));
    assert!(late_lease.finish(Duration::from_secs(5)).is_err());
    assert_eq!(raw(&r, &remote_key(91)), None);
    assert_eq!(raw(&r, &lease_key(&remote_key(91))), held);
    drop(taker_lease);

    // Someone else's object put at the lease key meanwhile: fenced, and left as it is.
    let late_lease = lead(&late, 93);
    plant(&r, &lease_key(&remote_key(93)), b"someone's");
    late.put(ns(), entry(93, "late", 10.0));
    assert!(late_lease.finish(Duration::from_secs(5)).is_err());
    assert_eq!(raw(&r, &remote_key(93)), None);
    assert_eq!(
        raw(&r, &lease_key(&remote_key(93))),
        Some(b"someone's".to_vec())
    );

    // Expired, but nobody took the key: nothing was measured meanwhile, so it is published.
    let late_lease = lead(&late, 92);
    expire(92);
    late.put(ns(), entry(92, "late", 10.0));
    late_lease
        .finish(Duration::from_secs(5))
        .expect("published");
    assert_eq!(on_server(&reader, 92), ["late"]);

    // A holder's own publication releases its lease.
    let lease = lead(&late, 95);
    late.put(ns(), entry(95, "tiled", 20.0));
    lease.finish(Duration::from_secs(5)).expect("published");
    assert_eq!(
        raw(&r, &lease_key(&remote_key(95))),
        Some(b"tcs3lease1 released\n".to_vec())
    );
    assert_eq!(on_server(&reader, 95), ["tiled"]);
}
