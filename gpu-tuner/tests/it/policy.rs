//! The measurement policy recorded with every result: the operation's timer and the tuner's
//! warm-up, samples and interleaving; a tuner whose policy differs measures the key again, and
//! the new results lead the ranking.

use gpu_tuner::OpError;
use std::sync::Arc;
use std::time::Duration;

use cache_core::Store as _;
use cache_core::cache_format::{CandidateId, Fields, Value};
use gpu_tuner::{Operation, Tuner};

use crate::support::{TestHandle, TestKey, TestOp, open, quick};

/// A test operation that says it times with another clock.
struct OtherClock(TestOp);

impl Operation for OtherClock {
    type Key = TestKey;
    type Handle = TestHandle;
    type Problem = ();
    fn namespace(&self) -> &str {
        self.0.namespace()
    }
    fn candidates(&self) -> Vec<CandidateId> {
        self.0.candidates()
    }
    fn prepare(&self, c: &CandidateId, key: &TestKey) -> Result<TestHandle, OpError> {
        self.0.prepare(c, key)
    }
    fn problem(&self, key: &TestKey) -> Result<(), OpError> {
        self.0.problem(key)
    }
    fn run(&self, h: &TestHandle, p: &mut ()) -> Result<(), OpError> {
        self.0.run(h, p)
    }
    fn time(&self, h: &TestHandle, p: &mut (), n: u32) -> Result<Duration, OpError> {
        self.0.time(h, p, n)
    }
    fn verify(&self, h: &TestHandle, p: &mut ()) -> Result<(), OpError> {
        self.0.verify(h, p)
    }
    fn measure_policy(&self) -> Fields {
        Fields::from([("timer".to_owned(), Value::from("cuda-graph"))])
    }
}

#[test]
fn results_record_their_policy_and_another_policy_measures_again() {
    let dir = tempfile::tempdir().expect("dir");
    let cache = open(&dir.path().join("c.tcache"));
    let key = TestKey { size: 1 };
    let wall = TestOp::new("policy", &[("a", 300), ("b", 600)]);
    let t = Tuner::new(Arc::clone(&cache))
        .register(wall.clone(), quick())
        .expect("op");
    let fp = t.get(&key).expect("tuned").key().fingerprint();
    let entry = cache.get(t.namespace(), &fp).expect("stored");
    for c in entry.candidates() {
        let p = c.policy.as_ref().expect("recorded");
        assert_eq!(p.get("timer"), Some(&Value::from("wall")));
        assert_eq!(p.get("samples"), Some(&Value::Int(3)), "quick() takes 3");
        assert_eq!(p.get("interleaved"), Some(&Value::Bool(true)));
        assert!(p.contains_key("warmup_ns"));
    }
    // Another clock: the stored results are not comparable, so both are measured again, and
    // the new ones (b now faster by the other clock) lead the ranking.
    let other = TestOp::new("policy", &[("a", 900), ("b", 200)]);
    let t2 = Tuner::new(Arc::clone(&cache))
        .register(OtherClock(other.clone()), quick())
        .expect("op");
    assert_eq!(t2.get(&key).expect("tuned").candidate().algorithm, "b");
    assert_eq!(other.measured(), ["a", "b"]);
    let entry = cache.get(t2.namespace(), &fp).expect("stored");
    let best = entry.best().expect("measured");
    assert_eq!(best.id.algorithm, "b");
    assert_eq!(
        best.policy.as_ref().and_then(|p| p.get("timer")),
        Some(&Value::from("cuda-graph"))
    );
}
