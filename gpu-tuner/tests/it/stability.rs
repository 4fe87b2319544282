//! `Tuned::stability` on a synthetic operation with known true times and injected noise: the
//! flip rate and regret it reports are the ones the injection implies.

use gpu_tuner::OpError;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cache_core::Store as _;
use cache_core::cache_format::{Candidate, CandidateId, Entry, Fingerprint, Origin, Stats};
use gpu_tuner::{Operation, Tuner};
use serde::Serialize;

use crate::support::{open, quick};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
struct Case {
    case: u32,
}

/// Two candidates whose true times depend on the case, each sample off by up to ±`noise`
/// (uniform, from a fixed-seed generator).
struct Noisy {
    noise: f64,
    state: AtomicU64,
}

fn truth(case: u32, name: &str) -> f64 {
    match (case, name) {
        (1, "a") => 100.0,
        (1, _) => 300.0,
        (2, _) => 100.0,
        (_, "a") => 100.0,
        _ => 150.0,
    }
}

impl Noisy {
    fn uniform(&self) -> f64 {
        let mut x = self.state.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.state.store(x, Ordering::Relaxed);
        (x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }
}

impl Operation for Noisy {
    type Key = Case;
    type Handle = (u32, String);
    type Problem = ();

    fn namespace(&self) -> &str {
        "noisy"
    }
    fn candidates(&self) -> Vec<CandidateId> {
        vec![CandidateId::new("a", &[]), CandidateId::new("b", &[])]
    }
    fn prepare(&self, c: &CandidateId, key: &Case) -> Result<(u32, String), OpError> {
        Ok((key.case, c.algorithm.clone()))
    }
    fn problem(&self, key: &Case) -> Result<(), OpError> {
        if key.case == 9 {
            return Err("case 9 does not fit this machine".into());
        }
        Ok(())
    }
    fn run(&self, _h: &(u32, String), _p: &mut ()) -> Result<(), OpError> {
        Ok(())
    }
    fn time(&self, h: &(u32, String), _p: &mut (), n: u32) -> Result<Duration, OpError> {
        let us = truth(h.0, &h.1) * (1.0 + self.noise * self.uniform());
        Ok(Duration::from_nanos((us * 1000.0) as u64) * n)
    }
}

#[test]
fn stability_reports_the_flip_rate_and_regret_the_injected_noise_implies() {
    let dir = tempfile::tempdir().expect("dir");
    let cache = open(&dir.path().join("c.tcache"));
    let op = Noisy {
        noise: 0.05,
        state: AtomicU64::new(0x9e37_79b9_7f4a_7c15),
    };
    let tuned = Tuner::new(Arc::clone(&cache))
        .register(op, quick())
        .expect("register");
    // Case 3 tuned as usual; case 1 stored with a wrong winner (b, three times slower in
    // truth); case 2 never tuned (its most frequent winner stands in).
    tuned.get(&Case { case: 3 }).expect("tuned");
    let poisoned = tuned.get(&Case { case: 1 }).expect("tuned").key().clone();
    let stats = |median: f64| Stats {
        median_ns: median,
        min_ns: median,
        spread_ns: 0.0,
        samples: 9,
    };
    cache.put(
        tuned.namespace(),
        Entry::new(
            poisoned,
            Fingerprint::default(),
            Origin::Measured("poisoned".into()),
            u64::MAX / 2,
            [
                Candidate::measured("a", Default::default(), stats(300_000.0)),
                Candidate::measured("b", Default::default(), stats(1_000.0)),
            ],
        ),
    );
    let report = tuned
        .stability(&[Case { case: 1 }, Case { case: 2 }, Case { case: 3 }], 40)
        .expect("measured");
    let (wrong, tie, clear) = (&report.keys[0], &report.keys[1], &report.keys[2]);
    // b is stored but a wins every run: every run flips, and b's regret is 300/100 - 1.
    assert_eq!(wrong.stored, Some(CandidateId::new("b", &[])));
    assert_eq!(wrong.flip_rate, 1.0);
    assert!((wrong.regret - 2.0).abs() < 0.1, "{wrong:?}");
    // Equal true times: a coin flip per run (40 runs: within three standard deviations of
    // one half), and no regret beyond the noise.
    assert!((tie.flip_rate - 0.5).abs() <= 0.24, "{tie:?}");
    assert!(tie.regret < 0.03, "{tie:?}");
    // 100 against 150 with ±5% noise never flips, and the stored winner is the best.
    assert_eq!((clear.flip_rate, clear.regret), (0.0, 0.0), "{clear:?}");
    assert_eq!(clear.stored, Some(CandidateId::new("a", &[])));
    assert!((report.geomean_regret() - ((3.0f64 * 1.0 * 1.0).powf(1.0 / 3.0) - 1.0)).abs() < 0.05);
    assert_eq!(report.worst_flip_rate(), 1.0);
    // Nothing was recorded: the poisoned entry is still what is stored.
    let stored = cache
        .get(tuned.namespace(), &wrong.key.fingerprint())
        .expect("stored");
    assert_eq!(stored.best().expect("measured").id.algorithm, "b");
}

/// Hardening IV, case 13: one stored key that cannot be measured here made the whole report an
/// error; it is skipped, said with why, and the other keys are still measured.
#[test]
fn a_key_that_cannot_be_measured_is_skipped_and_the_others_reported() {
    let dir = tempfile::tempdir().expect("dir");
    let cache = open(&dir.path().join("c.tcache"));
    let op = Noisy {
        noise: 0.0,
        state: AtomicU64::new(1),
    };
    let tuned = Tuner::new(Arc::clone(&cache))
        .register(op, quick())
        .expect("register");
    tuned.get(&Case { case: 3 }).expect("tuned");
    let report = tuned
        .stability(&[Case { case: 9 }, Case { case: 3 }], 3)
        .expect("a report");
    assert_eq!(report.keys.len(), 1, "{report:?}");
    assert_eq!(report.keys[0].stored, Some(CandidateId::new("a", &[])));
    assert_eq!(report.skipped.len(), 1, "{report:?}");
    let (key, why) = &report.skipped[0];
    assert!(key.contains('9'), "{key}");
    assert!(why.to_string().contains("does not fit"), "{why}");
}
