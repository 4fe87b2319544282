//! The shared tier's policy, against the in-process `MemoryRemote` (the Redis backend is
//! tested against a real server in cache-remote): read-through on a miss, publish behind,
//! convergence, the checks on remote values, and the breaker.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cache_core::cache_format::{
    CacheData, Candidate, Entry, Fields, Fingerprint, Origin, Stats, Value, now_millis,
};
use cache_core::{Cache, Store};
use cache_remote::{
    BreakerState, MemoryRemote, Remote, RemoteBuilder as _, RemoteCache as _, RemoteError,
    RemoteMode, RemoteOptions, encode_value, remote_key,
};

use self::support::{builder, entry, key, path_in, registry, scope, temp_dir};
use crate::{capture_logs, ns, warnings_about};

fn shared(remote: &Arc<MemoryRemote>, path: &std::path::Path) -> Cache {
    builder(path)
        .scope(scope("H100"))
        .remote(Arc::clone(remote) as Arc<dyn Remote>)
        .open()
}

fn key_of(id: u64) -> String {
    remote_key(
        "testapp",
        1,
        &scope("H100").fingerprint(),
        "matmul",
        &key(1, id).fingerprint(),
    )
}

fn measured(id: u64, algo: &str, median: f64, at: u64) -> Entry {
    let stats = Stats {
        median_ns: median,
        min_ns: median * 0.9,
        spread_ns: 1.0,
        samples: 9,
    };
    let mut c = Candidate::measured(algo, Fields::new(), stats);
    c.measured_at = at;
    Entry::new(
        key(1, id),
        Fingerprint::default(),
        Origin::Measured("t".into()),
        at,
        [c],
    )
}

#[test]
fn a_result_recorded_on_one_machine_is_a_hit_on_the_other_after_one_miss() {
    let remote = Arc::new(MemoryRemote::named("share"));
    let dir = temp_dir();
    let a = shared(&remote, &path_in(&dir, "a.tcache"));
    let b = shared(&remote, &path_in(&dir, "b.tcache"));
    a.put(ns(), entry(1, 7));
    a.publish_within(Duration::from_secs(10))
        .expect("published");
    assert_eq!(remote.keys(), vec![key_of(7)]);
    let hit = b
        .lookup(ns(), &key(1, 7))
        .expect("read through on the miss");
    // It names the server and who measured it there.
    let recorded = entry(1, 7).origin().detail().to_owned();
    assert!(
        matches!(hit.origin(), Origin::Remote(d) if *d == format!("memory:share, measured on {recorded}")),
        "{:?}",
        hit.origin()
    );
    assert_eq!(
        hit.best().and_then(|c| c.stats()),
        entry(1, 7).best().and_then(|c| c.stats())
    );
    let h = b.remote_health().expect("a remote");
    assert_eq!((h.hits, h.misses), (1, 0));
    // Kept in b's own file, with its origin.
    b.flush().expect("flush");
    drop(b);
    let reopened = builder(&path_in(&dir, "b.tcache"))
        .scope(scope("H100"))
        .open();
    let kept = reopened.lookup(ns(), &key(1, 7)).expect("in b's file");
    assert_eq!(kept.origin().kind(), "remote");
}

#[test]
fn a_local_hit_sends_nothing_and_a_miss_is_asked_once_per_while() {
    let remote = Arc::new(MemoryRemote::named("quiet"));
    let dir = temp_dir();
    let a = shared(&remote, &path_in(&dir, "a.tcache"));
    a.put(ns(), entry(1, 1));
    a.publish_within(Duration::from_secs(10))
        .expect("published");
    let before = remote.commands.load(Ordering::Relaxed);
    for _ in 0..1000 {
        assert!(a.lookup(ns(), &key(1, 1)).is_some());
    }
    assert_eq!(
        remote.commands.load(Ordering::Relaxed),
        before,
        "hits stay local"
    );
    for _ in 0..1000 {
        assert!(a.lookup(ns(), &key(1, 2)).is_none());
    }
    assert_eq!(
        remote.commands.load(Ordering::Relaxed),
        before + 1,
        "a key the remote lacked is not asked for again at once"
    );
}

#[test]
fn read_mode_sends_no_write() {
    let remote = Arc::new(MemoryRemote::named("ro"));
    remote.insert(
        &key_of(3),
        encode_value(&registry(1), &scope("H100"), "matmul", &entry(1, 3)),
    );
    let dir = temp_dir();
    let ro = builder(&path_in(&dir, "a.tcache"))
        .scope(scope("H100"))
        .remote_with(
            Arc::clone(&remote) as Arc<dyn Remote>,
            RemoteOptions {
                mode: RemoteMode::Read,
                ..RemoteOptions::default()
            },
        )
        .open();
    assert!(ro.lookup(ns(), &key(1, 3)).is_some(), "reads");
    ro.put(ns(), entry(1, 4));
    ro.flush().expect("local save");
    ro.publish_within(Duration::from_secs(1))
        .expect("nothing to publish");
    drop(ro);
    assert_eq!(remote.writes.load(Ordering::Relaxed), 0);
    assert_eq!(remote.keys(), vec![key_of(3)]);
}

#[test]
fn both_machines_converge_whatever_the_order_of_publishing() {
    let now = now_millis();
    for order in [[0, 1], [1, 0]] {
        let remote = Arc::new(MemoryRemote::named("converge"));
        let dir = temp_dir();
        let caches = [
            shared(&remote, &path_in(&dir, "a.tcache")),
            shared(&remote, &path_in(&dir, "b.tcache")),
        ];
        // The same key measured differently on each machine, and one key each.
        caches[0].put(ns(), measured(1, "tiled", 500.0, now - 10));
        caches[1].put(ns(), measured(1, "naive", 400.0, now - 5));
        caches[0].put(ns(), measured(2, "tiled", 100.0, now - 3));
        caches[1].put(ns(), measured(3, "naive", 100.0, now - 2));
        for i in order {
            caches[i]
                .publish_within(Duration::from_secs(10))
                .expect("published");
        }
        let mut fold = measured(1, "tiled", 500.0, now - 10);
        fold.merge(measured(1, "naive", 400.0, now - 5));
        // Each machine reads what it lacks; key 1 is local on both, so it is refreshed by
        // reading the server's fold explicitly.
        for c in &caches {
            for id in [2, 3] {
                assert!(c.lookup(ns(), &key(1, id)).is_some(), "key {id}");
            }
        }
        let stored = remote.value(&key_of(1)).expect("key 1 on the server");
        let mut data = CacheData::new();
        data.insert(&scope("H100"), "matmul", fold.clone());
        let on_server = cache_core::cache_format::read_snapshot(&stored, &Default::default())
            .expect("a snapshot");
        assert_eq!(on_server.header.entries, 1);
        let server_entry = cache_core::cache_migrate::upgrade(
            &registry(1),
            on_server.format,
            &on_server.header.app,
            on_server.header.schema,
            on_server.payload_bytes(),
            &Default::default(),
        )
        .expect("current")
        .data;
        let (_, _, e) = server_entry.entries().next().expect("one entry");
        assert_eq!(e.candidates(), fold.candidates(), "order {order:?}");
        assert_eq!(e.best().map(|c| c.id.algorithm.as_str()), Some("naive"));
    }
}

#[test]
fn crafted_values_are_misses_with_a_counter_never_a_panic() {
    let remote = Arc::new(MemoryRemote::named("crafted"));
    let now = now_millis();
    let good = |id: u64| measured(id, "tiled", 100.0, now);
    let h100 = scope("H100");
    let mut cases: Vec<(u64, Vec<u8>, &str)> = vec![
        (
            10,
            encode_value(&registry(1), &scope("A100"), "matmul", &good(10)),
            "wrong scope",
        ),
        (
            11,
            encode_value(
                &cache_core::cache_migrate::Migrations::new("other", 1),
                &h100,
                "matmul",
                &good(11),
            ),
            "foreign application",
        ),
        (
            12,
            encode_value(&registry(2), &h100, "matmul", &good(12)),
            "newer schema",
        ),
        (
            14,
            encode_value(
                &registry(1),
                &h100,
                "matmul",
                &measured(14, "t", 1.0, now + 3_600_000),
            ),
            "future timestamp",
        ),
        (
            15,
            encode_value(&registry(1), &h100, "matmul", &measured(15, "t", -5.0, now)),
            "implausible statistics",
        ),
        (
            19,
            encode_value(&registry(1), &h100, "matmul", &measured(19, "t", 0.0, now)),
            "implausible statistics",
        ),
        (
            16,
            encode_value(&registry(1), &h100, "matmul", &good(99)),
            "wrong key",
        ),
        (17, vec![0x42; 300 << 10], "oversized"),
        (18, b"garbage".to_vec(), "damaged"),
    ];
    let mut bad_crc = encode_value(&registry(1), &h100, "matmul", &good(13));
    let n = bad_crc.len();
    bad_crc[n - 10] ^= 0xff;
    cases.push((13, bad_crc, "damaged"));
    for (id, bytes, _) in &cases {
        remote.insert(&key_of(*id), bytes.clone());
    }
    let dir = temp_dir();
    let c = shared(&remote, &path_in(&dir, "a.tcache"));
    for (id, _, why) in &cases {
        assert!(c.lookup(ns(), &key(1, *id)).is_none(), "{why}");
    }
    let h = c.remote_health().expect("remote");
    for (_, _, why) in &cases {
        assert!(h.rejected.get(why).is_some_and(|n| *n >= 1), "{why}: {h:?}");
    }
    assert_eq!(h.hits, 0);
    assert_eq!(c.len(), 0, "nothing crafted entered memory");
}

#[test]
fn an_unreachable_server_costs_nothing_after_the_first_miss_and_warns_once() {
    capture_logs();
    let remote = Arc::new(MemoryRemote::named("down-7f3a"));
    remote.fail_with(Some(RemoteError::Unreachable("connection refused".into())));
    let dir = temp_dir();
    let started = Instant::now();
    let c = shared(&remote, &path_in(&dir, "a.tcache"));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "open does not wait"
    );
    assert!(c.lookup(ns(), &key(1, 0)).is_none());
    let t = Instant::now();
    for i in 1..=1000 {
        assert!(c.lookup(ns(), &key(1, i)).is_none());
    }
    let spent = t.elapsed();
    assert!(
        spent < Duration::from_millis(50),
        "1,000 misses took {spent:?}"
    );
    let h = c.remote_health().expect("remote");
    assert!(matches!(h.breaker, BreakerState::Open { .. }), "{h:?}");
    assert!(h.skipped >= 990, "{h:?}");
    // The local cache goes on as before.
    c.put(ns(), entry(1, 5));
    c.flush().expect("the local save counts");
    assert_eq!(warnings_about("memory:down-7f3a").len(), 1);
    // Back up: after the back-off, reads and publishing resume.
    remote.fail_with(None);
    std::thread::sleep(Duration::from_millis(2_100));
    c.publish_within(Duration::from_secs(10))
        .expect("published after recovery");
    assert_eq!(remote.keys(), vec![key_of(5)]);
    let h = c.remote_health().expect("remote");
    assert_eq!(h.breaker, BreakerState::Closed);
}

#[test]
fn a_full_server_pauses_publishing_but_not_reading() {
    let remote = Arc::new(MemoryRemote::named("full"));
    remote.insert(
        &key_of(3),
        encode_value(&registry(1), &scope("H100"), "matmul", &entry(1, 3)),
    );
    let dir = temp_dir();
    let c = shared(&remote, &path_in(&dir, "a.tcache"));
    remote.fail_with(Some(RemoteError::Full("OOM".into())));
    c.put(ns(), entry(1, 4));
    let e = c.publish_within(Duration::from_secs(10)).expect_err("full");
    assert!(matches!(e, RemoteError::Full(_)), "{e}");
    let h = c.remote_health().expect("remote");
    assert!(h.full && h.pending == 1, "{h:?}");
    remote.fail_with(None);
    assert!(c.lookup(ns(), &key(1, 3)).is_some(), "reads go on");
    let _ = Value::Int(0);
}

#[test]
fn both_files_converge_to_the_fold_whatever_the_order() {
    let now = now_millis();
    let mut results = Vec::new();
    for order in [[0, 1], [1, 0]] {
        let remote = Arc::new(MemoryRemote::named("fold"));
        let dir = temp_dir();
        let paths = [path_in(&dir, "a.tcache"), path_in(&dir, "b.tcache")];
        let caches = [shared(&remote, &paths[0]), shared(&remote, &paths[1])];
        caches[0].put(ns(), measured(1, "tiled", 500.0, now - 10));
        caches[1].put(ns(), measured(1, "naive", 400.0, now - 5));
        caches[0].put(ns(), measured(2, "tiled", 100.0, now - 3));
        for i in order {
            caches[i]
                .publish_within(Duration::from_secs(10))
                .expect("published");
        }
        // The second publisher folded the first's result in; the first pulls.
        for c in &caches {
            c.pull_remote(Duration::from_secs(10)).expect("pulled");
            c.flush().expect("saved");
        }
        drop(caches);
        let mut files = Vec::new();
        for p in &paths {
            let reopened = builder(p).scope(scope("H100")).open();
            let mut entries: Vec<(Fingerprint, Vec<std::sync::Arc<Candidate>>)> = reopened
                .entries()
                .into_iter()
                .map(|(_, e)| (e.fingerprint(), e.candidates().to_vec()))
                .collect();
            entries.sort_by_key(|(fp, _)| *fp);
            files.push(entries);
        }
        assert_eq!(
            files[0], files[1],
            "order {order:?}: both files hold the same"
        );
        assert_eq!(files[0].len(), 2);
        results.push(files.remove(0));
    }
    assert_eq!(results[0], results[1], "the same whatever the order");
    let mut fold = measured(1, "tiled", 500.0, now - 10);
    fold.merge(measured(1, "naive", 400.0, now - 5));
    let key1 = key(1, 1).fingerprint();
    let got = results[0]
        .iter()
        .find(|(fp, _)| *fp == key1)
        .expect("key 1");
    assert_eq!(got.1, fold.candidates());
}

/// The helpers of these tests (an application of their own, keys by writer and id).
mod support {
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    use cache_core::cache_format::{
        Candidate, Entry, Fields, Fingerprint, Key, Origin, Scope, Stats, Value,
    };
    use cache_core::cache_migrate::Migrations;
    use cache_core::{Cache, CacheBuilder};

    pub(crate) use test_support::temp_dir;

    pub(crate) fn registry(schema: u32) -> Migrations {
        Migrations::new("testapp", schema)
    }

    /// A builder for `path` with test-friendly timings and no environment.
    pub(crate) fn builder(path: &Path) -> CacheBuilder {
        Cache::builder(registry(1))
            .file(path)
            .ignore_env()
            .save_delay(Duration::from_millis(20))
            .lock_timeout(Duration::from_secs(10))
            .flush_timeout(Duration::from_secs(30))
            .refresh_interval(None)
    }

    pub(crate) fn key(writer: u64, id: u64) -> Key {
        Key::new(Fields::from([
            ("writer".to_owned(), Value::Int(writer as i64)),
            ("id".to_owned(), Value::Int(id as i64)),
        ]))
    }

    /// An entry whose winner encodes `id`.
    pub(crate) fn entry(writer: u64, id: u64) -> Entry {
        let params = Fields::from([("tile".to_owned(), Value::Int((id % 7) as i64))]);
        let stats = Stats {
            median_ns: 1000.0 + id as f64,
            min_ns: 900.0,
            spread_ns: 3.0,
            samples: 9,
        };
        Entry::new(
            key(writer, id),
            Fingerprint::default(),
            Origin::Measured(format!("writer {writer}")),
            cache_core::cache_format::now_millis(),
            [Candidate::measured("tiled", params, stats)],
        )
    }

    pub(crate) fn scope(device: &str) -> Scope {
        Scope::new(Fields::from([("device".to_owned(), Value::from(device))]))
    }

    pub(crate) fn path_in(dir: &tempfile::TempDir, name: &str) -> PathBuf {
        dir.path().join(name)
    }
}
