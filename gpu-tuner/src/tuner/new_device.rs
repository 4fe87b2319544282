//! A key this device has no result for, which other devices measured (a new GPU beside older
//! ones): what to measure instead of every candidate. A pure function of those devices'
//! entries and the current candidates, so every case is a unit test.

use cache_core::cache_format::{CandidateId, Entry, Scope};

use crate::predict::Predictor;

/// The candidates to measure for a key that only other devices measured: the best `top` of
/// their ranking (the transfer prediction's [`crate::predict::Prediction::top`], the same
/// list `tunecache explain` prints), then every current candidate none of them measured
/// (nothing is known of it here). `None`, for the miss policy to decide, when `top` is 0,
/// when no other device measured a current candidate, when their rankings disagree (the
/// transfer declines), or when the list would hold every candidate anyway.
pub(super) fn to_measure(
    devices: &[(Scope, Entry)],
    current: &[CandidateId],
    top: usize,
) -> Option<Vec<CandidateId>> {
    if top == 0 {
        return None;
    }
    let (_, first) = devices.first()?;
    let target = first.key().fields();
    let prediction =
        Predictor::default().transfer(target, devices.iter().map(|(_, e)| e), current)?;
    let mut list = prediction.top(top);
    for (id, slowdown) in &prediction.ranking {
        if slowdown.is_none() && !list.contains(id) {
            list.push(id.clone());
        }
    }
    (list.len() < current.len()).then_some(list)
}

#[cfg(test)]
mod tests {
    use cache_core::cache_format::{Candidate, Fields, Fingerprint, Key, Origin, Stats, Value};

    use super::*;

    fn id(name: &str) -> CandidateId {
        CandidateId::new(name, &[])
    }

    fn timed(name: &str, median: f64) -> Candidate {
        let stats = Stats {
            median_ns: median,
            min_ns: median,
            spread_ns: 0.0,
            samples: 5,
        };
        Candidate::measured(name, Fields::new(), stats)
    }

    fn on(device: &str, candidates: Vec<Candidate>) -> (Scope, Entry) {
        let scope = Scope::new(Fields::from([("device".to_owned(), Value::from(device))]));
        let key = Key::new(Fields::from([("m".to_owned(), Value::Int(64))]));
        let entry = Entry::new(
            key,
            Fingerprint::default(),
            Origin::Measured("test".into()),
            1,
            candidates,
        );
        (scope, entry)
    }

    fn names(n: usize) -> Vec<CandidateId> {
        (0..n).map(|i| id(&format!("c{i}"))).collect()
    }

    #[test]
    fn the_best_few_of_another_devices_ranking_are_measured() {
        let current = names(12);
        // c11 fastest there, c0 slowest.
        let a100 = on(
            "A100",
            (0..12)
                .map(|i| timed(&format!("c{i}"), 100.0 - i as f64))
                .collect(),
        );
        let list = to_measure(&[a100], &current, 5).expect("a list");
        assert_eq!(list.len(), 5, "{list:?}");
        assert_eq!(list[0], id("c11"), "their best first");
        assert!(list.iter().all(|c| current.contains(c)));
        assert!(!list.contains(&id("c0")), "their worst is not measured");
    }

    #[test]
    fn a_candidate_no_device_measured_is_measured_too() {
        let current = names(10);
        let a100 = on(
            "A100",
            (0..8)
                .map(|i| timed(&format!("c{i}"), 10.0 + i as f64))
                .collect(),
        );
        let list = to_measure(&[a100], &current, 3).expect("a list");
        assert_eq!(list.len(), 5, "{list:?}");
        assert!(
            list.contains(&id("c8")) && list.contains(&id("c9")),
            "{list:?}"
        );
    }

    #[test]
    fn nothing_to_go_on_leaves_the_miss_to_its_policy() {
        let current = names(6);
        let a100 = on("A100", vec![timed("c0", 1.0), timed("c1", 2.0)]);
        assert_eq!(
            to_measure(std::slice::from_ref(&a100), &current, 0),
            None,
            "0: off"
        );
        assert_eq!(to_measure(&[], &current, 5), None, "no other device");
        let foreign = on("A100", vec![timed("gone", 1.0)]);
        assert_eq!(
            to_measure(&[foreign], &current, 5),
            None,
            "no current candidate measured elsewhere"
        );
        assert_eq!(
            to_measure(&[a100], &names(3), 5),
            None,
            "the list would be every candidate"
        );
    }

    #[test]
    fn devices_that_rank_the_other_way_round_are_not_followed() {
        let current = names(8);
        let up = on(
            "A100",
            (0..8)
                .map(|i| timed(&format!("c{i}"), 10.0 + i as f64))
                .collect(),
        );
        let down = on(
            "V100",
            (0..8)
                .map(|i| timed(&format!("c{i}"), 20.0 - i as f64))
                .collect(),
        );
        assert_eq!(to_measure(&[up, down], &current, 3), None);
    }
}
