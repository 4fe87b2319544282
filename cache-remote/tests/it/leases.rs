//! Fleet leases against a real `redis-server`: the script's answers, foreign and crafted lease
//! keys left alone, a dead holder's lease taken over after it expires, a follower taking the
//! leader's published entry, a frozen server, and a cluster (lease and entry on one slot).

use std::sync::Arc;
use std::time::{Duration, Instant};

use cache_core::{FleetClaim, Store};
use cache_remote::{
    LeaseOp, LeaseReply, RedisRemote, Remote, RemoteCache as _, RemoteOptions, lease_key,
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

#[test]
fn the_lease_script_compares_the_whole_value_before_any_change() {
    let Some(server) = Server::start() else {
        return;
    };
    let r = RedisRemote::open(&server.url()).expect("address");
    let k = lease_key(&remote_key(1));
    let (mine, theirs) = (other_holder(1), other_holder(2));
    let ttl = Duration::from_secs(5);
    let acquire = |v: &[u8]| r.lease(&k, LeaseOp::Acquire { value: v, ttl }, soon());
    assert_eq!(r.lease(&k, LeaseOp::Peek, soon()), Ok(LeaseReply::Absent));
    assert_eq!(acquire(&mine), Ok(LeaseReply::Done));
    assert_eq!(
        acquire(&mine),
        Ok(LeaseReply::Done),
        "acquiring one's own lease renews it"
    );
    match acquire(&theirs) {
        Ok(LeaseReply::Held {
            value,
            ttl: Some(left),
        }) => {
            assert_eq!(value, mine);
            assert!(left <= ttl && left > Duration::from_secs(4), "{left:?}");
        }
        other => panic!("{other:?}"),
    }
    // Another token can neither renew nor release it.
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
    assert_eq!(server.get_raw(&k), Some(mine.clone()));
    assert_eq!(
        r.lease(&k, LeaseOp::Renew { value: &mine, ttl }, soon()),
        Ok(LeaseReply::Done)
    );
    assert_eq!(
        r.lease(&k, LeaseOp::Release { value: &mine }, soon()),
        Ok(LeaseReply::Done)
    );
    assert_eq!(server.get_raw(&k), None);
    assert_eq!(
        r.lease(&k, LeaseOp::Renew { value: &mine, ttl }, soon()),
        Ok(LeaseReply::Absent)
    );
    assert_eq!(
        r.lease(&k, LeaseOp::Release { value: &mine }, soon()),
        Ok(LeaseReply::Absent)
    );
}

#[test]
fn foreign_and_crafted_lease_keys_are_never_trusted_or_touched() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let c = cache(&dir.path().join("a.tcache"), &server.url(), options(10_000));
    let wait = Duration::from_secs(5);
    let cases: [(&str, Plant<'_>); 4] = [
        ("a list", &|k| {
            server.cmd(&["RPUSH", k, "someone's", "data"]);
        }),
        ("a string tunecache did not write", &|k| {
            server.cmd(&["SET", k, "locked by cron", "PX", "60000"]);
        }),
        ("a forged lease that never expires", &|k| {
            server.set_raw(k, &other_holder(9));
        }),
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
        let claim = c.fleet_claim(ns(), &key(id).fingerprint(), wait);
        assert!(matches!(claim, FleetClaim::Alone(_)), "{what}: {claim:?}");
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "{what}: not waited for"
        );
        assert_eq!(server.cmd(&["DUMP", &k]), before, "{what}: left as it was");
    }
}

#[test]
fn a_dead_holders_lease_expires_and_another_process_takes_the_key_over() {
    let Some(server) = Server::start() else {
        return;
    };
    let r = RedisRemote::open(&server.url()).expect("address");
    let k = lease_key(&remote_key(20));
    let ttl = Duration::from_millis(600);
    let dead = other_holder(3);
    assert_eq!(
        r.lease(&k, LeaseOp::Acquire { value: &dead, ttl }, soon()),
        Ok(LeaseReply::Done)
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let c = cache(&dir.path().join("a.tcache"), &server.url(), options(600));
    let t = Instant::now();
    let claim = c.fleet_claim(ns(), &key(20).fingerprint(), Duration::from_secs(10));
    let took = t.elapsed();
    let FleetClaim::Lead(lease) = claim else {
        panic!("not taken over: {claim:?}");
    };
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(3),
        "{took:?}"
    );
    let h = c.remote_health().expect("remote");
    assert_eq!((h.leases, h.lease_waits, h.takeovers), (1, 1, 1), "{h:?}");
    // Held past several of its times to live: the renewer keeps it.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!lease.lost());
    assert!(matches!(
        r.lease(&k, LeaseOp::Peek, soon()),
        Ok(LeaseReply::Held { .. })
    ));
    drop(lease);
    assert_eq!(
        r.lease(&k, LeaseOp::Peek, soon()),
        Ok(LeaseReply::Absent),
        "released"
    );
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
    let FleetClaim::Lead(lease) = leader.fleet_claim(ns(), &fp, Duration::from_secs(1)) else {
        panic!("the first claim leads");
    };
    let measuring = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        leader.put(ns(), entry(30, "tiled", 30.0));
        lease.finish(Duration::from_secs(2)).expect("published");
        leader
    });
    let t = Instant::now();
    let claim = follower.fleet_claim(ns(), &fp, Duration::from_secs(10));
    assert!(matches!(claim, FleetClaim::Published { .. }), "{claim:?}");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let got = follower
        .get(ns(), &fp)
        .expect("the published entry is in the follower's cache");
    assert_eq!(got.best().expect("measured").id.algorithm, "tiled");
    let _leader = measuring.join().expect("leader");
    assert_eq!(follower.remote_health().expect("remote").lease_waits, 1);
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
        let claim = c.fleet_claim(ns(), &key(id).fingerprint(), Duration::from_secs(30));
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
    assert_eq!(
        remote.lease(&k, LeaseOp::Release { value: &v }, soon()),
        Ok(LeaseReply::Done)
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
            c.fleet_claim(ns(), &key(id).fingerprint(), Duration::from_secs(1))
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
