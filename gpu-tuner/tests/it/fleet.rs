//! A fleet on one real `redis-server`: processes in groups with separate local files
//! ("machines") tune the same keys. Each key is measured once in the fleet (an append-only
//! log of every measurement), every process ends with the same winners, a leader killed
//! mid-measurement is taken over once its lease expires, a frozen server leaves every process
//! tuning locally, and processes of different scopes share nothing.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cache_remote::{Remote, RemoteBuilder as _, RemoteCache as _, RemoteOptions};
use gpu_tuner::{OpConfig, Progress, RemotePolicy, Tuner};
use test_support::redis_server::Server;

use crate::support::{MARK, TestKey, TestOp, builder, quick};

pub(crate) const KEYS: u32 = 27;

macro_rules! say {
    ($($arg:tt)*) => {
        println!("{MARK}{}", format_args!($($arg)*))
    };
}

/// The child role `fleet URL LOG SEED DEVICE LEASE_MS MICROS`: tunes keys 1..=27 through the
/// shared tier at URL with candidates whose declared times depend on SEED (so processes
/// tuning alone would pick different winners), appending each key it measures to LOG.
pub(crate) fn child(path: PathBuf, args: Vec<String>) {
    let [url, log, seed, device, lease_ms, micros] = &args[..] else {
        panic!("fleet URL LOG SEED DEVICE LEASE_MS MICROS, got {args:?}");
    };
    let seed: u64 = seed.parse().expect("seed");
    let micros: u64 = micros.parse().expect("micros");
    let options = RemoteOptions {
        budget: Duration::from_millis(300),
        // 0: no leases (every process measures what neither it nor the server has).
        lease_ttl: Some(Duration::from_millis(lease_ms.parse().expect("ms")))
            .filter(|ttl| !ttl.is_zero()),
        ..RemoteOptions::default()
    };
    // Redis or, for `s3://`, a bucket (the endpoint and credentials from the environment).
    let remote: Arc<dyn Remote> =
        cache_remote::connect(url, &cache_core::settings::Settings::from_env()).expect("address");
    let cache = Arc::new(
        builder(&path)
            .scope(crate::support::scope(device))
            .remote_with(remote, options)
            .open(),
    );
    // Three candidates within 20% of each other, ranked differently for each seed.
    let jitter = |i: u64| micros + micros * ((seed * 7 + i * 5) % 10) / 50;
    let op = TestOp::new(
        "fleet",
        &[("a", jitter(0)), ("b", jitter(1)), ("c", jitter(2))],
    );
    let fleet = gpu_tuner::fleet::of_cache(&cache).expect("a shared tier");
    let tuner = Tuner::new(Arc::clone(&cache)).with_fleet(fleet);
    let log = log.clone();
    tuner.on_progress(move |p| match p {
        Progress::Tuning { .. } => say!("tuning"),
        Progress::Tuned { key, .. } => {
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(&log)
                .expect("log");
            f.write_all(format!("{key} pid={}\n", std::process::id()).as_bytes())
                .expect("log write");
        }
        _ => {}
    });
    let config = OpConfig {
        remote: RemotePolicy::Trust,
        ..quick()
    };
    let t = tuner.register(op, config).expect("register");
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    for size in 1..=KEYS {
        let call = Instant::now();
        let choice = t.get(&TestKey { size }).expect("choice");
        slowest = slowest.max(call.elapsed());
        say!("winner {size} {}", choice.candidate());
    }
    say!("elapsed_ms {}", started.elapsed().as_millis());
    say!("slowest_ms {}", slowest.as_millis());
    let _ = cache.publish_within(Duration::from_secs(5));
    let h = cache.remote_health().expect("remote");
    say!("leases {}", h.leases);
    say!("waits {}", h.lease_waits);
    say!("takeovers {}", h.takeovers);
    say!("skipped {}", h.skipped);
    say!("fenced {}", h.rejected.get("fenced").copied().unwrap_or(0));
}

struct Run {
    winners: BTreeMap<u32, String>,
    info: BTreeMap<String, String>,
}

fn spawn(
    path: &Path,
    url: &str,
    log: &Path,
    seed: u64,
    device: &str,
    lease_ms: u64,
    micros: u64,
) -> test_support::child::ChildGuard {
    spawn_in(&[], path, url, log, (seed, device, lease_ms, micros))
}

/// [`spawn`] with `env` added to the child's environment.
fn spawn_in(
    env: &[(&str, &str)],
    path: &Path,
    url: &str,
    log: &Path,
    (seed, device, lease_ms, micros): (u64, &str, u64, u64),
) -> test_support::child::ChildGuard {
    let args = [
        url.to_owned(),
        log.display().to_string(),
        seed.to_string(),
        device.to_owned(),
        lease_ms.to_string(),
        micros.to_string(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    test_support::child::spawn("fleet", path, &args, env)
}

fn finish(mut child: test_support::child::ChildGuard) -> Run {
    let lines = test_support::child::lines(&mut child);
    settle(child, lines)
}

/// Waits for the child to succeed and reads its messages `lines` into a run.
fn settle(mut child: test_support::child::ChildGuard, lines: Vec<String>) -> Run {
    assert!(
        child.0.wait().expect("wait").success(),
        "a fleet process failed: {lines:?}"
    );
    let mut run = Run {
        winners: BTreeMap::new(),
        info: BTreeMap::new(),
    };
    for line in lines {
        let mut parts = line.splitn(3, ' ');
        match (parts.next(), parts.next(), parts.next()) {
            (Some("winner"), Some(k), Some(w)) => {
                run.winners.insert(k.parse().expect("key"), w.to_owned());
            }
            (Some(name), Some(v), None) => {
                run.info.insert(name.to_owned(), v.to_owned());
            }
            _ => {}
        }
    }
    run
}

/// How many times each key was measured, from the log.
fn measured(log: &Path) -> BTreeMap<String, usize> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        let key = line.rsplit_once(" pid=").map_or(line, |(k, _)| k);
        *counts.entry(key.to_owned()).or_default() += 1;
    }
    counts
}

#[test]
fn eight_processes_on_two_machines_measure_each_key_once_and_agree() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    // One process alone, for the time one machine's tuning takes (another scope: no sharing).
    let solo_log = dir.path().join("solo.log");
    let t = Instant::now();
    let solo = finish(spawn(
        &dir.path().join("solo.tcache"),
        &server.url(),
        &solo_log,
        0,
        "solo",
        2000,
        3000,
    ));
    let one = t.elapsed();
    assert_eq!(measured(&solo_log).len(), KEYS as usize);
    // The fleet: two machines (files) of four processes each.
    let log = dir.path().join("fleet.log");
    let t = Instant::now();
    let children: Vec<_> = (0..8)
        .map(|i| {
            let file = dir
                .path()
                .join(if i % 2 == 0 { "a.tcache" } else { "b.tcache" });
            spawn(&file, &server.url(), &log, i + 1, "gpu", 2000, 3000)
        })
        .collect();
    let runs: Vec<Run> = children.into_iter().map(finish).collect();
    let fleet = t.elapsed();
    let counts = measured(&log);
    assert_eq!(
        counts.len(),
        KEYS as usize,
        "every key measured: {counts:?}"
    );
    assert!(
        counts.values().all(|&n| n == 1),
        "each key measured once in the fleet: {counts:?}"
    );
    for run in &runs[1..] {
        assert_eq!(
            run.winners, runs[0].winners,
            "every process uses the fleet's winners"
        );
    }
    let leases: u64 = runs
        .iter()
        .map(|r| r.info["leases"].parse::<u64>().expect("n"))
        .sum();
    // At least one lease per key; a few more where a lease was taken just after its leader
    // published (the entry is then read and the lease given back unused).
    assert!(leases >= u64::from(KEYS), "{leases} leases");
    // Tuned alone, the seeds would not all agree: the agreement is the fleet's doing.
    let waits: u64 = runs
        .iter()
        .map(|r| r.info["waits"].parse::<u64>().expect("n"))
        .sum();
    // The same fleet without leases (another scope, so nothing above is shared), as every
    // process measured before: the work the leases saved, in the same run.
    let unleased_log = dir.path().join("unleased.log");
    let t = Instant::now();
    let children: Vec<_> = (0..8)
        .map(|i| {
            let file = dir
                .path()
                .join(if i % 2 == 0 { "c.tcache" } else { "d.tcache" });
            spawn(
                &file,
                &server.url(),
                &unleased_log,
                i + 1,
                "unleased",
                0,
                3000,
            )
        })
        .collect();
    let unleased_runs: Vec<Run> = children.into_iter().map(finish).collect();
    let unleased = t.elapsed();
    let unleased_work: usize = measured(&unleased_log).values().sum();
    let disagree = unleased_runs[1..]
        .iter()
        .filter(|r| r.winners != unleased_runs[0].winners)
        .count();
    println!(
        "fleet: 8 processes on 2 machines, {KEYS} keys: {fleet:?} against {one:?} for one process \
         alone ({:.2}x), {KEYS} keys measured; without leases {unleased:?} ({:.2}x), \
         {unleased_work} keys measured, {disagree} of 7 processes ending with other winners \
         than the first; {leases} leases, {waits} waits on another process's lease; solo \
         winners differ on {} keys",
        fleet.as_secs_f64() / one.as_secs_f64(),
        unleased.as_secs_f64() / one.as_secs_f64(),
        solo.winners
            .iter()
            .filter(|(k, w)| runs[0].winners.get(k) != Some(w))
            .count()
    );
}

/// The same fleet on an S3 bucket (moto): leases are objects there, and still each key is
/// measured once and every process ends with the same winners.
#[test]
fn eight_processes_on_two_machines_sharing_a_bucket_measure_each_key_once() {
    let Some(server) = test_support::s3_server::S3Server::start("fleet") else {
        return;
    };
    let env = server.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let dir = tempfile::tempdir().expect("dir");
    let log = dir.path().join("fleet.log");
    let t = Instant::now();
    let children: Vec<_> = (0..8)
        .map(|i| {
            let file = dir
                .path()
                .join(if i % 2 == 0 { "a.tcache" } else { "b.tcache" });
            spawn_in(
                &env,
                &file,
                "s3://fleet/t",
                &log,
                (i + 1, "gpu", 3000, 3000),
            )
        })
        .collect();
    let runs: Vec<Run> = children.into_iter().map(finish).collect();
    let counts = measured(&log);
    assert_eq!(
        counts.len(),
        KEYS as usize,
        "every key measured: {counts:?}"
    );
    assert!(
        counts.values().all(|&n| n == 1),
        "each key measured once in the fleet: {counts:?}"
    );
    for run in &runs[1..] {
        assert_eq!(run.winners, runs[0].winners, "the fleet's winners");
    }
    let waits: u64 = runs
        .iter()
        .map(|r| r.info["waits"].parse::<u64>().expect("n"))
        .sum();
    println!(
        "fleet on S3 (moto): 8 processes on 2 machines, {KEYS} keys measured once in {:?}, \
         {waits} waits on another process's lease",
        t.elapsed()
    );
}

#[test]
fn a_leader_killed_mid_measurement_is_taken_over_after_its_lease_expires() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let log = dir.path().join("fleet.log");
    // The leader: slow candidates (about 0.3 s a key), killed while it measures key 1.
    let mut leader = spawn(
        &dir.path().join("a.tcache"),
        &server.url(),
        &log,
        1,
        "gpu",
        1000,
        30_000,
    );
    let mut out = test_support::child::wait_for(&mut leader.0, "tuning");
    leader.0.kill().expect("SIGKILL");
    let _ = leader.0.wait();
    let _ = std::io::BufRead::read_line(&mut out, &mut String::new());
    let t = Instant::now();
    let follower = finish(spawn(
        &dir.path().join("b.tcache"),
        &server.url(),
        &log,
        2,
        "gpu",
        1000,
        3000,
    ));
    println!("takeover: the second machine finished in {:?}", t.elapsed());
    assert_eq!(follower.info["takeovers"], "1", "{:?}", follower.info);
    let counts = measured(&log);
    assert_eq!(counts.len(), KEYS as usize, "{counts:?}");
    assert!(
        counts.values().all(|&n| n == 1),
        "the killed leader recorded nothing: {counts:?}"
    );
    // A third machine takes every key from the server: one winner per key for the fleet.
    let third = finish(spawn(
        &dir.path().join("c.tcache"),
        &server.url(),
        &log,
        3,
        "gpu",
        1000,
        3000,
    ));
    assert_eq!(third.winners, follower.winners);
    assert_eq!(
        measured(&log).values().sum::<usize>(),
        KEYS as usize,
        "the third measured nothing"
    );
}

/// A leader frozen (SIGSTOP) mid-measurement past its lease: another machine takes the key
/// over and publishes; when the frozen one resumes and finishes, its publication is refused by
/// the lease's fence, so the fleet keeps the result measured under the lease.
#[test]
fn a_frozen_leader_that_resumes_after_a_takeover_publishes_nothing_over_it() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let log = dir.path().join("fleet.log");
    // Seed 1 ranks b first, seed 2 ranks a first: whose figures the server holds shows.
    let mut frozen = spawn(
        &dir.path().join("a.tcache"),
        &server.url(),
        &log,
        1,
        "gpu",
        1000,
        30_000,
    );
    let out = test_support::child::wait_for(&mut frozen.0, "tuning");
    let pid = i32::try_from(frozen.0.id()).expect("pid");
    // SAFETY: a plain signal to our own child process.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let taker = finish(spawn(
        &dir.path().join("b.tcache"),
        &server.url(),
        &log,
        2,
        "gpu",
        1000,
        3000,
    ));
    assert_eq!(taker.info["takeovers"], "1", "{:?}", taker.info);
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let rest: Vec<String> = std::io::BufRead::lines(out)
        .map_while(Result::ok)
        .filter_map(|l| test_support::child::message(&l).map(str::to_owned))
        .collect();
    let resumed = settle(frozen, rest);
    assert_eq!(resumed.info["fenced"], "1", "{:?}", resumed.info);
    // A third machine reads every key from the server: the taker's winners, key 1 included.
    let third = finish(spawn(
        &dir.path().join("c.tcache"),
        &server.url(),
        &log,
        3,
        "gpu",
        1000,
        3000,
    ));
    assert_eq!(third.winners, taker.winners);
    assert_eq!(third.winners.get(&1).map(String::as_str), Some("a"));
}

#[test]
fn with_the_server_frozen_every_process_tunes_locally_within_its_budget() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let log = dir.path().join("fleet.log");
    server.signal(libc::SIGSTOP);
    let children: Vec<_> = (0..2)
        .map(|i| {
            spawn(
                &dir.path().join(format!("{i}.tcache")),
                &server.url(),
                &log,
                i,
                "gpu",
                2000,
                2000,
            )
        })
        .collect();
    let runs: Vec<Run> = children.into_iter().map(finish).collect();
    server.signal(libc::SIGCONT);
    for run in &runs {
        assert_eq!(run.info["leases"], "0", "{:?}", run.info);
        assert!(
            run.info["skipped"].parse::<u64>().expect("n") > 0,
            "the breaker kept it off: {:?}",
            run.info
        );
        let slowest: u64 = run.info["slowest_ms"].parse().expect("ms");
        println!("frozen server: slowest call {slowest} ms");
    }
    let counts = measured(&log);
    assert!(
        counts.values().all(|&n| n == 2),
        "each process measured every key itself: {counts:?}"
    );
}

#[test]
fn processes_of_different_scopes_share_nothing() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let log = dir.path().join("fleet.log");
    let x = spawn(
        &dir.path().join("x.tcache"),
        &server.url(),
        &log,
        1,
        "gpu-x",
        2000,
        2000,
    );
    let y = spawn(
        &dir.path().join("y.tcache"),
        &server.url(),
        &log,
        2,
        "gpu-y",
        2000,
        2000,
    );
    let (x, y) = (finish(x), finish(y));
    assert_eq!(x.info["waits"], "0");
    assert_eq!(y.info["waits"], "0");
    let counts = measured(&log);
    assert_eq!(counts.len(), KEYS as usize);
    assert!(
        counts.values().all(|&n| n == 2),
        "each kind measured every key: {counts:?}"
    );
}
