//! A new device beside one that measured the key (a new GPU in a fleet whose cache holds an
//! older one's results): a `TuneNow` miss measures the best five of the other device's
//! ranking and every candidate it never measured, not every candidate, and the key is then
//! complete; `transfer_top: 0` measures them all; a device that ranks them the other way round
//! (unlike this one, broken or poisoned) costs a full tune, never a worse winner.

use std::sync::Arc;

use cache_core::Store as _;
use cache_core::cache_format::{Fields, Scope, Value};
use gpu_tuner::{OpConfig, Tuner};

use crate::support::{Behaviour, TestKey, TestOp, builder, quick};

const K: TestKey = TestKey { size: 64 };

fn device(name: &str) -> Scope {
    Scope::new(Fields::from([("device".to_owned(), Value::from(name))]))
}

/// Twelve candidates, `k0` fastest (100 µs) to `k11` slowest (1.2 ms), on every device.
fn twelve() -> TestOp {
    twelve_timed(|i| 100 * (i + 1))
}

/// Twelve candidates `k0` to `k11`, `k<i>` taking `micros(i)`.
fn twelve_timed(micros: impl Fn(u64) -> u64) -> TestOp {
    let names: Vec<String> = (0..12).map(|i| format!("k{i}")).collect();
    let candidates: Vec<(&str, u64)> = names
        .iter()
        .zip(0u64..)
        .map(|(n, i)| (n.as_str(), micros(i)))
        .collect();
    TestOp::new("t", &candidates)
}

fn tune_on(path: &std::path::Path, scope: &str, op: &TestOp, config: OpConfig) -> String {
    let cache = Arc::new(builder(path).scope(device(scope)).open());
    let t = Tuner::new(Arc::clone(&cache))
        .register(op.clone(), config)
        .expect("register");
    let choice = t.get(&K).expect("a choice");
    cache.flush().expect("flush");
    choice.candidate().algorithm.clone()
}

#[test]
fn a_new_device_measures_the_best_five_of_another_devices_ranking() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("c.tcache");
    let op = twelve();
    assert_eq!(tune_on(&path, "A100", &op, quick()), "k0");
    assert_eq!(
        op.measured().len(),
        12,
        "the first device measures them all"
    );

    let op = twelve();
    assert_eq!(tune_on(&path, "H100", &op, quick()), "k0");
    let measured = op.measured();
    assert_eq!(measured.len(), 5, "{measured:?}");
    assert!(measured.contains(&"k0".to_owned()), "{measured:?}");
    assert!(
        !measured.contains(&"k11".to_owned()),
        "their slowest: {measured:?}"
    );

    let op = twelve();
    assert_eq!(tune_on(&path, "H100", &op, quick()), "k0");
    assert!(op.measured().is_empty(), "complete on the new device");

    // A candidate the other devices never measured is measured too.
    let op = twelve().with(
        "new",
        Behaviour {
            micros: 50,
            ..Behaviour::default()
        },
    );
    assert_eq!(tune_on(&path, "L40", &op, quick()), "new");
    let measured = op.measured();
    assert_eq!(measured.len(), 6, "{measured:?}");
    assert!(measured.contains(&"new".to_owned()));

    let op = twelve();
    let every = OpConfig {
        transfer_top: 0,
        ..quick()
    };
    tune_on(&path, "V100", &op, every);
    assert_eq!(op.measured().len(), 12, "transfer_top 0: every candidate");
}

#[test]
fn a_device_that_ranks_the_other_way_round_costs_a_full_tune_not_a_worse_winner() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("c.tcache");
    // There, k11 is fastest and k0 slowest.
    let reversed = twelve_timed(|i| 100 * (12 - i));
    assert_eq!(tune_on(&path, "MI300", &reversed, quick()), "k11");
    let op = twelve();
    assert_eq!(tune_on(&path, "H100", &op, quick()), "k0", "the true best");
    let measured = op.measured();
    // The five it ranks best (k11..k7), measured here in the opposite order, then the other
    // seven and the leader again.
    assert_eq!(measured.len(), 13, "{measured:?}");
    assert!(measured.contains(&"k0".to_owned()), "{measured:?}");
    let op = twelve();
    assert_eq!(tune_on(&path, "H100", &op, quick()), "k0");
    assert!(op.measured().is_empty(), "complete");
}
