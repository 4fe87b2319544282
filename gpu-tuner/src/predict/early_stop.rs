//! Stopping a top-k miss early ([`crate::MissPolicy::TopK`]): after each round of
//! measurements, the candidates still on the list are measured only if one of them could
//! still win. Pure: the decision reads the prediction and what was measured, nothing else.
//!
//! A candidate still to measure cannot win when the prediction puts it more than
//! [`STOP_MARGIN`] slower than the best measured one, plus that measurement's own relative
//! spread (a noisy best is a weak bar). The prediction's slowdowns are trusted only while the
//! measurements agree with them: when two measured candidates' times differ by a ratio more
//! than [`AGREE_TOLERANCE`] (beyond their spreads) from the ratio of their predicted
//! slowdowns, the key is unlike the neighbours that voted and the whole list is measured. A
//! candidate the prediction knows nothing of (no neighbour measured it) could always win.
//!
//! On the AutoHeuristic mm timings (docs/rust.md) this reaches 99.5% of the optimum with
//! about 0.5 fewer measurements a key than measuring the k best outright.

use cache_core::cache_format::{CandidateId, Entry};

/// How much slower than the best measured candidate the prediction must put every candidate
/// still to measure before a miss stops: chosen on the AutoHeuristic mm timings (docs/rust.md)
/// from 0, 5, 10, 15, 20, 25, 30 and 40% (at 5% top-5 lost 0.4 points on the H100's
/// HuggingFace shapes; past 20% it measured more for no gain).
pub(crate) const STOP_MARGIN: f64 = 0.15;

/// How far, as a ratio, two measured candidates' times may stray from the ratio of their
/// predicted slowdowns before the prediction is not trusted for the key. On the AutoHeuristic
/// timings 10%, 25% and 50% moved no share by more than 0.1 point (their neighbours predict
/// them well); a synthetic key unlike every tuned one needs it (the tests).
pub(crate) const AGREE_TOLERANCE: f64 = 0.25;

/// One measured candidate: its median and spread (ns); a failed one has an infinite median.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Measured {
    /// The candidate.
    pub(crate) id: CandidateId,
    /// Its median, ns (infinite: it failed).
    pub(crate) median_ns: f64,
    /// Its spread (interquartile range), ns.
    pub(crate) spread_ns: f64,
}

/// Whether a miss that measured `measured` may leave `rest` unmeasured, by the prediction's
/// `ranking` (every candidate with its predicted slowdown against the predicted best; `None`
/// for one no neighbour measured). `true` when `rest` is empty.
pub(crate) fn may_stop(
    ranking: &[(CandidateId, Option<f64>)],
    measured: &[Measured],
    rest: &[CandidateId],
) -> bool {
    if rest.is_empty() {
        return true;
    }
    let predicted = |c: &CandidateId| {
        ranking
            .iter()
            .find(|(x, _)| x == c)
            .and_then(|(_, s)| *s)
            .filter(|s| s.is_finite() && *s > 0.0)
    };
    let Some(best) = measured
        .iter()
        .filter(|m| m.median_ns.is_finite() && m.median_ns > 0.0)
        .min_by(|a, b| a.median_ns.total_cmp(&b.median_ns))
    else {
        // Nothing measured worked: the rest may.
        return false;
    };
    let Some(best_predicted) = predicted(&best.id) else {
        return false;
    };
    if !agrees(measured, best, best_predicted, &predicted) {
        return false;
    }
    let noise = (best.spread_ns / best.median_ns).max(0.0);
    let bar = best_predicted * (1.0 + STOP_MARGIN + noise);
    rest.iter()
        .all(|c| predicted(c).is_some_and(|slowdown| slowdown > bar))
}

/// Whether the measurements agree with the prediction: each measured candidate's time against
/// `best`'s is within [`AGREE_TOLERANCE`] (plus both measurements' relative spreads) of the
/// ratio of their predicted slowdowns, on a log scale. A key whose measurements spread much
/// wider or narrower than its neighbours' did is unlike them, and their ranking of the rest is
/// not trusted.
fn agrees(
    measured: &[Measured],
    best: &Measured,
    best_predicted: f64,
    predicted: &dyn Fn(&CandidateId) -> Option<f64>,
) -> bool {
    measured.iter().filter(|m| m.id != best.id).all(|m| {
        let Some(p) = predicted(&m.id) else {
            return true;
        };
        if !m.median_ns.is_finite() {
            // A failure says nothing of the prediction's scale.
            return true;
        }
        let error = (m.median_ns / best.median_ns).ln() - (p / best_predicted).ln();
        let noise = m.spread_ns / m.median_ns + best.spread_ns / best.median_ns;
        error.abs() <= (1.0 + AGREE_TOLERANCE).ln() + noise.max(0.0)
    })
}

/// What measuring `c` for `entry` finds, as the entry recorded it (for an evaluation): its
/// median (infinite if it failed or is not recorded) and spread.
pub(crate) fn recorded(entry: &Entry, c: &CandidateId) -> Measured {
    let spread = entry
        .candidates()
        .iter()
        .find(|x| x.id == *c)
        .and_then(|x| x.stats());
    Measured {
        id: c.clone(),
        median_ns: super::evaluate::truth(entry, c).unwrap_or(f64::INFINITY),
        spread_ns: spread.map_or(0.0, |s| s.spread_ns),
    }
}

/// Measures `list` in order, one candidate a round, until [`may_stop`] says the rest cannot
/// win by `ranking`; returns how many of `list` were measured (at least one, if any).
pub(crate) fn measure_until(
    ranking: &[(CandidateId, Option<f64>)],
    list: &[CandidateId],
    mut measure: impl FnMut(&CandidateId) -> Measured,
) -> usize {
    let mut measured = Vec::with_capacity(list.len());
    for (i, c) in list.iter().enumerate() {
        measured.push(measure(c));
        if may_stop(ranking, &measured, &list[i + 1..]) {
            return i + 1;
        }
    }
    list.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str) -> CandidateId {
        CandidateId::new(name, &[])
    }

    fn ranking(slowdowns: &[(&str, Option<f64>)]) -> Vec<(CandidateId, Option<f64>)> {
        slowdowns.iter().map(|(n, s)| (id(n), *s)).collect()
    }

    fn measured(name: &str, median: f64, spread: f64) -> Measured {
        Measured {
            id: id(name),
            median_ns: median,
            spread_ns: spread,
        }
    }

    #[test]
    fn a_list_whose_rest_is_predicted_clearly_slower_stops_after_the_best() {
        let r = ranking(&[("a", Some(1.0)), ("b", Some(1.3)), ("c", Some(2.0))]);
        let m = [measured("a", 100.0, 1.0)];
        assert!(may_stop(&r, &m, &[id("b"), id("c")]));
        assert!(may_stop(&r, &m, &[]), "nothing left: stop");
    }

    #[test]
    fn a_candidate_predicted_within_the_margin_or_unknown_is_measured() {
        let m = [measured("a", 100.0, 0.0)];
        let close = ranking(&[("a", Some(1.0)), ("b", Some(1.0 + STOP_MARGIN * 0.5))]);
        assert!(!may_stop(&close, &m, &[id("b")]));
        let unknown = ranking(&[("a", Some(1.0)), ("b", None)]);
        assert!(!may_stop(&unknown, &m, &[id("b")]));
        let absent = ranking(&[("a", Some(1.0))]);
        assert!(!may_stop(&absent, &m, &[id("b")]));
    }

    #[test]
    fn a_noisy_best_raises_the_bar() {
        let r = ranking(&[("a", Some(1.0)), ("b", Some(1.25))]);
        assert!(may_stop(&r, &[measured("a", 100.0, 2.0)], &[id("b")]));
        // A spread of 20% of the median: a candidate predicted 25% slower may still win.
        assert!(!may_stop(&r, &[measured("a", 100.0, 20.0)], &[id("b")]));
    }

    #[test]
    fn a_prediction_the_measurements_contradict_is_not_trusted() {
        let r = ranking(&[("a", Some(1.0)), ("b", Some(1.1)), ("c", Some(3.0))]);
        // b was predicted 10% behind a and measured 20% ahead of it: c is measured too.
        let wrong = [measured("a", 100.0, 1.0), measured("b", 80.0, 1.0)];
        assert!(!may_stop(&r, &wrong, &[id("c")]));
        // a and b predicted alike and measured 70% apart: the key is unlike its neighbours.
        let alike = ranking(&[("a", Some(1.0)), ("b", Some(1.02)), ("c", Some(3.0))]);
        let apart = [measured("a", 170.0, 1.0), measured("b", 100.0, 1.0)];
        assert!(!may_stop(&alike, &apart, &[id("c")]));
        // As predicted, within noise: c, predicted nearly 3× behind, is left.
        let close = [measured("a", 100.0, 5.0), measured("b", 112.0, 5.0)];
        assert!(may_stop(&r, &close, &[id("c")]));
        // A failure says nothing of the prediction's scale.
        let failed = [measured("a", 100.0, 1.0), measured("b", f64::INFINITY, 0.0)];
        assert!(may_stop(&r, &failed, &[id("c")]));
    }

    #[test]
    fn measuring_stops_at_the_first_round_after_which_the_rest_cannot_win() {
        let r = ranking(&[
            ("a", Some(1.0)),
            ("b", Some(1.1)),
            ("c", Some(1.5)),
            ("d", Some(2.0)),
        ]);
        let list = [id("a"), id("b"), id("c"), id("d")];
        let times = |c: &CandidateId| match c.algorithm.as_str() {
            "a" => 100.0,
            "b" => 104.0,
            "c" => 150.0,
            _ => 200.0,
        };
        let mut asked = Vec::new();
        let n = measure_until(&r, &list, |c| {
            asked.push(c.clone());
            measured(&c.algorithm, times(c), 0.5)
        });
        // b is within the margin of a, so it is measured; c and d are not.
        assert_eq!(n, 2);
        assert_eq!(asked, list[..2]);
        assert_eq!(measure_until(&r, &[], |_| unreachable!()), 0);
    }

    #[test]
    fn a_list_whose_measured_candidates_all_failed_goes_on() {
        let r = ranking(&[("a", Some(1.0)), ("b", Some(4.0))]);
        let failed = [measured("a", f64::INFINITY, 0.0)];
        assert!(!may_stop(&r, &failed, &[id("b")]));
        assert!(!may_stop(&r, &[], &[id("b")]), "nothing measured yet");
    }
}
