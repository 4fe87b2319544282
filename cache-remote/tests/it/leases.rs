//! Fleet leases against a real `redis-server`, beyond the conformance suite every store runs
//! (conformance/cases.rs): a lease's form, keys of other types and times to live left alone,
//! a follower taking the leader's published entry, a leader renewing past the wait, a frozen
//! server, and a cluster (lease and entry on one slot).

#[cfg(feature = "cluster")]
use std::sync::Arc;
use std::time::{Duration, Instant};

use cache_core::Store;
use cache_remote::{
    Alone, FleetClaim, LeaseOp, LeaseReply, RedisRemote, Remote, RemoteCache as _, RemoteOptions,
    lease_key,
};

use crate::{cache, entry, key, ns, remote_key};
use test_support::redis_server::Server;

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(2)
}

/// A lease value as tunecache writes it, of a holder that is not this process.
fn other_holder(n: u64) -> Vec<u8> {
    format!("tclease1 {n:032x} pid=1 host=elsewhere").into_bytes()
}

/// Puts something at a lease key.
type Plant<'a> = &'a dyn Fn(&str);

fn options(lease_ms: u64) -> RemoteOptions {
    RemoteOptions {
        budget: Duration::from_millis(200),
        lease_ttl: Some(Duration::from_millis(lease_ms)),
        ..RemoteOptions::default()
    }
}

/// What the lease operations do is the conformance suite's (conformance/cases.rs); what a
/// lease is on Redis is FORMAT.md's: the holder's value itself, with the lease's time to live.
#[test]
fn a_redis_lease_is_the_holders_value_with_its_time_to_live() {
    let Some(server) = Server::start() else {
        return;
    };
    let r = RedisRemote::open(&server.url()).expect("address");
    let k = lease_key(&remote_key(1));
    let mine = other_holder(1);
    let ttl = Duration::from_secs(5);
    assert_eq!(
        r.lease(&k, LeaseOp::Acquire { value: &mine, ttl }, soon()),
        Ok(LeaseReply::Done)
    );
    assert_eq!(server.get_raw(&k), Some(mine.clone()));
    match server.cmd(&["PTTL", &k]) {
        redis::Value::Int(ms) => assert!((4_000..=5_000).contains(&ms), "{ms}"),
        other => panic!("PTTL answered {other:?}"),
    }
    assert_eq!(
        r.lease(&k, LeaseOp::Release { value: &mine }, soon()),
        Ok(LeaseReply::Done)
    );
    assert_eq!(server.get_raw(&k), None, "a released lease is deleted");
}

#[test]
fn foreign_and_crafted_lease_keys_are_never_trusted_or_touched() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let c = cache(&dir.path().join("a.tcache"), &server.url(), options(10_000));
    let wait = Duration::from_secs(5);
    // Values of any store are the conformance suite's (conformance/cases.rs); these are Redis's.
    let cases: [(&str, Plant<'_>); 3] = [
        ("a list", &|k| {
            server.cmd(&["RPUSH", k, "someone's", "data"]);
        }),
        (
            "a string tunecache did not write, with a time to live",
            &|k| {
                server.cmd(&["SET", k, "locked by cron", "PX", "60000"]);
            },
        ),
        ("a lease that expires in a day", &|k| {
            server.cmd(&[
                "SET",
                k,
                &String::from_utf8(other_holder(8)).expect("text"),
                "EX",
                "86400",
            ]);
        }),
    ];
    for (id, (what, plant)) in (10..).zip(cases) {
        let k = lease_key(&remote_key(id));
        plant(&k);
        let before = server.cmd(&["DUMP", &k]);
        let t = Instant::now();
        let claim = c
            .remote()
            .expect("remote")
            .claim(ns(), &key(id).fingerprint(), wait);
        assert!(matches!(claim, FleetClaim::Alone(_)), "{what}: {claim:?}");
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "{what}: not waited for"
        );
        assert_eq!(server.cmd(&["DUMP", &k]), before, "{what}: left as it was");
    }
}

#[test]
fn a_process_waiting_on_a_lease_takes_the_leaders_published_entry() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let leader = cache(&dir.path().join("a.tcache"), &server.url(), options(5_000));
    let follower = cache(&dir.path().join("b.tcache"), &server.url(), options(5_000));
    let fp = key(30).fingerprint();
    let FleetClaim::Lead(lease) =
        leader
            .remote()
            .expect("remote")
            .claim(ns(), &fp, Duration::from_secs(1))
    else {
        panic!("the first claim leads");
    };
    let measuring = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        leader.put(ns(), entry(30, "tiled", 30.0));
        lease.finish(Duration::from_secs(2)).expect("published");
        leader
    });
    let t = Instant::now();
    let claim = follower
        .remote()
        .expect("remote")
        .claim(ns(), &fp, Duration::from_secs(10));
    assert!(matches!(claim, FleetClaim::Published { .. }), "{claim:?}");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let got = follower
        .get(ns(), &fp)
        .expect("the published entry is in the follower's cache");
    assert_eq!(got.best().expect("measured").id.algorithm, "tiled");
    let _leader = measuring.join().expect("leader");
    assert_eq!(follower.remote_health().expect("remote").lease_waits, 1);
}

/// Hardening V, case 15: under CPU contention a waiter gave up on a leader that was alive and
/// renewing its lease, and measured the key a second time. A lease seen renewing is a leader
/// alive: it is waited on past the wait asked for (up to the fleet's bound).
#[test]
fn a_leader_that_renews_its_lease_is_waited_on_past_the_wait() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    // A lease of 600 ms, renewed every 200 ms; the follower asks to wait 300 ms only.
    let leader = cache(&dir.path().join("a.tcache"), &server.url(), options(600));
    let follower = cache(&dir.path().join("b.tcache"), &server.url(), options(600));
    let fp = key(31).fingerprint();
    let FleetClaim::Lead(lease) =
        leader
            .remote()
            .expect("remote")
            .claim(ns(), &fp, Duration::from_secs(1))
    else {
        panic!("the first claim leads");
    };
    let measuring = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(2_000));
        leader.put(ns(), entry(31, "tiled", 31.0));
        lease.finish(Duration::from_secs(2)).expect("published");
        leader
    });
    let t = Instant::now();
    let claim = follower
        .remote()
        .expect("remote")
        .claim(ns(), &fp, Duration::from_millis(300));
    assert!(
        matches!(claim, FleetClaim::Published { .. }),
        "a living leader is not given up on: {claim:?} after {:?}",
        t.elapsed()
    );
    assert!(
        t.elapsed() >= Duration::from_millis(1_500),
        "{:?}",
        t.elapsed()
    );
    let _leader = measuring.join().expect("leader");
}

#[test]
fn a_frozen_server_costs_a_claim_its_budget_and_nothing_more() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let c = cache(&dir.path().join("a.tcache"), &server.url(), options(5_000));
    assert!(c.remote_health().is_some());
    server.signal(libc::SIGSTOP);
    let t = Instant::now();
    for id in 40..50 {
        let claim = c.remote().expect("remote").claim(
            ns(),
            &key(id).fingerprint(),
            Duration::from_secs(30),
        );
        assert!(matches!(claim, FleetClaim::Alone(_)), "{claim:?}");
    }
    let took = t.elapsed();
    server.signal(libc::SIGCONT);
    // One budget (200 ms) for the call that found it frozen; the breaker skips the rest.
    assert!(
        took < Duration::from_millis(600),
        "10 claims on a frozen server took {took:?}"
    );
}

#[cfg(feature = "cluster")]
#[test]
fn on_a_cluster_the_lease_and_its_entry_share_a_slot() {
    let Some(cluster) = test_support::redis_server::Cluster::start() else {
        return;
    };
    let entry_key = remote_key(60);
    let slot = |k: &str| cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", k]);
    assert_eq!(slot(&entry_key), slot(&lease_key(&entry_key)));
    let nodes: Vec<String> = cluster.nodes.iter().map(|n| n.url()).collect();
    let urls: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let remote: Arc<dyn Remote> =
        Arc::new(cache_remote::RedisClusterRemote::open(&urls).expect("addresses"));
    let k = lease_key(&entry_key);
    let v = other_holder(4);
    let ttl = Duration::from_secs(5);
    assert_eq!(
        remote.lease(&k, LeaseOp::Acquire { value: &v, ttl }, soon()),
        Ok(LeaseReply::Done)
    );
    assert!(matches!(
        remote.lease(
            &k,
            LeaseOp::Acquire {
                value: &other_holder(5),
                ttl
            },
            soon()
        ),
        Ok(LeaseReply::Held { .. })
    ));
    // A write fenced by the lease runs on the entry's node: the holder's is set and releases
    // the lease; another token's is refused.
    let fenced = |value: &[u8], lease_value: &[u8], expected: Option<&[u8]>| {
        let swap = cache_remote::Swap {
            key: &entry_key,
            expected,
            value,
            fence: Some(cache_remote::Fence {
                lease: &k,
                value: lease_value,
                unchanged: false,
                release: true,
            }),
        };
        remote.compare_and_set_many(&[swap], None, soon())
    };
    assert_eq!(
        fenced(b"x", &other_holder(5), None),
        Ok(vec![cache_remote::Swapped::Fenced])
    );
    assert_eq!(fenced(b"y", &v, None), Ok(vec![cache_remote::Swapped::Set]));
    assert_eq!(
        remote.lease(&k, LeaseOp::Peek, soon()),
        Ok(LeaseReply::Absent),
        "released by the write"
    );
}

/// Seen in the benchmark: a lease given back right after it was taken cost 3.3 s (a third of
/// its life), because the renewer thread waited before looking at the stop flag.
#[test]
fn a_lease_given_back_at_once_is_released_at_once() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let c = cache(&dir.path().join("a.tcache"), &server.url(), options(10_000));
    for id in 70..80 {
        let FleetClaim::Lead(lease) =
            c.remote()
                .expect("remote")
                .claim(ns(), &key(id).fingerprint(), Duration::from_secs(1))
        else {
            panic!("leads");
        };
        let t = Instant::now();
        drop(lease);
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "released in {:?}",
            t.elapsed()
        );
        assert_eq!(server.get_raw(&lease_key(&remote_key(id))), None);
    }
}

/// Takes the lease of key `id` in `c`, which must lead.
fn lead(c: &cache_core::Cache, id: u64) -> cache_remote::LeaseGuard {
    match c
        .remote()
        .expect("remote")
        .claim(ns(), &key(id).fingerprint(), Duration::from_secs(1))
    {
        FleetClaim::Lead(lease) => lease,
        other => panic!("key {id}: {other:?}"),
    }
}

/// The rest of a lost lease is the conformance suite's (conformance/cases.rs): on Redis, a
/// value of another type put at the lease key meanwhile fences the publication, and the list
/// is left as it is.
#[test]
fn a_list_at_a_held_lease_key_fences_the_publication_and_is_left_alone() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let late = cache(
        &dir.path().join("late.tcache"),
        &server.url(),
        options(10_000),
    );
    let late_lease = lead(&late, 93);
    let lk = lease_key(&remote_key(93));
    server.cmd(&["DEL", &lk]);
    server.cmd(&["RPUSH", &lk, "someone's", "list"]);
    late.put(ns(), entry(93, "late", 10.0));
    assert!(late_lease.finish(Duration::from_secs(2)).is_err());
    assert_eq!(server.get_raw(&remote_key(93)), None);
    assert_eq!(
        server.cmd(&["LLEN", &lk]),
        redis::Value::Int(2),
        "their list is untouched"
    );
}

/// Scripts the server has run (`EVAL`: compare-and-set and lease operations alike).
fn evals(server: &Server) -> u64 {
    let info: String =
        redis::from_redis_value(server.cmd(&["INFO", "commandstats"])).expect("text");
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_eval:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The holder's publication deletes its lease in the same step: finishing a measured key
/// runs one script (the fenced write), not a write and then a release.
#[test]
fn the_publication_that_writes_a_leased_key_releases_its_lease() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let c = cache(&dir.path().join("a.tcache"), &server.url(), options(10_000));
    let lk = lease_key(&remote_key(95));
    let lease = lead(&c, 95);
    c.put(ns(), entry(95, "tiled", 20.0));
    assert!(server.get_raw(&lk).is_some());
    let before = evals(&server);
    lease.finish(Duration::from_secs(2)).expect("published");
    assert_eq!(
        evals(&server) - before,
        1,
        "one script: the write that releases"
    );
    assert_eq!(server.get_raw(&lk), None);
    assert!(server.get_raw(&remote_key(95)).is_some());
    // A lease given back with nothing to publish is released by its own call.
    let lease = lead(&c, 96);
    drop(lease);
    assert_eq!(server.get_raw(&lease_key(&remote_key(96))), None);
}

/// Hardening IV, case 3: leases in tunecache's own format with a long time to live (left by a
/// holder that died with a long lease, or written by anyone) made each key wait the whole wait,
/// one after another (590 s for a tune of 27 keys). Hardening V, case 9: the fix remembered the
/// holder's text, which the lease's writer chooses: one lease per key naming another holder
/// each still cost a whole wait per key. Leases never seen renewing now cost a process one
/// wait in all, whatever holders they name: the second key is measured here at once.
#[test]
fn leases_never_renewed_cost_one_wait_in_all_whatever_holders_they_name() {
    let Some(server) = Server::start() else {
        return;
    };
    let r = RedisRemote::open(&server.url()).expect("address");
    let ttl = Duration::from_secs(300);
    for id in [30, 31, 32] {
        // Each lease names another holder: the holder's text is the squatter's to choose.
        let squatter = format!("tclease1 {id:032x} pid={id} host=forged-{id}").into_bytes();
        let k = lease_key(&remote_key(id));
        assert_eq!(
            r.lease(
                &k,
                LeaseOp::Acquire {
                    value: &squatter,
                    ttl
                },
                soon()
            ),
            Ok(LeaseReply::Done)
        );
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let c = cache(
        &dir.path().join("a.tcache"),
        &server.url(),
        options(300_000),
    );
    let wait = Duration::from_millis(800);
    let t = Instant::now();
    let first = c
        .remote()
        .expect("remote")
        .claim(ns(), &key(30).fingerprint(), wait);
    assert!(t.elapsed() >= wait, "the first key is waited on");
    assert!(
        matches!(&first, FleetClaim::Alone(Alone::WaitedOut { .. })),
        "{first:?}"
    );
    for id in [31, 32] {
        let t = Instant::now();
        let claim = c
            .remote()
            .expect("remote")
            .claim(ns(), &key(id).fingerprint(), wait);
        assert!(
            matches!(&claim, FleetClaim::Alone(Alone::Stalled { .. })),
            "{claim:?}"
        );
        assert!(
            t.elapsed() < wait,
            "key {id} is not waited on: {:?}",
            t.elapsed()
        );
    }
}
