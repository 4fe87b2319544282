//! Two caches (two files, standing in for two machines) sharing one real server.

use std::time::Duration;

use cache_core::Store;
use cache_core::cache_format::{Origin, now_millis};
use cache_remote::{RemoteCache as _, RemoteMode, RemoteOptions, encode_value};

use crate::{cache, entry, key, ns, registry, remote_key, scope};
use test_support::redis_server::Server;

#[test]
fn a_result_recorded_by_one_is_a_hit_for_the_other_and_both_files_converge() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let a = cache(
        &dir.path().join("a.tcache"),
        &server.url(),
        RemoteOptions::default(),
    );
    let b = cache(
        &dir.path().join("b.tcache"),
        &server.url(),
        RemoteOptions::default(),
    );
    // The same key measured differently on each machine, published in turn.
    a.put(ns(), entry(1, "tiled", 500.0));
    b.put(ns(), entry(1, "naive", 400.0));
    a.put(ns(), entry(2, "tiled", 100.0));
    a.publish_within(Duration::from_secs(10))
        .expect("a published");
    b.publish_within(Duration::from_secs(10))
        .expect("b published");
    // Key 2: one miss on b, then a hit from the server, origin remote.
    let hit = b.lookup(ns(), &key(2)).expect("read through");
    match hit.origin() {
        Origin::Remote(from) => assert!(from.contains(&server.port.to_string()), "{from}"),
        other => panic!("origin {other}"),
    }
    // Key 1: the server holds the fold of both measurements.
    let stored = server.get_raw(&remote_key(1)).expect("key 1 on the server");
    let mut fold = entry(1, "tiled", 500.0);
    fold.merge(entry(1, "naive", 400.0));
    let snap =
        cache_core::cache_format::read_snapshot(&stored, &Default::default()).expect("a snapshot");
    let data = cache_core::cache_migrate::upgrade(
        &registry(),
        snap.format,
        &snap.header.app,
        snap.header.schema,
        snap.payload_bytes(),
        &Default::default(),
    )
    .expect("current")
    .data;
    let (_, _, on_server) = data.entries().next().expect("one entry");
    let names = |e: &cache_core::cache_format::Entry| {
        e.candidates()
            .iter()
            .map(|c| c.id.algorithm.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(names(on_server), ["naive", "tiled"], "the join of both");
    let h = b.remote_health().expect("remote");
    assert_eq!(h.hits, 1, "{h:?}");
    assert!(h.published >= 1, "{h:?}");
    assert_eq!(h.timeouts + h.errors, 0, "{h:?}");
}

#[test]
fn a_local_hit_sends_no_command_and_read_mode_no_write() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    server.set_raw(
        &remote_key(5),
        &encode_value(&registry(), &scope(), "matmul", &entry(5, "tiled", 10.0)),
    );
    let ro = cache(
        &dir.path().join("a.tcache"),
        &server.url(),
        RemoteOptions {
            mode: RemoteMode::Read,
            ..RemoteOptions::default()
        },
    );
    ro.put(ns(), entry(6, "naive", 10.0));
    server.cmd(&["CONFIG", "RESETSTAT"]);
    for _ in 0..1000 {
        assert!(ro.lookup(ns(), &key(6)).is_some());
    }
    let calls = server.command_calls();
    assert_eq!(
        calls
            .keys()
            .filter(|c| !matches!(c.as_str(), "ping" | "config|resetstat" | "info"))
            .count(),
        0,
        "1,000 local hits sent {calls:?}"
    );
    assert!(ro.lookup(ns(), &key(5)).is_some(), "reads on a miss");
    ro.flush().expect("local save");
    ro.publish_within(Duration::from_secs(2))
        .expect("nothing to publish");
    drop(ro);
    let calls = server.command_calls();
    for write in [
        "set", "getex", "eval", "evalsha", "expire", "pexpire", "del",
    ] {
        assert!(
            !calls.contains_key(write),
            "read mode sent {write}: {calls:?}"
        );
    }
    // One read of one key: whether it exists, and its bytes up to the value cap.
    assert_eq!(calls.get("getrange"), Some(&1), "{calls:?}");
    assert_eq!(calls.get("exists"), Some(&1), "{calls:?}");
}

#[test]
fn crafted_values_on_the_server_are_misses_with_counters() {
    let Some(server) = Server::start() else {
        return;
    };
    let now = now_millis();
    let wrong_scope = cache_core::cache_format::Scope::default();
    server.set_raw(
        &remote_key(10),
        &encode_value(&registry(), &wrong_scope, "matmul", &entry(10, "t", 1.0)),
    );
    server.set_raw(
        &remote_key(11),
        &encode_value(
            &cache_core::cache_migrate::Migrations::new("remoteapp", 7),
            &scope(),
            "matmul",
            &entry(11, "t", 1.0),
        ),
    );
    let mut future = entry(12, "t", 1.0);
    future.clamp_future(u64::MAX);
    let future = {
        let mut c = (*future.candidates()[0]).clone();
        c.measured_at = now + 86_400_000;
        cache_core::cache_format::Entry::new(
            key(12),
            Default::default(),
            Origin::Measured("x".into()),
            now,
            [c],
        )
    };
    server.set_raw(
        &remote_key(12),
        &encode_value(&registry(), &scope(), "matmul", &future),
    );
    server.set_raw(&remote_key(13), &vec![0x7f; 1 << 20]);
    server.set_raw(&remote_key(14), b"\x96\xa6TCACHE\x01");
    // A key of another type: its read fails (WRONGTYPE) alone, refused as damaged.
    server.cmd(&["RPUSH", &remote_key(15), "x"]);
    let dir = tempfile::tempdir().expect("temp dir");
    let c = cache(
        &dir.path().join("a.tcache"),
        &server.url(),
        RemoteOptions::default(),
    );
    for id in 10..=15 {
        assert!(c.lookup(ns(), &key(id)).is_none(), "key {id}");
    }
    let h = c.remote_health().expect("remote");
    for why in [
        "wrong scope",
        "newer schema",
        "future timestamp",
        "oversized",
    ] {
        assert_eq!(h.rejected.get(why), Some(&1), "{why}: {h:?}");
    }
    assert_eq!(
        h.rejected.get("damaged"),
        Some(&2),
        "key 14, and the list at 15: {h:?}"
    );
    assert_eq!(h.errors, 0, "{h:?}");
    // In one batch, the list does not hide the good key beside it.
    server.set_raw(
        &remote_key(16),
        &encode_value(&registry(), &scope(), "matmul", &entry(16, "t", 1.0)),
    );
    let fps: Vec<_> = [15, 16].iter().map(|i| key(*i).fingerprint()).collect();
    let d = cache(
        &dir.path().join("d.tcache"),
        &server.url(),
        RemoteOptions::default(),
    );
    assert_eq!(d.prefetch(ns(), &fps), 1);
    assert_eq!(c.len(), 0);
}

#[test]
fn a_unix_socket_serves_as_well() {
    let Some(server) = Server::start_unix() else {
        return;
    };
    assert!(
        server.url().starts_with("redis+unix://"),
        "{}",
        server.url()
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let a = cache(
        &dir.path().join("a.tcache"),
        &server.url(),
        RemoteOptions::default(),
    );
    let b = cache(
        &dir.path().join("b.tcache"),
        &server.url(),
        RemoteOptions::default(),
    );
    a.put(ns(), entry(1, "tiled", 5.0));
    a.publish_within(Duration::from_secs(10))
        .expect("published");
    let hit = b.lookup(ns(), &key(1)).expect("read through the socket");
    assert_eq!(hit.origin().kind(), "remote");
}

/// Both backends read a batch the same way: a value of another type at one key (someone
/// else's list) reads as an empty value, which the checks refuse, and fails neither the good
/// key beside it nor the batch.
fn a_foreign_value_spoils_only_its_own_key(
    remote: &dyn cache_remote::Remote,
    put_list: impl Fn(&str),
) {
    use std::time::Instant;
    let (good, list) = (remote_key(21), remote_key(22));
    let value = encode_value(&registry(), &scope(), "matmul", &entry(21, "t", 1.0));
    let deadline = Instant::now() + Duration::from_secs(5);
    let swap = cache_remote::Swap {
        key: &good,
        expected: None,
        value: &value,
        fence: None,
    };
    assert_eq!(
        remote.compare_and_set_many(&[swap], None, deadline),
        Ok(vec![cache_remote::Swapped::Set])
    );
    put_list(&list);
    let keys = [list.clone(), good.clone(), remote_key(23)];
    for touch in [None, Some(Duration::from_secs(60))] {
        let got = remote
            .get_many(
                &keys,
                cache_remote::Read {
                    touch,
                    limit: 1 << 20,
                },
                deadline,
            )
            .expect("the batch is read");
        assert_eq!(
            got,
            vec![Some(Vec::new()), Some(value.clone()), None],
            "{touch:?}"
        );
    }
}

#[test]
fn a_single_server_reads_around_a_foreign_value() {
    let Some(server) = Server::start() else {
        return;
    };
    let remote = cache_remote::RedisRemote::open(&server.url()).expect("address");
    a_foreign_value_spoils_only_its_own_key(&remote, |key| {
        server.cmd(&["RPUSH", key, "x"]);
    });
}

#[cfg(feature = "cluster")]
#[test]
fn a_cluster_reads_around_a_foreign_value_as_a_single_server_does() {
    let Some(cluster) = test_support::redis_server::Cluster::start() else {
        return;
    };
    let nodes: Vec<String> = cluster.nodes.iter().map(|n| n.url()).collect();
    let urls: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let remote = cache_remote::RedisClusterRemote::open(&urls).expect("addresses");
    let client = redis::cluster::ClusterClient::new(urls.clone()).expect("client");
    a_foreign_value_spoils_only_its_own_key(&remote, |key| {
        let mut conn = client.get_connection().expect("connection");
        let _: i64 = redis::cmd("RPUSH")
            .arg(key)
            .arg("x")
            .query(&mut conn)
            .expect("RPUSH");
    });
}
