//! A writer killed with SIGKILL at random moments, many times: the file always opens and every
//! result that was flushed before the kill is there.

use std::collections::BTreeSet;
use std::io::BufRead;
use std::time::{Duration, Instant};

use cache_core::Mode;

use crate::support::{builder, has, path_in, spawn_child, temp_dir};

/// A small deterministic generator; the seed is printed so a failure can be replayed.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % below
    }
}

#[test]
fn sigkill_at_random_moments_never_loses_a_flushed_result() {
    let seed = std::env::var("TUNECACHE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(cache_core::cache_format::now_millis);
    println!("crash test seed {seed} (set TUNECACHE_TEST_SEED to replay)");
    let mut rng = Lcg(seed);
    let dir = temp_dir();
    let path = path_in(&dir, "crash.tcache");
    let mut flushed: BTreeSet<u64> = BTreeSet::new();
    let mut next_id = 0u64;
    const ROUNDS: usize = 30;
    for round in 0..ROUNDS {
        let mut child = spawn_child(
            "killable",
            &path,
            &[7.to_string(), next_id.to_string(), "25".into()],
            &[],
        );
        let out = child.stdout.take().expect("stdout");
        // Read "flushed N" lines on a thread so the parent can kill at any moment.
        let reader = std::thread::spawn(move || {
            std::io::BufReader::new(out)
                .lines()
                .map_while(Result::ok)
                .filter_map(|l| {
                    test_support::child::message(&l)
                        .and_then(|m| m.strip_prefix("flushed "))
                        .and_then(|n| n.parse::<u64>().ok())
                })
                .collect::<Vec<_>>()
        });
        let delay = Duration::from_millis(30 + rng.next(400));
        let start = Instant::now();
        while start.elapsed() < delay {
            std::thread::sleep(Duration::from_millis(5));
        }
        child.kill().expect("SIGKILL the writer");
        child.wait().expect("reap");
        let reported = reader.join().expect("reader thread");
        let last = reported.last().copied();
        if let Some(last) = last {
            // Every id up to the last reported flush was durable before the kill.
            flushed.extend(next_id..=last);
        }
        // The next writer continues after everything this one may have recorded.
        next_id += 10_000;

        let cache = builder(&path).open();
        let health = cache.health();
        assert_eq!(
            health.mode,
            Mode::Persistent,
            "round {round}: the file did not open cleanly: {health:?}"
        );
        assert!(
            health.quarantined.is_empty(),
            "round {round}: a file was quarantined: {health:?}"
        );
        let lost: Vec<_> = flushed
            .iter()
            .filter(|&&id| !has(&cache, 7, id))
            .take(5)
            .collect();
        assert!(
            lost.is_empty(),
            "round {round} (seed {seed}): flushed results lost, e.g. {lost:?}"
        );
    }
    assert!(
        flushed.len() > 100,
        "the writers flushed too little to prove anything ({})",
        flushed.len()
    );
}

/// Issue 37: four writers compacting at almost every save, killed with SIGKILL at random
/// moments round after round, while four reader processes open the file again and again: the
/// readers always find it whole, and every result a writer saw flushed is there after each
/// round.
#[test]
fn compaction_under_four_writers_and_four_readers_with_kills_loses_nothing() {
    let seed = std::env::var("TUNECACHE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(cache_core::cache_format::now_millis);
    println!("compaction kill test seed {seed} (set TUNECACHE_TEST_SEED to replay)");
    let mut rng = Lcg(seed);
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    const ROUNDS: u64 = 6;
    let readers: Vec<_> = (0..4)
        .map(|_| spawn_child("opener", &path, &[(ROUNDS * 700).to_string()], &[]))
        .collect();
    let mut flushed: Vec<(u64, u64)> = Vec::new();
    for round in 0..ROUNDS {
        let writers: Vec<_> = (0..4u64)
            .map(|w| {
                let start = round * 100_000;
                let mut child = spawn_child(
                    "killable",
                    &path,
                    &[(20 + w).to_string(), start.to_string(), "10".into()],
                    &[],
                );
                let out = child.stdout.take().expect("stdout");
                let reader = std::thread::spawn(move || {
                    std::io::BufReader::new(out)
                        .lines()
                        .map_while(Result::ok)
                        .filter_map(|l| {
                            test_support::child::message(&l)
                                .and_then(|m| m.strip_prefix("flushed "))
                                .and_then(|n| n.parse::<u64>().ok())
                        })
                        .last()
                });
                (w, start, child, reader)
            })
            .collect();
        for (w, start, mut child, reader) in writers {
            std::thread::sleep(Duration::from_millis(20 + rng.next(150)));
            child.kill().expect("SIGKILL a writer");
            child.wait().expect("reap");
            if let Some(last) = reader.join().expect("reader thread") {
                flushed.extend((start..=last).map(|i| (20 + w, i)));
            }
        }
        let cache = builder(&path).open();
        let health = cache.health();
        assert_eq!(health.mode, Mode::Persistent, "round {round}: {health:?}");
        assert!(health.quarantined.is_empty(), "round {round}: {health:?}");
        let lost: Vec<_> = flushed
            .iter()
            .filter(|(w, id)| !has(&cache, *w, *id))
            .take(5)
            .collect();
        assert!(
            lost.is_empty(),
            "round {round} (seed {seed}): flushed results lost, e.g. {lost:?}"
        );
    }
    for mut r in readers {
        let out = r.stdout.take().expect("stdout");
        let said: Vec<String> = std::io::BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .collect();
        let status = r.wait().expect("reader");
        assert!(status.success(), "a reader failed: {said:?}");
        assert!(
            said.iter().any(|l| l.contains("opens ")),
            "a reader said nothing: {said:?}"
        );
    }
    assert!(
        flushed.len() > 100,
        "too little flushed to prove anything ({})",
        flushed.len()
    );
}
