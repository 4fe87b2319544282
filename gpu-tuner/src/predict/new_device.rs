//! A key this device has no result for, which other devices measured (a new GPU beside older
//! ones): what to measure instead of every candidate, and whether what was measured here
//! bears their ranking out. Pure functions of those devices' entries, the current candidates
//! and the measurements, so every case is a unit test.

use cache_core::cache_format::{CandidateId, Entry};

use super::evaluate::{Pick, pick, truth};
use super::{Predictor, Query, Voters};

/// Measured within this factor of each other, the candidates' order says nothing.
const SPAN: f64 = 1.1;

/// At or below this rank correlation the measurements contradict the ranking. Chosen from 0,
/// -0.5 and -0.8 on PyTorch's published mm timings, an H100 from an A100's results
/// (`tunecache evaluate --transfer-from`, docs/rust.md): 0 re-tuned many keys whose best
/// five were merely noisy; -0.8 let through rankings nearly the other way round.
const DISAGREE_AT: f64 = -0.5;

/// Candidates with their predicted slowdowns against the predicted best.
pub(crate) type Slowdowns = Vec<(CandidateId, f64)>;

/// The candidates to measure for a key that only other devices measured: the best `top` of
/// their ranking (the transfer prediction's [`crate::predict::Prediction::top`], the same
/// list `tunecache explain` prints), then every current candidate none of them measured
/// (nothing is known of it here). `None`, for the miss policy to decide, when `top` is 0,
/// when no other device measured a current candidate, when their rankings disagree (the
/// transfer declines), or when the list would hold every candidate anyway. With the list,
/// the predicted slowdowns of those in it the other devices measured (for [`agrees`]).
pub(crate) fn to_measure(
    devices: &[&Entry],
    current: &[CandidateId],
    top: usize,
) -> Option<(Vec<CandidateId>, Slowdowns)> {
    if top == 0 {
        return None;
    }
    let first = devices.first()?;
    let target = first.key().fields();
    let prediction = Predictor::default().predict(&Query {
        target,
        current,
        voters: Voters::Devices {
            tuned: devices,
            measured: &[],
        },
    })?;
    let mut list = prediction.top(top);
    for (id, slowdown) in &prediction.ranking {
        if slowdown.is_none() && !list.contains(id) {
            list.push(id.clone());
        }
    }
    if list.len() >= current.len() {
        return None;
    }
    let predicted = prediction
        .ranking
        .iter()
        .filter(|(id, _)| list.contains(id))
        .filter_map(|(id, s)| s.map(|s| (id.clone(), s)))
        .collect();
    Some((list, predicted))
}

/// Whether the medians measured here (`measured`) bear out the other devices' predicted
/// slowdowns (`predicted`): false only when, over the candidates that have both (at least
/// three; fewer tell nothing), they differ by more than [`SPAN`] and rank them the other way
/// round (a Spearman correlation at or below [`DISAGREE_AT`]). A ranking from a device unlike
/// this one, a broken or a poisoned one, ranks the best few measured here the other way
/// round; the key is then measured whole.
pub(crate) fn agrees(predicted: &[(CandidateId, f64)], measured: &[(CandidateId, f64)]) -> bool {
    let pairs: Vec<(f64, f64)> = predicted
        .iter()
        .filter_map(|(id, p)| {
            let m = measured.iter().find(|(m, _)| m == id)?.1;
            (p.is_finite() && m.is_finite()).then_some((*p, m))
        })
        .collect();
    if pairs.len() < 3 {
        return true;
    }
    // Within a few percent of each other they are near-ties: their order is noise.
    let (lo, hi) = pairs
        .iter()
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), (_, m)| {
            (lo.min(*m), hi.max(*m))
        });
    if lo > 0.0 && hi / lo < SPAN {
        return true;
    }
    let a = ranks(pairs.iter().map(|(p, _)| *p));
    let b = ranks(pairs.iter().map(|(_, m)| *m));
    correlation(&a, &b) > DISAGREE_AT
}

/// For an evaluation ([`super::evaluate::NEW_DEVICE`]): what a `TuneNow` miss on a device new to the key does: the best
/// five of the other device's ranking for this key, then every candidate (and the leader
/// again) if their medians here rank them nearly the other way round; every candidate when the other
/// device lacks the key or the transfer declines.
pub(super) fn evaluate(entry: &Entry, train: &[&Entry], current: &[CandidateId]) -> Pick {
    let there: Vec<&Entry> = train
        .iter()
        .copied()
        .filter(|e| e.fingerprint() == entry.fingerprint())
        .collect();
    let Some((list, predicted)) = to_measure(&there, current, 5) else {
        return pick(entry, current, current, true);
    };
    let measured: Vec<(CandidateId, f64)> = list
        .iter()
        .filter_map(|c| truth(entry, c).map(|t| (c.clone(), t)))
        .collect();
    if agrees(&predicted, &measured) {
        return pick(entry, &list, current, true);
    }
    // Every candidate, and the leader of the five measured again beside them.
    let leader = measured
        .iter()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(c, _)| c.clone());
    let mut all = current.to_vec();
    all.extend(leader);
    pick(entry, &all, current, true)
}

/// The rank of each value (1 for the smallest), ties given the mean of their ranks.
fn ranks(values: impl Iterator<Item = f64>) -> Vec<f64> {
    let values: Vec<f64> = values.collect();
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&i, &j| values[i].total_cmp(&values[j]));
    let mut out = vec![0.0; values.len()];
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && values[order[j + 1]] == values[order[i]] {
            j += 1;
        }
        let mean = (i + j) as f64 / 2.0 + 1.0;
        for &k in &order[i..=j] {
            out[k] = mean;
        }
        i = j + 1;
    }
    out
}

/// Pearson's correlation of `a` and `b` (0 when either does not vary).
fn correlation(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len() as f64;
    let (ma, mb) = (a.iter().sum::<f64>() / n, b.iter().sum::<f64>() / n);
    let cov: f64 = a.iter().zip(b).map(|(x, y)| (x - ma) * (y - mb)).sum();
    let va: f64 = a.iter().map(|x| (x - ma).powi(2)).sum();
    let vb: f64 = b.iter().map(|y| (y - mb).powi(2)).sum();
    if va == 0.0 || vb == 0.0 {
        return 0.0;
    }
    cov / (va * vb).sqrt()
}

#[cfg(test)]
mod tests {
    use cache_core::cache_format::{
        Candidate, Fields, Fingerprint, Key, Origin, Scope, Stats, Value,
    };

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
        let (list, predicted) = to_measure(&[&a100.1], &current, 5).expect("a list");
        assert_eq!(list.len(), 5, "{list:?}");
        assert_eq!(predicted.len(), 5, "{predicted:?}");
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
        let (list, predicted) = to_measure(&[&a100.1], &current, 3).expect("a list");
        assert_eq!(list.len(), 5, "{list:?}");
        assert_eq!(predicted.len(), 3, "never measured there: no prediction");
        assert!(
            list.contains(&id("c8")) && list.contains(&id("c9")),
            "{list:?}"
        );
    }

    #[test]
    fn nothing_to_go_on_leaves_the_miss_to_its_policy() {
        let current = names(6);
        let a100 = on("A100", vec![timed("c0", 1.0), timed("c1", 2.0)]);
        assert_eq!(to_measure(&[&a100.1], &current, 0), None, "0: off");
        assert_eq!(to_measure(&[], &current, 5), None, "no other device");
        let foreign = on("A100", vec![timed("gone", 1.0)]);
        assert_eq!(
            to_measure(&[&foreign.1], &current, 5),
            None,
            "no current candidate measured elsewhere"
        );
        assert_eq!(
            to_measure(&[&a100.1], &names(3), 5),
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
        assert_eq!(to_measure(&[&up.1, &down.1], &current, 3), None);
    }

    #[test]
    fn measurements_that_rank_the_list_the_other_way_round_disagree() {
        let ids = names(5);
        let predicted: Vec<(CandidateId, f64)> = ids
            .iter()
            .zip([1.0, 1.05, 1.1, 1.3, 1.6])
            .map(|(id, s)| (id.clone(), s))
            .collect();
        let measured = |medians: [f64; 5]| -> Vec<(CandidateId, f64)> {
            ids.iter().cloned().zip(medians).collect()
        };
        assert!(agrees(
            &predicted,
            &measured([10.0, 11.0, 12.0, 13.0, 14.0])
        ));
        assert!(
            agrees(&predicted, &measured([11.0, 10.0, 12.0, 14.0, 13.0])),
            "near-ties swapped: still agreed"
        );
        assert!(!agrees(
            &predicted,
            &measured([14.0, 13.0, 12.0, 11.0, 10.0])
        ));
        assert!(
            agrees(&predicted, &measured([12.0, 11.0, 11.5, 10.9, 11.8])),
            "within 10% of each other: near-ties, whatever their order"
        );
        assert!(
            !agrees(&predicted, &measured([13.0, 14.0, 12.0, 11.0, 10.0])),
            "nearly the other way round"
        );
        assert!(
            agrees(&predicted, &measured([12.0, 10.0, 14.0, 11.0, 13.0])),
            "a weak disagreement is noise"
        );
        assert!(
            agrees(&predicted[..2], &measured([14.0, 13.0, 12.0, 11.0, 10.0])),
            "two tell nothing"
        );
        let failed_here = vec![(ids[0].clone(), f64::NAN)];
        assert!(agrees(&predicted, &failed_here));
    }

    #[test]
    fn ties_share_their_mean_rank() {
        assert_eq!(
            ranks([3.0, 1.0, 3.0, 2.0].into_iter()),
            [3.5, 1.0, 3.5, 2.0]
        );
    }
}
