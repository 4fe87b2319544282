//! Loose matching after an upgrade: a key measured before another family's version changed is
//! served its winner at once (checked, provisional, re-timed in the background); a bump of the
//! winner's own family's version, or a winner that fails its check here, tunes the key.

use std::sync::Arc;
use std::time::Duration;

use cache_core::Cache;
use cache_core::cache_format::{Fields, Scope, Value};
use gpu_tuner::{OpConfig, Tuner};

use crate::support::{Behaviour, TestKey, TestOp, builder, quick};

fn scope(a: &str, b: &str) -> Scope {
    Scope::new(Fields::from([
        ("device".to_owned(), Value::from("test device")),
        ("version.a".to_owned(), Value::from(a)),
        ("version.b".to_owned(), Value::from(b)),
    ]))
}

/// Family `a` (the fastest), `b` and `c`; the log says what was measured or checked.
fn op() -> TestOp {
    TestOp::new("loose", &[("a", 300), ("b", 600), ("c", 900)])
}

fn open(path: &std::path::Path, scope: Scope) -> Arc<Cache> {
    Arc::new(builder(path).scope(scope).open())
}

fn config() -> OpConfig {
    OpConfig {
        retime_top: 2,
        ..quick()
    }
}

/// Tunes `key` under the scope before any upgrade (a wins) and saves it.
fn tuned_before_upgrade(path: &std::path::Path, key: &TestKey) {
    let cache = open(path, scope("1", "1"));
    let t = Tuner::new(Arc::clone(&cache))
        .register(op(), config())
        .expect("op");
    assert_eq!(t.get(key).expect("tuned").candidate().algorithm, "a");
    cache_core::Store::flush(cache.as_ref()).expect("saved");
}

#[test]
fn another_familys_upgrade_serves_the_winner_at_once_and_re_times_it() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("c.tcache");
    let key = TestKey { size: 1 };
    tuned_before_upgrade(&path, &key);
    // Family b's version changes: a's result still holds.
    let cache = open(&path, scope("1", "2"));
    let measured = op();
    let t = Tuner::new(Arc::clone(&cache))
        .register(measured.clone(), config())
        .expect("op");
    let choice = t.get(&key).expect("loose");
    assert_eq!(choice.candidate().algorithm, "a");
    assert!(choice.is_provisional());
    assert_eq!(choice.loose_from(), Some(&scope("1", "1")));
    assert_eq!(t.stats().loose_hits, 1);
    // Then the background re-times the stored top two for this scope, and the next call
    // after it is a plain hit.
    assert!(t.wait_background(Duration::from_secs(30)));
    assert_eq!(
        measured.measured(),
        ["a", "a", "b"],
        "checked once, then re-timed"
    );
    let after = t.get(&key).expect("hit");
    assert!(!after.is_provisional() && after.loose_from().is_none());
    assert_eq!(after.candidate().algorithm, "a");
}

#[test]
fn the_winners_own_upgrade_or_a_failed_check_tunes_the_key() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("c.tcache");
    let key = TestKey { size: 1 };
    tuned_before_upgrade(&path, &key);
    // a's own version changes: no loose hit; the stored top two are re-timed now.
    let cache = open(&path, scope("2", "1"));
    let measured = op();
    let t = Tuner::new(Arc::clone(&cache))
        .register(measured.clone(), config())
        .expect("op");
    let choice = t.get(&key).expect("tuned");
    assert!(!choice.is_provisional() && choice.loose_from().is_none());
    assert_eq!(t.stats().loose_hits, 0);
    assert_eq!(measured.measured(), ["a", "b"]);
    drop((t, cache));
    // b's version changes, but a now computes a wrong result here: its check fails, and the
    // key is tuned (a is measured and refused, b wins).
    let cache = open(&path, scope("1", "3"));
    let mut broken = TestOp::new("loose", &[("b", 600), ("c", 900)]);
    broken.candidates.insert(
        0,
        (
            cache_core::cache_format::CandidateId::new("a", &[]),
            Behaviour {
                micros: 300,
                wrong: true,
                ..Behaviour::default()
            },
        ),
    );
    let t = Tuner::new(Arc::clone(&cache))
        .register(broken, config())
        .expect("op");
    let choice = t.get(&key).expect("tuned");
    assert_eq!(choice.candidate().algorithm, "b");
    assert!(choice.loose_from().is_none());
    assert_eq!(t.stats().loose_hits, 0);
}
