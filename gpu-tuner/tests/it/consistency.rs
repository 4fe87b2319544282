//! One winner for the fleet (`Consistency::Fleet`) on a real `redis-server`: a process uses the
//! winner of the entry the shared tier holds even for a key it measured itself, a changed
//! winner reaches running processes only at `Tuner::sync`, and without a reachable server
//! the local winner is kept and the sync says why.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cache_core::{Cache, Store as _};
use cache_remote::{RedisRemote, Remote, RemoteBuilder as _, RemoteCache as _, RemoteOptions};
use gpu_tuner::{Consistency, OpConfig, RemotePolicy, Tuned, Tuner};
use test_support::redis_server::Server;

use crate::support::{TestKey, TestOp, builder, quick};

/// Leases off: each process measures what it lacks, as processes that cannot coordinate do.
fn remote_cache(path: &Path, url: &str) -> Arc<Cache> {
    let options = RemoteOptions {
        budget: Duration::from_millis(300),
        lease_ttl: None,
        ..RemoteOptions::default()
    };
    let remote = RedisRemote::open(url).expect("address");
    Arc::new(
        builder(path)
            .remote_with(Arc::new(remote) as Arc<dyn Remote>, options)
            .open(),
    )
}

/// Candidates `x` and `y` whose declared times make this process rank them its own way.
fn op(x: u64, y: u64) -> TestOp {
    TestOp::new("consistent", &[("x", x), ("y", y)])
}

fn register(cache: Arc<Cache>, op: TestOp, consistency: Consistency) -> (Tuner, Tuned<TestOp>) {
    let tuner = match gpu_tuner::fleet::of_cache(&cache) {
        Some(fleet) => Tuner::new(cache).with_fleet(fleet),
        None => Tuner::new(cache),
    }
    .with_consistency(consistency);
    let config = OpConfig {
        remote: RemotePolicy::Trust,
        ..quick()
    };
    let tuned = tuner.register(op, config).expect("register");
    (tuner, tuned)
}

fn winner(t: &Tuned<TestOp>) -> String {
    t.get(&TestKey { size: 1 })
        .expect("choice")
        .candidate()
        .algorithm
        .clone()
}

/// Measures key 1 with `op` in a cache of its own with no shared tier (a machine that ran
/// before the server was there), and closes it.
fn measure_offline(path: &Path, op: TestOp) -> String {
    let cache = Arc::new(builder(path).open());
    let (_tuner, t) = register(Arc::clone(&cache), op, Consistency::Local);
    let w = winner(&t);
    cache.flush().expect("saved");
    w
}

#[test]
fn every_process_runs_the_fleets_winner_and_a_change_arrives_only_at_a_sync() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let (a_path, b_path, c_path) = (
        dir.path().join("a.tcache"),
        dir.path().join("b.tcache"),
        dir.path().join("c.tcache"),
    );
    // B measured the key on its own earlier and found y faster.
    assert_eq!(measure_offline(&b_path, op(300, 50)), "y");
    let d_path = dir.path().join("d.tcache");
    std::fs::copy(&b_path, &d_path).expect("a copy of B, for Local consistency");
    std::thread::sleep(Duration::from_millis(20));
    // A measures it now (later: its figures win the merge) and finds x faster.
    let (tuner_a, a) = register(
        remote_cache(&a_path, &server.url()),
        op(100, 200),
        Consistency::Fleet,
    );
    assert_eq!(winner(&a), "x");
    // B comes up with its own entry: its measurements join the fleet's entry, whose winner
    // (A's later figures) B runs, not its own.
    let (tuner_b, b) = register(
        remote_cache(&b_path, &server.url()),
        op(300, 50),
        Consistency::Fleet,
    );
    assert_eq!(
        winner(&b),
        "x",
        "B runs the fleet's winner, not the one it measured"
    );
    assert_eq!(b.stats().fleet_adopted, 1);
    // The same start under Local consistency keeps the process's own winner.
    let (_tuner_d, d) = register(
        remote_cache(&d_path, &server.url()),
        op(300, 50),
        Consistency::Local,
    );
    assert_eq!(winner(&d), "y");

    // A third machine publishes newer measurements in which y wins.
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(measure_offline(&c_path, op(300, 40)), "y");
    let c = remote_cache(&c_path, &server.url());
    let fp = a
        .get(&TestKey { size: 1 })
        .expect("choice")
        .key()
        .fingerprint();
    let view = c
        .remote()
        .expect("remote")
        .view(a.namespace(), &[fp], Duration::from_secs(5))
        .expect("view");
    let fleet = view[0].as_ref().expect("the fleet has the key");
    assert_eq!(fleet.best().expect("measured").id.algorithm, "y");
    // Running processes keep their choice until their next sync...
    for _ in 0..3 {
        assert_eq!((winner(&a), winner(&b)), ("x".to_owned(), "x".to_owned()));
    }
    // ...where both take the fleet's new winner, together.
    for tuner in [&tuner_a, &tuner_b] {
        let report = tuner.sync(Duration::from_secs(5));
        assert!(report.error.is_none(), "{:?}", report.error);
        assert_eq!((report.keys, report.changed), (1, 1));
    }
    assert_eq!((winner(&a), winner(&b)), ("y".to_owned(), "y".to_owned()));
    let again = tuner_a.sync(Duration::from_secs(5));
    assert_eq!((again.keys, again.changed), (1, 0), "nothing changed since");
}

#[test]
fn without_a_reachable_server_the_local_winner_is_kept_and_the_sync_says_why() {
    let dir = tempfile::tempdir().expect("dir");
    let cache = remote_cache(&dir.path().join("a.tcache"), "redis://127.0.0.1:1/0");
    let (tuner, t) = register(cache, op(100, 200), Consistency::Fleet);
    assert_eq!(winner(&t), "x");
    let report = tuner.sync(Duration::from_millis(500));
    assert_eq!((report.keys, report.changed), (0, 0));
    assert!(report.error.is_some(), "{report:?}");
    assert_eq!(winner(&t), "x");
    // A cache with no shared tier at all: no fleet to follow.
    let plain = Arc::new(builder(&dir.path().join("b.tcache")).open());
    let (tuner, t) = register(plain, op(100, 200), Consistency::Fleet);
    assert_eq!(winner(&t), "x");
    assert!(tuner.sync(Duration::from_millis(500)).error.is_some());
}

#[test]
fn a_sync_with_the_server_frozen_returns_within_its_bounds_and_keeps_every_choice() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let cache = remote_cache(&dir.path().join("a.tcache"), &server.url());
    let (tuner, t) = register(cache, op(100, 200), Consistency::Fleet);
    assert_eq!(winner(&t), "x");
    server.signal(libc::SIGSTOP);
    let started = std::time::Instant::now();
    let report = tuner.sync(Duration::from_millis(300));
    let took = started.elapsed();
    server.signal(libc::SIGCONT);
    assert!(report.error.is_some(), "{report:?}");
    assert_eq!(report.changed, 0);
    // The publication's wait (300 ms) and one read budget (300 ms), with room for a loaded
    // machine: never the server's pace.
    assert!(
        took < Duration::from_secs(2),
        "a sync on a frozen server took {took:?}"
    );
    assert_eq!(winner(&t), "x");
}
