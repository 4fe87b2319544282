//! Test support: a test operation whose candidates take known times, caches in temporary
//! directories, and child processes (this test binary re-executed in a role).

use gpu_tuner::OpError;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cache_core::cache_format::{Fields, Scope, Value};
use cache_core::cache_migrate::Migrations;
use cache_core::{Cache, CacheBuilder};
use gpu_tuner::{CandidateId, MeasureConfig, OpConfig, Operation};
use serde::Serialize;

/// A key of the test operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub(crate) struct TestKey {
    pub(crate) size: u32,
}

/// How a test candidate behaves.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Behaviour {
    /// Busy-waits this long per run.
    pub(crate) micros: u64,
    /// Fails to prepare.
    pub(crate) broken: bool,
    /// Computes a wrong result.
    pub(crate) wrong: bool,
}

/// A test double of an operation: candidates busy-wait for fixed times. It counts which
/// candidates it measured in this process.
#[derive(Clone)]
pub(crate) struct TestOp {
    pub(crate) namespace: &'static str,
    pub(crate) candidates: Vec<(CandidateId, Behaviour)>,
    pub(crate) measured: Arc<Mutex<Vec<String>>>,
}

impl TestOp {
    pub(crate) fn new(namespace: &'static str, candidates: &[(&str, u64)]) -> Self {
        TestOp {
            namespace,
            candidates: candidates
                .iter()
                .map(|(name, micros)| {
                    (
                        CandidateId::new(*name, &[]),
                        Behaviour {
                            micros: *micros,
                            ..Behaviour::default()
                        },
                    )
                })
                .collect(),
            measured: Arc::new(Mutex::new(Vec::new())),
        }
    }

    pub(crate) fn with(mut self, name: &str, behaviour: Behaviour) -> Self {
        self.candidates
            .push((CandidateId::new(name, &[]), behaviour));
        self
    }

    pub(crate) fn measured(&self) -> Vec<String> {
        let mut m = self.measured.lock().expect("not poisoned").clone();
        m.sort();
        m
    }
}

#[derive(Debug)]
pub(crate) struct TestHandle {
    pub(crate) name: String,
    micros: u64,
    wrong: bool,
}

fn spin(micros: u64) {
    let until = Instant::now() + Duration::from_micros(micros);
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

impl Operation for TestOp {
    type Key = TestKey;
    type Handle = TestHandle;
    type Problem = ();

    fn namespace(&self) -> &str {
        self.namespace
    }

    fn candidates(&self) -> Vec<CandidateId> {
        self.candidates.iter().map(|(c, _)| c.clone()).collect()
    }

    fn prepare(&self, candidate: &CandidateId, _key: &TestKey) -> Result<TestHandle, OpError> {
        let (_, b) = self
            .candidates
            .iter()
            .find(|(c, _)| c == candidate)
            .ok_or_else(|| format!("unknown candidate {candidate}"))?;
        if b.broken {
            return Err("does not compile".into());
        }
        Ok(TestHandle {
            name: candidate.algorithm.clone(),
            micros: b.micros,
            wrong: b.wrong,
        })
    }

    fn problem(&self, _key: &TestKey) -> Result<(), OpError> {
        Ok(())
    }

    fn run(&self, handle: &TestHandle, _problem: &mut ()) -> Result<(), OpError> {
        spin(handle.micros);
        Ok(())
    }

    /// Runs for real (tuning takes the time it would), but reports each candidate's declared
    /// time: what these tests check is what the tuner does with measurements, and a loaded
    /// machine (CI runs tests in parallel on two cores) must not turn a 300 µs candidate
    /// into a slower one than an 800 µs candidate by preempting it.
    fn time(
        &self,
        handle: &TestHandle,
        problem: &mut (),
        iterations: u32,
    ) -> Result<Duration, OpError> {
        for _ in 0..iterations {
            self.run(handle, problem)?;
        }
        Ok(Duration::from_micros(handle.micros) * iterations)
    }

    fn verify(&self, handle: &TestHandle, _problem: &mut ()) -> Result<(), OpError> {
        // Called once per measured candidate: the count of what was measured.
        self.measured
            .lock()
            .expect("not poisoned")
            .push(handle.name.clone());
        if handle.wrong {
            Err("42 != 41".into())
        } else {
            Ok(())
        }
    }
}

/// Quick measurement settings for tests.
pub(crate) fn quick() -> OpConfig {
    OpConfig {
        measure: MeasureConfig {
            warmup: Duration::ZERO,
            samples: 3,
            min_sample: Duration::from_micros(1),
            max_per_candidate: Duration::from_millis(500),
            early_stop_after: 3,
            early_stop_ratio: 1.5,
            // The tests count measurements: near-ties are not measured again.
            confirm_rounds: 0,
        },
        wait: Duration::from_secs(60),
        ..OpConfig::default()
    }
}

pub(crate) fn scope(driver: &str) -> Scope {
    Scope::new(Fields::from([
        ("device".to_owned(), Value::from("test device")),
        ("driver".to_owned(), Value::from(driver)),
    ]))
}

pub(crate) fn builder(path: &Path) -> CacheBuilder {
    Cache::builder(Migrations::new("tuner-test", 1))
        .file(path)
        .ignore_env()
        .save_delay(Duration::from_millis(10))
        .refresh_interval(None)
        .scope(scope("1"))
}

pub(crate) fn open(path: &Path) -> Arc<Cache> {
    Arc::new(builder(path).open())
}

// ---- child processes (the shared harness of test-support) ----

pub(crate) use test_support::child::{ChildGuard, MARK, as_map};

pub(crate) fn spawn(role: &str, path: &Path, args: &[&str]) -> ChildGuard {
    test_support::child::spawn(role, path, args, &[])
}

/// The child's protocol messages, until it exits.
pub(crate) fn messages(child: &mut ChildGuard) -> Vec<String> {
    test_support::child::lines(child)
}
