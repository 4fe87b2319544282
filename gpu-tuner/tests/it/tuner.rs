//! The tuner in one process: hits measure nothing, a key is tuned once however many threads
//! ask, stored winners outside the current candidate set are ignored, a failing winner falls
//! back, growth and scope changes measure only what is new, and the miss policies.

use gpu_tuner::OpError;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use cache_core::cache_format::{
    Candidate, Entry, Fingerprint, Key, Origin, Outcome, Stats, now_millis,
};
use cache_core::{Cache, Namespace, Store};
use gpu_tuner::{
    Bucketing, CandidateId, MissPolicy, OpConfig, Operation, Rule, TuneError, Tuned, Tuner,
};

use crate::support::{Behaviour, TestKey, TestOp, builder, open, quick, scope};

fn tuned(cache: &Arc<Cache>, op: TestOp, config: OpConfig) -> Tuned<TestOp> {
    Tuner::new(Arc::clone(cache))
        .register(op, config)
        .expect("register")
}

fn three() -> TestOp {
    TestOp::new("t", &[("fast", 300), ("mid", 1500), ("slow", 4000)])
}

const K: TestKey = TestKey { size: 64 };

fn cache_key(size: u32) -> Key {
    Key::from_serialize(&TestKey { size }).expect("key")
}

#[test]
fn a_miss_measures_each_candidate_once_and_hits_measure_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let cache = open(&dir.path().join("c.tcache"));
    let op = three();
    let t = tuned(&cache, op.clone(), quick());
    let choice = t.get(&K).expect("tuned");
    assert_eq!(choice.candidate().algorithm, "fast");
    assert!(!choice.is_provisional());
    assert_eq!(op.measured(), ["fast", "mid", "slow"]);
    for _ in 0..10 {
        assert_eq!(t.get(&K).expect("hit").candidate().algorithm, "fast");
    }
    let stats = t.stats();
    assert_eq!(
        (stats.hits, stats.misses, stats.tuned_keys, stats.measured),
        (10, 1, 1, 3)
    );

    // A new tuner on the same cache (as a new process would be) measures nothing.
    let op2 = three();
    let t2 = tuned(&cache, op2.clone(), quick());
    assert_eq!(t2.get(&K).expect("reused").candidate().algorithm, "fast");
    assert!(op2.measured().is_empty());
    assert_eq!(t2.stats().reused_keys, 1);
    assert!(
        t2.stats().saved_time > Duration::ZERO,
        "the recorded tuning cost is what it saved"
    );
}

#[test]
fn threads_asking_for_one_key_at_once_measure_it_once() {
    let dir = tempfile::tempdir().expect("dir");
    let cache = open(&dir.path().join("c.tcache"));
    let op = three();
    let t = tuned(&cache, op.clone(), quick());
    let barrier = Arc::new(Barrier::new(4));
    let winners: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (t, barrier) = (t.clone(), Arc::clone(&barrier));
                s.spawn(move || {
                    barrier.wait();
                    t.get(&K).expect("choice").candidate().algorithm.clone()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    assert_eq!(
        op.measured(),
        ["fast", "mid", "slow"],
        "measured once, not once per thread"
    );
    assert!(winners.iter().all(|w| w == "fast"), "{winners:?}");
}

fn current_set(op: &TestOp) -> Fingerprint {
    let cands = op.candidates();
    Fingerprint::of_candidate_set(
        cands.iter().map(|c| (c.algorithm.as_str(), &c.params)),
        &op.salt(),
    )
}

fn stats(median: f64) -> Stats {
    Stats {
        median_ns: median,
        min_ns: median,
        spread_ns: 0.0,
        samples: 5,
    }
}

#[test]
fn a_stored_winner_outside_the_current_candidate_set_is_ignored() {
    let dir = tempfile::tempdir().expect("dir");
    let cache = open(&dir.path().join("c.tcache"));
    let op = TestOp::new("t", &[("fast", 300), ("slow", 3000)]);
    let ns = Namespace::new("t").expect("ns");
    // Complete for the current set, but its best is a candidate that no longer exists.
    cache.put(
        ns,
        Entry::new(
            cache_key(64),
            current_set(&op),
            Origin::Measured("older build".into()),
            now_millis(),
            [
                Candidate::measured("removed_kernel", Default::default(), stats(1.0)),
                Candidate::measured("slow", Default::default(), stats(3_000_000.0)),
                Candidate::measured("fast", Default::default(), stats(300_000.0)),
            ],
        ),
    );
    let t = tuned(&cache, op.clone(), quick());
    assert_eq!(t.get(&K).expect("choice").candidate().algorithm, "fast");
    assert!(
        op.measured().is_empty(),
        "complete for this set: nothing to measure"
    );
}

#[test]
fn a_winner_that_fails_at_run_time_falls_back_and_is_marked_bad() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("c.tcache");
    let cache = open(&path);
    let op = three();
    let t = tuned(&cache, op.clone(), quick());
    let launched = t
        .run(&K, |h| {
            if h.name == "fast" {
                Err("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES".into())
            } else {
                Ok(h.name.clone())
            }
        })
        .expect("the runner-up runs");
    assert_eq!(launched, "mid");
    assert_eq!(t.stats().failures, 1);
    assert_eq!(
        t.get(&K).expect("choice").candidate().algorithm,
        "mid",
        "the dispatch table moved on"
    );
    let entry = cache
        .lookup(Namespace::new("t").expect("ns"), &cache_key(64))
        .expect("entry");
    let fast = entry
        .candidates()
        .iter()
        .find(|c| c.id.algorithm == "fast")
        .expect("fast");
    assert!(
        matches!(&fast.outcome, Outcome::Failed(r) if r.contains("LAUNCH_OUT_OF_RESOURCES")),
        "{fast:?}"
    );
    drop((t, cache));
    // Another process starts with the failure known: it never launches "fast".
    let cache = open(&path);
    let t = tuned(&cache, three(), quick());
    let ran = t.run(&K, |h| {
        if h.name == "fast" {
            panic!("a known-bad candidate was launched")
        } else {
            Ok(h.name.clone())
        }
    });
    assert_eq!(ran.expect("runs"), "mid");
}

#[test]
fn when_every_candidate_fails_the_error_names_each() {
    let dir = tempfile::tempdir().expect("dir");
    let cache = open(&dir.path().join("c.tcache"));
    let op = TestOp::new("t", &[])
        .with(
            "broken",
            Behaviour {
                broken: true,
                ..Behaviour::default()
            },
        )
        .with(
            "wrong",
            Behaviour {
                micros: 10,
                wrong: true,
                ..Behaviour::default()
            },
        );
    let t = tuned(&cache, op, quick());
    let err = t.get(&K).expect_err("nothing works");
    let TuneError::NoCandidate { reasons, .. } = &err else {
        panic!("{err}")
    };
    assert!(
        reasons.contains("prepare failed: does not compile")
            && reasons.contains("wrong result: 42 != 41"),
        "{reasons}"
    );
    let err = t.run(&K, |_| Ok(())).expect_err("still nothing");
    assert!(err.to_string().contains("no candidate"), "{err}");
}

#[test]
fn a_candidate_with_a_wrong_result_never_wins() {
    let dir = tempfile::tempdir().expect("dir");
    let cache = open(&dir.path().join("c.tcache"));
    let op = TestOp::new("t", &[("slow", 3000)]).with(
        "fast_but_wrong",
        Behaviour {
            micros: 100,
            wrong: true,
            ..Behaviour::default()
        },
    );
    let t = tuned(&cache, op, quick());
    assert_eq!(t.get(&K).expect("choice").candidate().algorithm, "slow");
}

#[test]
fn a_growing_candidate_set_measures_only_the_new_ones_and_the_leader() {
    let dir = tempfile::tempdir().expect("dir");
    let cache = open(&dir.path().join("c.tcache"));
    tuned(&cache, three(), quick()).get(&K).expect("tuned");
    let grown = three().with(
        "newer",
        Behaviour {
            micros: 800,
            ..Behaviour::default()
        },
    );
    let t = tuned(&cache, grown.clone(), quick());
    assert_eq!(t.get(&K).expect("choice").candidate().algorithm, "fast");
    assert_eq!(
        grown.measured(),
        ["fast", "newer"],
        "the new candidate plus the leader, not the rest"
    );
    // And now it is complete for the grown set.
    let again = three().with(
        "newer",
        Behaviour {
            micros: 800,
            ..Behaviour::default()
        },
    );
    tuned(&cache, again.clone(), quick())
        .get(&K)
        .expect("choice");
    assert!(again.measured().is_empty());
}

#[test]
fn after_a_driver_upgrade_only_the_stored_top_candidates_are_retimed() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("c.tcache");
    let five = || {
        TestOp::new(
            "t",
            &[
                ("a", 300),
                ("b", 600),
                ("c", 1200),
                ("d", 2400),
                ("e", 4000),
            ],
        )
    };
    {
        let cache = open(&path);
        let op = five();
        tuned(&cache, op.clone(), quick()).get(&K).expect("tuned");
        assert_eq!(op.measured().len(), 5);
        cache.flush().expect("flush");
    }
    let cache = Arc::new(builder(&path).scope(scope("2")).open());
    let op = five();
    let config = OpConfig {
        retime_top: 2,
        ..quick()
    };
    let t = tuned(&cache, op.clone(), config.clone());
    assert_eq!(t.get(&K).expect("choice").candidate().algorithm, "a");
    assert_eq!(
        op.measured(),
        ["a", "b"],
        "the stored top two, re-timed under the new driver"
    );
    // Complete in the new scope now.
    let op = five();
    tuned(&cache, op.clone(), config).get(&K).expect("choice");
    assert!(op.measured().is_empty());
}

#[test]
fn bucketed_keys_share_one_tuning() {
    let dir = tempfile::tempdir().expect("dir");
    let cache = open(&dir.path().join("c.tcache"));
    let op = three();
    let config = OpConfig {
        bucketing: Bucketing::none().field("size", Rule::PowerOfTwo),
        ..quick()
    };
    let t = tuned(&cache, op.clone(), config);
    let a = t.get(&TestKey { size: 100 }).expect("tuned");
    let b = t.get(&TestKey { size: 120 }).expect("bucket hit");
    assert_eq!(a.key(), b.key(), "both in bucket 128");
    assert_eq!(op.measured().len(), 3, "tuned once for the bucket");
    // Served by the bucket's cache key this process measured: not reused from the cache.
    assert_eq!((t.stats().bucketed_keys, t.stats().reused_keys), (1, 0));
}

#[test]
fn the_never_policy_uses_the_declared_default_without_measuring() {
    let dir = tempfile::tempdir().expect("dir");
    let cache = open(&dir.path().join("c.tcache"));
    let op = three();
    let config = OpConfig {
        policy: MissPolicy::Never {
            default: CandidateId::new("mid", &[]),
        },
        ..quick()
    };
    let t = tuned(&cache, op.clone(), config);
    let c = t.get(&K).expect("default");
    assert_eq!(c.candidate().algorithm, "mid");
    assert!(!c.is_provisional());
    assert!(op.measured().is_empty());
}

#[test]
fn nearest_then_tune_answers_at_once_and_tunes_in_the_background() {
    let dir = tempfile::tempdir().expect("dir");
    let cache = open(&dir.path().join("c.tcache"));
    // Key 64 is tuned (fast wins); key 100 is new.
    tuned(&cache, three(), quick()).get(&K).expect("tuned");
    let op = three();
    let config = OpConfig {
        policy: MissPolicy::NearestThenTune {
            budget: Duration::from_secs(30),
        },
        ..quick()
    };
    let t = tuned(&cache, op.clone(), config);
    let first = t.get(&TestKey { size: 100 }).expect("an answer now");
    assert!(first.is_provisional(), "the nearest key's winner stands in");
    assert_eq!(first.candidate().algorithm, "fast");
    assert!(
        t.wait_background(Duration::from_secs(30)),
        "background tuning finished"
    );
    let tuned_now = t.get(&TestKey { size: 100 }).expect("tuned");
    assert!(!tuned_now.is_provisional());
    assert_eq!(
        op.measured(),
        ["fast", "mid", "slow"],
        "tuned in the background"
    );
}

#[test]
fn an_interrupted_tune_resumes_where_it_stopped() {
    let dir = tempfile::tempdir().expect("dir");
    let cache = open(&dir.path().join("c.tcache"));
    let ns = Namespace::new("t").expect("ns");
    // What a killed tune leaves: two candidates recorded, no completion mark (zero set).
    let mut fast = Candidate::measured("fast", Default::default(), stats(300_000.0));
    fast.tuning_ns = Some(1);
    cache.put(
        ns,
        Entry::new(
            cache_key(64),
            Fingerprint::default(),
            cache_core::measured_here(),
            now_millis(),
            [
                fast,
                Candidate::measured("mid", Default::default(), stats(1_500_000.0)),
            ],
        ),
    );
    let op = three().with(
        "extra",
        Behaviour {
            micros: 2000,
            ..Behaviour::default()
        },
    );
    tuned(&cache, op.clone(), quick()).get(&K).expect("resumed");
    assert_eq!(
        op.measured(),
        ["extra", "fast", "slow"],
        "the unmeasured ones, plus the leader"
    );
}

/// An operation none of whose candidates applies to any key, slowly, so a second thread asks
/// while the first is still deciding.
#[derive(Clone)]
struct NothingApplies(TestOp);

impl Operation for NothingApplies {
    type Key = TestKey;
    type Handle = <TestOp as Operation>::Handle;
    type Problem = ();
    fn namespace(&self) -> &str {
        self.0.namespace()
    }
    fn candidates(&self) -> Vec<CandidateId> {
        self.0.candidates()
    }
    fn applies(&self, _: &CandidateId, _: &TestKey) -> bool {
        std::thread::sleep(Duration::from_millis(30));
        false
    }
    fn prepare(&self, c: &CandidateId, k: &TestKey) -> Result<Self::Handle, OpError> {
        self.0.prepare(c, k)
    }
    fn problem(&self, k: &TestKey) -> Result<(), OpError> {
        self.0.problem(k)
    }
    fn run(&self, h: &Self::Handle, p: &mut ()) -> Result<(), OpError> {
        self.0.run(h, p)
    }
}

#[test]
fn a_follower_that_gives_up_at_once_gets_an_error_when_no_candidate_applies() {
    let dir = tempfile::tempdir().expect("dir");
    let tuner = Tuner::new(open(&dir.path().join("c.tcache")));
    let op = NothingApplies(TestOp::new("none", &[("a", 1), ("b", 1)]));
    let config = OpConfig {
        wait: Duration::ZERO,
        ..quick()
    };
    let t = tuner.register(op, config).expect("register");
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| s.spawn(|| t.get(&TestKey { size: 1 }).map(|c| c.candidate().clone())))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("no thread panicked"))
            .collect()
    });
    for r in results {
        assert!(
            matches!(r, Err(TuneError::NoCandidate { .. })),
            "every caller is told no candidate applies: {r:?}"
        );
    }
}

#[test]
fn tuning_does_not_wait_per_measurement_on_a_lock_another_process_holds() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("c.tcache");
    let cache = Arc::new(builder(&path).lock_timeout(Duration::from_secs(2)).open());
    let held = test_support::hold_lock(&dir.path().join("c.tcache.lock"));
    let op = TestOp::new(
        "t",
        &[("a", 50), ("b", 60), ("c", 70), ("d", 80), ("e", 90)],
    );
    let t = Tuner::new(Arc::clone(&cache))
        .register(op, quick())
        .expect("register");
    let started = std::time::Instant::now();
    let choice = t.get(&TestKey { size: 3 }).expect("tuned in memory");
    let took = started.elapsed();
    // Six records (five measurements and the completion mark). Waiting out the 2 s lock bound
    // for each took over 12 s; now the wait is bounded by durable_wait until the saver's first
    // attempt fails, and then there is none.
    assert!(
        took < Duration::from_secs(5),
        "tuning waited on the held lock: {took:?}"
    );
    assert_eq!(choice.candidate().algorithm, "a");
    assert!(
        test_support::wait_until(Duration::from_secs(5), || cache.is_saving_behind()),
        "the saver reports that it is behind"
    );
    drop(held);
    cache.flush().expect("saved once the lock is free");
    let reopened = builder(&path).open();
    let key = Key::from_serialize(&TestKey { size: 3 }).expect("key");
    let entry = reopened
        .lookup(Namespace::new("t").expect("ns"), &key)
        .expect("the whole tune reached the file");
    assert_eq!(entry.candidates().len(), 5);
}

/// Issue 10: a key's measurements and its candidate set go to disk in one record, one durable
/// write, whatever the number of candidates (before, one record and one sync per candidate
/// plus one for the set, each record repeating the entry so far).
#[test]
fn a_tuned_key_is_one_journal_record() {
    use cache_core::cache_format::{Limits, read_journal_header, scan_records};
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("c.tcache");
    let cache = open(&path);
    let op = TestOp::new(
        "t",
        &[("a", 50), ("b", 60), ("c", 70), ("d", 80), ("e", 90)],
    );
    let t = tuned(&cache, op, quick());
    t.get(&TestKey { size: 1 }).expect("first key"); // writes the snapshot
    t.get(&TestKey { size: 2 }).expect("second key"); // appends
    let journal = std::fs::read(dir.path().join("c.tcache.journal")).expect("journal");
    let limits = Limits::default();
    let (_, _, start) = read_journal_header(&journal, &limits).expect("header");
    let scan = scan_records(&journal, start, &limits);
    assert_eq!(scan.records.len(), 1, "one record for the second key");
    let second = cache.lookup(t.namespace(), &cache_key(2)).expect("stored");
    assert_eq!(second.candidates().len(), 5);
}

/// `run` on a hit borrows the choice from the dispatch table; a failure there still demotes
/// the winner, records it and runs the runner-up, as on a miss.
#[test]
fn a_winner_that_fails_on_a_hit_falls_back_too() {
    let dir = tempfile::tempdir().expect("dir");
    let cache = open(&dir.path().join("c.tcache"));
    let t = tuned(&cache, three(), quick());
    assert_eq!(t.get(&K).expect("tuned").candidate().algorithm, "fast");
    let hits = t.stats().hits;
    let ran = t.run(&K, |h| Ok(h.name.clone())).expect("runs");
    assert_eq!(ran, "fast");
    assert_eq!(t.stats().hits, hits + 1, "a hit");
    let launched = t
        .run(&K, |h| {
            if h.name == "fast" {
                Err("CUDA_ERROR_ILLEGAL_ADDRESS".into())
            } else {
                Ok(h.name.clone())
            }
        })
        .expect("the runner-up runs");
    assert_eq!(launched, "mid");
    assert_eq!(t.stats().failures, 1);
    assert_eq!(t.get(&K).expect("choice").candidate().algorithm, "mid");
}
