//! Transfer that learns from the target device: once a few candidates are measured there, a
//! tuned key (another device's result for this problem, or a near one) votes in proportion
//! to how well its ranking of those candidates agrees with the target's: the Spearman
//! correlation of its slowdowns and the target's over the measured candidates, counted from
//! zero (a device that ranks them the other way gets no say) and squared, plus a floor so
//! that no key is silenced entirely. A device like the target (another NVIDIA GPU for an
//! NVIDIA one) then leads, where a plain average let the majority of unlike devices decide.

use std::collections::HashMap;

use cache_core::cache_format::{CandidateId, Entry, Outcome};

use super::{Current, FAILED_SLOWDOWN, Near, measured_best};

/// The least a tuned key's vote is weighted, however badly it agrees.
const FLOOR: f64 = 0.01;

/// Candidates measured on the target before agreement is used at all.
const MIN_MEASURED: usize = 3;

/// Each neighbour's weight (1.0 each when fewer than [`MIN_MEASURED`] are measured).
pub(super) fn agreement(
    near: &[Near<'_>],
    current: &Current<'_>,
    measured: &[(CandidateId, f64)],
) -> Vec<f64> {
    let ours: Vec<(&CandidateId, f64)> = measured
        .iter()
        .filter(|(_, t)| t.is_finite() && *t > 0.0)
        .map(|(c, t)| (c, t.ln()))
        .collect();
    if ours.len() < MIN_MEASURED {
        return vec![1.0; near.len()];
    }
    near.iter()
        .map(|(_, _, _, entry)| {
            let theirs = slowdowns(entry, current);
            let pairs: Vec<(f64, f64)> = ours
                .iter()
                .filter_map(|(c, t)| Some((*t, *theirs.get(c)?)))
                .collect();
            if pairs.len() < MIN_MEASURED {
                return FLOOR;
            }
            let rho = spearman(&pairs);
            rho.max(0.0).powi(2) + FLOOR
        })
        .collect()
}

/// Whether a transfer has measurements enough on the target to weigh the voters by.
pub(super) fn measured_enough(measured: &[(CandidateId, f64)]) -> bool {
    measured
        .iter()
        .filter(|(_, t)| t.is_finite() && *t > 0.0)
        .count()
        >= MIN_MEASURED
}

/// How far the voters agree among themselves: the mean Spearman correlation of their
/// slowdowns over the pairs of them that measured at least [`MIN_MEASURED`] candidates in
/// common; `None` when no pair did. Devices that rank a key's candidates the other way round
/// from each other (a mean at or below zero) say nothing about a device none of them is: a
/// transfer from them alone is not made.
pub(super) fn consensus(near: &[Near<'_>], current: &Current<'_>) -> Option<f64> {
    let each: Vec<HashMap<&CandidateId, f64>> = near
        .iter()
        .map(|(_, _, _, entry)| slowdowns(entry, current))
        .collect();
    let mut sum = 0.0;
    let mut pairs_counted = 0usize;
    for (i, a) in each.iter().enumerate() {
        for b in &each[i + 1..] {
            let pairs: Vec<(f64, f64)> = a
                .iter()
                .filter_map(|(c, x)| Some((*x, *b.get(c)?)))
                .collect();
            if pairs.len() >= MIN_MEASURED {
                sum += spearman(&pairs);
                pairs_counted += 1;
            }
        }
    }
    (pairs_counted > 0).then(|| sum / pairs_counted as f64)
}

/// Each current candidate `entry` measured (or saw fail), with its log slowdown against the
/// entry's best.
fn slowdowns<'e>(entry: &'e Entry, current: &Current<'_>) -> HashMap<&'e CandidateId, f64> {
    let Some((_, best)) = measured_best(entry, current) else {
        return HashMap::new();
    };
    entry
        .candidates()
        .iter()
        .filter(|c| current.contains(&c.id))
        .filter_map(|c| {
            let slowdown = match (&c.outcome, c.stats()) {
                (Outcome::Failed(_), _) => FAILED_SLOWDOWN.ln(),
                (_, Some(s)) if best > 0.0 => (s.median_ns / best).max(1.0).ln(),
                _ => return None,
            };
            Some((&c.id, slowdown))
        })
        .collect()
}

/// The Spearman rank correlation of the pairs (ties share their mean rank); 0 when either
/// side does not vary.
pub(super) fn spearman(pairs: &[(f64, f64)]) -> f64 {
    let ranks = |values: Vec<f64>| -> Vec<f64> {
        let mut order: Vec<usize> = (0..values.len()).collect();
        order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
        let mut ranks = vec![0.0; values.len()];
        let mut i = 0;
        while i < order.len() {
            let mut j = i;
            while j + 1 < order.len() && values[order[j + 1]] == values[order[i]] {
                j += 1;
            }
            let mean = (i + j) as f64 / 2.0;
            for &k in &order[i..=j] {
                ranks[k] = mean;
            }
            i = j + 1;
        }
        ranks
    };
    let a = ranks(pairs.iter().map(|p| p.0).collect());
    let b = ranks(pairs.iter().map(|p| p.1).collect());
    let n = a.len() as f64;
    let (ma, mb) = (a.iter().sum::<f64>() / n, b.iter().sum::<f64>() / n);
    let (mut cov, mut va, mut vb) = (0.0, 0.0, 0.0);
    for (x, y) in a.iter().zip(&b) {
        cov += (x - ma) * (y - mb);
        va += (x - ma).powi(2);
        vb += (y - mb).powi(2);
    }
    if va == 0.0 || vb == 0.0 {
        0.0
    } else {
        cov / (va * vb).sqrt()
    }
}

#[cfg(test)]
mod tests {
    use cache_core::cache_format::{
        Candidate, Entry, Fields, Fingerprint, Key, Origin, Stats, Value,
    };

    use super::*;
    use crate::predict::Predictor;

    #[test]
    fn rank_correlation_is_one_for_the_same_order_and_minus_one_for_the_reverse() {
        let same: Vec<(f64, f64)> = (0..6).map(|i| (f64::from(i), f64::from(i * i))).collect();
        assert!((spearman(&same) - 1.0).abs() < 1e-12);
        let reverse: Vec<(f64, f64)> = (0..6).map(|i| (f64::from(i), f64::from(-i))).collect();
        assert!((spearman(&reverse) + 1.0).abs() < 1e-12);
        assert_eq!(spearman(&[(1.0, 2.0), (1.0, 3.0), (1.0, 4.0)]), 0.0);
    }

    /// One device's entry for the one problem: candidate `i` takes `times[i]`.
    fn device(name: &str, times: &[f64]) -> Entry {
        let candidates = times.iter().enumerate().map(|(i, t)| {
            let stats = Stats {
                median_ns: *t,
                min_ns: *t,
                spread_ns: 0.0,
                samples: 3,
            };
            Candidate::measured(format!("c{i}"), Fields::new(), stats)
        });
        let key = Key::new(Fields::from([("n".to_owned(), Value::Int(4096))]));
        Entry::new(
            key,
            Fingerprint::default(),
            Origin::Measured(name.into()),
            0,
            candidates,
        )
    }

    /// Four devices of one kind and one of another, ranking six candidates the other way:
    /// a new device of the minority kind is misled by the plain vote, and set right once three
    /// of its own measurements show which devices it is like.
    #[test]
    fn measurements_on_the_target_let_the_devices_like_it_lead() {
        let like_a = [10.0, 11.0, 12.0, 30.0, 31.0, 32.0];
        let like_b = [32.0, 31.0, 30.0, 12.0, 11.0, 10.0];
        let sources = vec![
            device("b1", &like_b),
            device("b2", &like_b),
            device("b3", &like_b),
            device("b4", &like_b),
            device("a1", &like_a),
        ];
        let current: Vec<CandidateId> = (0..6)
            .map(|i| CandidateId::new(format!("c{i}"), &[]))
            .collect();
        let p = Predictor { neighbours: 5 };
        let target = Fields::from([("n".to_owned(), Value::Int(4096))]);
        let plain = p
            .devices_of(&target, &sources, &current)
            .expect("a prediction");
        assert_eq!(plain.winner(), &current[5], "the majority decides");
        // The target is like a: c0 < c1 < c3 measured there.
        let measured = vec![
            (current[0].clone(), 10.0),
            (current[1].clone(), 11.5),
            (current[3].clone(), 29.0),
        ];
        let adapted = p
            .devices_measured(&target, &sources, &current, &measured)
            .expect("a prediction");
        assert_eq!(adapted.winner(), &current[0], "{:?}", adapted.ranking);
        // Two measurements are not enough to judge: as the plain vote.
        let adapted = p
            .devices_measured(&target, &sources, &current, &measured[..2])
            .expect("a prediction");
        assert_eq!(adapted.winner(), &current[5]);
    }

    /// Devices that rank the candidates the other way round from each other, as many of each
    /// kind: with nothing measured on the target, no transfer is made (there is no telling
    /// which kind it is); once three measurements show it, the devices like it predict.
    #[test]
    fn devices_whose_rankings_disagree_are_not_transferred_from() {
        let like_a = [10.0, 11.0, 12.0, 30.0, 31.0, 32.0];
        let like_b = [32.0, 31.0, 30.0, 12.0, 11.0, 10.0];
        let current: Vec<CandidateId> = (0..6)
            .map(|i| CandidateId::new(format!("c{i}"), &[]))
            .collect();
        let target = Fields::from([("n".to_owned(), Value::Int(4096))]);
        let p = Predictor { neighbours: 5 };
        for split in [[1, 1], [2, 2], [3, 2], [2, 3]] {
            let mut sources: Vec<Entry> = (0..split[0])
                .map(|i| device(&format!("a{i}"), &like_a))
                .collect();
            sources.extend((0..split[1]).map(|i| device(&format!("b{i}"), &like_b)));
            assert_eq!(
                p.devices_of(&target, &sources, &current),
                None,
                "split {split:?}"
            );
            let measured = vec![
                (current[0].clone(), 10.0),
                (current[2].clone(), 12.5),
                (current[4].clone(), 29.0),
            ];
            let adapted = p
                .devices_measured(&target, &sources, &current, &measured)
                .expect("a prediction once measured");
            assert_eq!(adapted.winner(), &current[0], "split {split:?}");
        }
        // One device alone, or devices that agree, are transferred from.
        let agree = [
            device("a0", &like_a),
            device("a1", &[11.0, 10.0, 13.0, 33.0, 30.0, 31.0]),
        ];
        let p1 = p
            .devices_of(&target, &agree, &current)
            .expect("agreeing devices");
        assert!(p1.transferred);
        assert_eq!(p1.winner(), &current[0]);
        assert!(
            p.devices_of(&target, &[device("b0", &like_b)], &current)
                .is_some()
        );
    }
}
