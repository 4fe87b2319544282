//! How good prediction is on a set of fully tuned keys: a share of them is held out, each held
//! out key is predicted from the others, and every method's choice is scored by its *regret*,
//! the true median of the candidate it chose over the true best median, minus one (a candidate
//! that failed there counts as [`super::FAILED_SLOWDOWN`] − 1). A top-k method measures its k
//! candidates and keeps the fastest of them, and pays their tuning time. Pure: the truth is
//! what the entries recorded.

use cache_core::cache_format::{CandidateId, Entry, Outcome};

use super::Predictor;

/// One method's figures over the held-out keys.
#[derive(Debug, Clone, PartialEq)]
pub struct MethodScore {
    /// What was done.
    pub method: String,
    /// Geometric mean of (1 + regret), minus one.
    pub geomean_regret: f64,
    /// The largest regret.
    pub worst_regret: f64,
    /// Keys where it chose the true best.
    pub exact: usize,
    /// Tuning time it spent, as a share of measuring every candidate of the held-out keys.
    pub tuning_share: f64,
}

/// Every method's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    /// Fully tuned keys used.
    pub keys: usize,
    /// Keys held out (predicted).
    pub held_out: usize,
    /// One per method: the first candidate, the nearest key's winner, the prediction, and
    /// top-k tuning for each k asked.
    pub methods: Vec<MethodScore>,
}

/// Evaluates `predictor` on `entries` (keys of one namespace and scope), where `current`
/// gives each key's current candidates in the operation's order (the first is the "first
/// candidate" baseline); a key is used if each of them is recorded (measured or failed). Every
/// key whose index, in fingerprint order, is `i % 10 < 3` is held out (30%) and predicted
/// from the rest. `top` lists the k of the top-k methods (the k best predicted, plus the
/// nearest key's winner if it is not among them).
pub fn evaluate(
    entries: &[Entry],
    current: &dyn Fn(&Entry) -> Vec<CandidateId>,
    predictor: &Predictor,
    top: &[usize],
) -> Evaluation {
    let mut complete: Vec<(&Entry, Vec<CandidateId>)> = entries
        .iter()
        .map(|e| (e, current(e)))
        .filter(|(e, cur)| !cur.is_empty() && cur.iter().all(|c| truth(e, c).is_some()))
        .collect();
    complete.sort_by_key(|(e, _)| e.fingerprint());
    let (held, train): (Vec<_>, Vec<_>) =
        complete.iter().enumerate().partition(|(i, _)| i % 10 < 3);
    let train: Vec<&Entry> = train.into_iter().map(|(_, (e, _))| *e).collect();
    let nearest = Predictor { neighbours: 1 };
    let mut methods: Vec<(String, Vec<Pick>)> = vec![
        ("first candidate".to_owned(), Vec::new()),
        ("nearest key's winner".to_owned(), Vec::new()),
        (
            format!("prediction (k={})", predictor.neighbours),
            Vec::new(),
        ),
    ];
    for k in top {
        methods.push((format!("top-{k} tuning"), Vec::new()));
    }
    let mut full_time = 0.0;
    for (_, (entry, current)) in &held {
        let (entry, current) = (*entry, current.as_slice());
        let fields = entry.key().fields();
        let (Some(near), Some(pred)) = (
            nearest.predict(fields, train.iter().copied(), current),
            predictor.predict(fields, train.iter().copied(), current),
        ) else {
            continue;
        };
        full_time += current.iter().map(|c| cost(entry, c)).sum::<f64>();
        methods[0]
            .1
            .push(pick(entry, std::slice::from_ref(&current[0]), current));
        methods[1]
            .1
            .push(pick(entry, std::slice::from_ref(near.winner()), current));
        methods[2]
            .1
            .push(pick(entry, std::slice::from_ref(pred.winner()), current));
        for (i, k) in top.iter().enumerate() {
            let mut list = pred.top(*k);
            if !list.contains(near.winner()) {
                list.push(near.winner().clone());
            }
            methods[3 + i].1.push(pick(entry, &list, current));
        }
    }
    Evaluation {
        keys: complete.len(),
        held_out: methods[0].1.len(),
        methods: methods
            .into_iter()
            .map(|(method, picks)| score(method, &picks, full_time))
            .collect(),
    }
}

/// What one method did for one key: the regret of its choice and the tuning time it spent
/// (ns; nothing for a method that measures nothing).
struct Pick {
    regret: f64,
    spent: f64,
}

/// The candidate of `list` with the best true median, as measuring `list` finds it.
fn pick(entry: &Entry, list: &[CandidateId], current: &[CandidateId]) -> Pick {
    let best = best_median(entry, current);
    let chosen = list
        .iter()
        .map(|c| truth(entry, c).unwrap_or(f64::INFINITY))
        .fold(f64::INFINITY, f64::min);
    let regret = if chosen.is_finite() && best > 0.0 {
        chosen / best - 1.0
    } else {
        super::FAILED_SLOWDOWN - 1.0
    };
    let spent = if list.len() > 1 {
        list.iter().map(|c| cost(entry, c)).sum()
    } else {
        0.0
    };
    Pick { regret, spent }
}

fn score(method: String, picks: &[Pick], full_time: f64) -> MethodScore {
    let n = picks.len().max(1) as f64;
    let log_sum: f64 = picks.iter().map(|p| p.regret.ln_1p()).sum();
    MethodScore {
        method,
        geomean_regret: (log_sum / n).exp() - 1.0,
        worst_regret: picks.iter().map(|p| p.regret).fold(0.0, f64::max),
        exact: picks.iter().filter(|p| p.regret <= 0.0).count(),
        tuning_share: if full_time > 0.0 {
            picks.iter().map(|p| p.spent).sum::<f64>() / full_time
        } else {
            0.0
        },
    }
}

/// The true median of `c` for the key (infinite if it failed), or `None` if not recorded.
fn truth(entry: &Entry, c: &CandidateId) -> Option<f64> {
    let cand = entry.candidates().iter().find(|x| x.id == *c)?;
    match (&cand.outcome, cand.stats()) {
        (Outcome::Failed(_), _) => Some(f64::INFINITY),
        (_, Some(s)) => Some(s.median_ns),
        _ => None,
    }
}

/// The best true median among the current candidates.
fn best_median(entry: &Entry, current: &[CandidateId]) -> f64 {
    current
        .iter()
        .filter_map(|c| truth(entry, c))
        .fold(f64::INFINITY, f64::min)
}

/// What measuring `c` cost for the key: its recorded tuning time, else its median.
fn cost(entry: &Entry, c: &CandidateId) -> f64 {
    entry
        .candidates()
        .iter()
        .find(|x| x.id == *c)
        .map_or(0.0, |x| match x.tuning_ns {
            Some(ns) => ns as f64,
            None => x.stats().map_or(0.0, |s| s.median_ns),
        })
}

#[cfg(test)]
mod tests {
    use cache_core::cache_format::{Candidate, Fields, Fingerprint, Key, Origin, Stats, Value};

    use super::*;

    fn tiles() -> Vec<CandidateId> {
        [8, 16, 32, 64, 128, 256]
            .iter()
            .map(|t| CandidateId::new("blocked", &[("tile", *t)]))
            .collect()
    }

    /// A synthetic kernel whose best tile grows with the problem (about its square root, as a
    /// blocked kernel's does), for every layout: the truth a predictor should find.
    fn truth_entry(m: i64, n: i64, layout: &str) -> Entry {
        let key = Key::new(Fields::from([
            ("m".to_owned(), Value::Int(m)),
            ("n".to_owned(), Value::Int(n)),
            ("layout".to_owned(), Value::from(layout)),
        ]));
        let ideal = ((m * n) as f64).sqrt().log2() / 2.0 + if layout == "nt" { 1.0 } else { 0.0 };
        let candidates = tiles().into_iter().map(|id| {
            let t = (id.int("tile").expect("tile") as f64).log2();
            let median = (m * n) as f64 * (1.0 + 0.15 * (t - ideal).powi(2));
            let stats = Stats {
                median_ns: median,
                min_ns: median * 0.98,
                spread_ns: 0.0,
                samples: 5,
            };
            let mut c = Candidate::measured(&id.algorithm, id.params.clone(), stats);
            c.tuning_ns = Some((median * 6.0) as u64);
            c
        });
        Entry::new(
            key,
            Fingerprint::default(),
            Origin::Measured("test".into()),
            0,
            candidates,
        )
    }

    fn grid() -> Vec<Entry> {
        let mut entries = Vec::new();
        for m in (4..=14).map(|p| 1i64 << p) {
            for n in [64, 256, 1024] {
                for layout in ["nn", "nt"] {
                    entries.push(truth_entry(m, n, layout));
                }
            }
        }
        entries
    }

    #[test]
    fn on_a_smooth_grid_prediction_and_top_three_meet_their_targets() {
        let eval = evaluate(&grid(), &|_: &Entry| tiles(), &Predictor::default(), &[3]);
        assert_eq!(eval.keys, 66);
        assert_eq!(
            eval.held_out, 21,
            "30% held out, each with comparable neighbours"
        );
        let by = |name: &str| {
            eval.methods
                .iter()
                .find(|m| m.method.starts_with(name))
                .expect(name)
                .clone()
        };
        let (first, nearest, pred, top3) = (
            by("first candidate"),
            by("nearest"),
            by("prediction"),
            by("top-3"),
        );
        assert!(pred.geomean_regret <= 0.10, "{pred:?}");
        assert!(top3.geomean_regret <= 0.02, "{top3:?}");
        assert!(top3.tuning_share <= 0.5, "{top3:?}");
        assert!(
            pred.geomean_regret <= nearest.geomean_regret,
            "{pred:?} vs {nearest:?}"
        );
        assert!(first.geomean_regret > pred.geomean_regret, "{first:?}");
        assert_eq!((first.tuning_share, pred.tuning_share), (0.0, 0.0));
    }

    #[test]
    fn a_key_with_no_comparable_neighbour_is_not_predicted() {
        let entries = vec![truth_entry(64, 64, "nn")];
        let other = Fields::from([
            ("m".to_owned(), Value::Int(64)),
            ("n".to_owned(), Value::Int(64)),
            ("layout".to_owned(), Value::from("tn")),
        ]);
        assert_eq!(
            Predictor::default().predict(&other, &entries, &tiles()),
            None
        );
        let same = entries[0].key().fields().clone();
        assert_eq!(
            Predictor::default().predict(&same, &entries, &tiles()),
            None,
            "a key's own entry is never its neighbour"
        );
    }

    #[test]
    fn the_prediction_ranks_every_current_candidate_and_names_its_neighbours() {
        let entries = grid();
        let target = Fields::from([
            ("m".to_owned(), Value::Int(3000)),
            ("n".to_owned(), Value::Int(256)),
            ("layout".to_owned(), Value::from("nn")),
        ]);
        let mut current = tiles();
        current.push(CandidateId::new("new", &[]));
        let p = Predictor::default()
            .predict(&target, &entries, &current)
            .expect("predicted");
        assert_eq!(p.ranking.len(), current.len());
        assert_eq!(p.ranking[0].1, Some(1.0));
        assert_eq!(
            p.ranking.last().expect("last"),
            &(CandidateId::new("new", &[]), None),
            "a candidate no neighbour measured comes last"
        );
        assert_eq!(p.neighbours.len(), 4);
        assert!(
            p.neighbours
                .iter()
                .all(|n| n.key.fields().get("layout") == Some(&Value::from("nn")))
        );
        assert!(
            p.describe().starts_with("predicted blocked"),
            "{}",
            p.describe()
        );
        // Two neighbours at the same distance on the log scale (ln 64 - ln 128 = ln 128 - ln
        // 256): the smaller one is nearest.
        let pair = [truth_entry(255, 256, "nn"), truth_entry(63, 256, "nn")];
        let mid = Fields::from([
            ("m".to_owned(), Value::Int(127)),
            ("n".to_owned(), Value::Int(256)),
            ("layout".to_owned(), Value::from("nn")),
        ]);
        let p = Predictor { neighbours: 1 }
            .predict(&mid, &pair, &current)
            .expect("predicted");
        assert_eq!(p.neighbours[0].key.fields().get("m"), Some(&Value::Int(63)));
    }
}
