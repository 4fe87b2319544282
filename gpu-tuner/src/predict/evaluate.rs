//! How good prediction is on a set of fully tuned keys: a share of them is held out, each held
//! out key is predicted from the others, and every method's choice is scored by its *regret*,
//! the true median of the candidate it chose over the true best median, minus one (a candidate
//! that failed there counts as `super::FAILED_SLOWDOWN` − 1). A top-k method measures its k
//! candidates and keeps the fastest of them, and pays their tuning time. [`cross_validate`]
//! does it k-fold, folds by key fingerprint, each fold predicted from the others alone. Pure:
//! the truth is what the entries recorded.

use std::collections::HashMap;

use cache_core::cache_format::{CandidateId, Entry, Fingerprint, Outcome};

use super::early_stop::{measure_until, recorded};
use super::static_list::StaticLists;
use super::{Predictor, Restated};

/// One method's figures over the held-out keys.
#[derive(Debug, Clone, PartialEq)]
pub struct MethodScore {
    /// What was done.
    pub method: String,
    /// Geometric mean of (1 + regret), minus one.
    pub geomean_regret: f64,
    /// The largest regret.
    pub worst_regret: f64,
    /// The 10th percentile of the share of the optimum reached (best median over the chosen
    /// candidate's): nine keys in ten did at least this well.
    pub p10_share: f64,
    /// Keys where it reached less than 90% of the optimum (a choice over 11% slower).
    pub below_90: usize,
    /// Keys where it chose the true best.
    pub exact: usize,
    /// Candidates it measured per key, on average (0 for a method that measures nothing).
    pub measured_per_key: f64,
    /// Tuning time it spent, as a share of measuring every candidate of the held-out keys.
    pub tuning_share: f64,
}

impl MethodScore {
    /// The share of the optimum reached, as a geometric mean over the keys (1.0: always the
    /// best): `1 / (1 + geomean_regret)`.
    pub fn share_of_optimum(&self) -> f64 {
        1.0 / (1.0 + self.geomean_regret)
    }
}

/// Every method's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    /// Fully tuned keys used.
    pub keys: usize,
    /// Keys held out (predicted).
    pub held_out: usize,
    /// One per method: the declared default (or the first candidate), the nearest key's
    /// winner, the prediction, and top-k tuning for each k asked.
    pub methods: Vec<MethodScore>,
}

/// What an evaluation compares, besides the predictor.
#[derive(Debug, Clone, Default)]
pub struct Methods<'a> {
    /// The k of each top-k method: the k best predicted are measured, plus the nearest key's
    /// winner when it is not among them (as [`crate::MissPolicy::TopK`] does).
    pub top: &'a [usize],
    /// The declared default (Inductor's `extern_mm`, say), where a key has it; otherwise a
    /// key's first current candidate.
    pub default: Option<&'a CandidateId>,
    /// For a cross-validation: keys that agree on these key fields share a fold, so they are
    /// held out together (`["m", "k", "n", "mat1_dtype"]`: every memory layout of a shape);
    /// empty, each key by its own fingerprint (`super::fold_of`).
    pub fold_by: &'a [String],
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
    let complete = complete(entries, current);
    let (held, train): (Vec<_>, Vec<_>) =
        complete.iter().enumerate().partition(|(i, _)| i % 10 < 3);
    let held: Vec<&Keyed<'_>> = held.into_iter().map(|(_, k)| k).collect();
    let train: Vec<&Entry> = train.into_iter().map(|(_, (e, _))| *e).collect();
    let methods = Methods {
        top,
        default: None,
        fold_by: &[],
    };
    let (picks, full) = split(&held, &train, predictor, &methods);
    summarize(
        complete.len(),
        &names(predictor, &methods, false),
        picks,
        full,
    )
}

/// A key with its current candidates.
pub(super) type Keyed<'a> = (&'a Entry, Vec<CandidateId>);

/// The keys that can be scored, in fingerprint order: every current candidate recorded, at
/// least two of them (with one there is nothing to choose), and a best median above zero
/// (a regret is a ratio to it).
pub(super) fn complete<'a>(
    entries: &'a [Entry],
    current: &dyn Fn(&Entry) -> Vec<CandidateId>,
) -> Vec<Keyed<'a>> {
    let mut complete: Vec<Keyed<'a>> = entries
        .iter()
        .map(|e| (e, current(e)))
        .filter(|(e, cur)| {
            cur.len() >= 2
                && cur.iter().all(|c| truth(e, c).is_some())
                && best_median(e, cur).is_finite()
                && best_median(e, cur) > 0.0
        })
        .collect();
    complete.sort_by_key(|(e, _)| e.fingerprint());
    complete
}

/// The methods' names, in the order [`split_by`] gives their picks (`across`: for
/// [`Voters::Across`]).
pub(super) fn names(predictor: &Predictor, methods: &Methods<'_>, across: bool) -> Vec<String> {
    let mut names = vec![
        match methods.default {
            Some(id) => format!("default ({id})"),
            None => "first candidate".to_owned(),
        },
        "nearest key's winner".to_owned(),
        format!("prediction (k={})", predictor.neighbours),
    ];
    names.extend(methods.top.iter().map(|k| format!("top-{k} tuning")));
    names.extend(
        methods
            .top
            .iter()
            .map(|k| format!("static list of {k} per dtype")),
    );
    if across {
        names.push(NEW_DEVICE.to_owned());
    } else {
        names.extend(
            methods
                .top
                .iter()
                .map(|k| format!("top-{k} stopping early")),
        );
    }
    names
}

/// Each method's pick for each held-out key predicted from `train`, and the time measuring
/// every candidate of those keys takes.
fn split(
    held: &[&Keyed<'_>],
    train: &[&Entry],
    predictor: &Predictor,
    methods: &Methods<'_>,
) -> (Vec<Vec<Pick>>, f64) {
    split_by(held, train, predictor, methods, &Voters::Here)
}

/// Whom a held-out key is predicted from, besides the keys tuned in its own scope.
pub(super) enum Voters<'s> {
    /// Only those ([`super::Voters::Scope`] with nothing elsewhere).
    Here,
    /// Those, and the same key's entries under other scopes voting beside them, by
    /// fingerprint, as the tuner does ([`super::Voters::Scope`]; a transfer from those
    /// entries alone when no key here is comparable).
    Beside(&'s HashMap<Fingerprint, Vec<&'s Entry>>),
    /// The tuned keys are another scope's: a device never tuned ([`super::Voters::Devices`]);
    /// top-k measures in rounds ([`adaptive`]).
    Across,
}

/// [`split`], with the held-out keys predicted as `voters` says.
pub(super) fn split_by(
    held: &[&Keyed<'_>],
    train: &[&Entry],
    predictor: &Predictor,
    methods: &Methods<'_>,
    voters: &Voters<'_>,
) -> (Vec<Vec<Pick>>, f64) {
    // Learnt once: every held-out key walks the same tuned keys.
    let learnt = Restated::learn(train.iter().map(|e| e.key().fields()));
    let ask = |p: &Predictor, entry: &Entry, current: &[CandidateId]| {
        let fields = entry.key().fields();
        let walk = train.iter().copied();
        match voters {
            Voters::Here => p.rank(fields, walk, current, true, &[], Some(&learnt)),
            Voters::Across => p.rank(fields, walk, current, false, &[], Some(&learnt)),
            Voters::Beside(map) => {
                let elsewhere = map.get(&entry.fingerprint()).map_or(&[][..], Vec::as_slice);
                p.walk_beside(
                    fields,
                    walk,
                    elsewhere.iter().copied(),
                    current,
                    Some(&learnt),
                )
                .or_else(|| {
                    let all = Predictor {
                        neighbours: elsewhere.len().max(1),
                    };
                    all.predict(&super::Query {
                        target: fields,
                        current,
                        voters: super::Voters::Devices {
                            tuned: elsewhere,
                            measured: &[],
                        },
                    })
                })
            }
        }
    };
    let across = matches!(voters, Voters::Across);
    let nearest = Predictor { neighbours: 1 };
    // Within a device, top-k stopping early; across devices, what a TuneNow miss on a device
    // new to the key does.
    let rows = 3 + 2 * methods.top.len() + if across { 1 } else { methods.top.len() };
    let mut picks: Vec<Vec<Pick>> = (0..rows).map(|_| Vec::new()).collect();
    let lists = StaticLists::learn(train);
    let mut full_time = 0.0;
    for (entry, current) in held {
        let (entry, current) = (*entry, current.as_slice());
        let (Some(near), Some(pred)) = (
            ask(&nearest, entry, current),
            ask(predictor, entry, current),
        ) else {
            continue;
        };
        full_time += current.iter().map(|c| cost(entry, c)).sum::<f64>();
        let default = methods
            .default
            .filter(|d| current.contains(d))
            .unwrap_or(&current[0]);
        picks[0].push(pick(entry, std::slice::from_ref(default), current, false));
        picks[1].push(pick(
            entry,
            std::slice::from_ref(near.winner()),
            current,
            false,
        ));
        picks[2].push(pick(
            entry,
            std::slice::from_ref(pred.winner()),
            current,
            false,
        ));
        for (i, k) in methods.top.iter().enumerate() {
            let list = if across {
                adaptive(entry, train, predictor, current, *k, &learnt)
            } else {
                let mut list = pred.top(*k);
                if !list.contains(near.winner()) {
                    list.push(near.winner().clone());
                }
                list
            };
            picks[3 + i].push(pick(entry, &list, current, true));
            let fixed = lists.list_for(entry, *k, current);
            picks[3 + methods.top.len() + i].push(pick(entry, &fixed, current, true));
            if !across {
                let n = measure_until(&pred.ranking, &list, |c| recorded(entry, c));
                picks[3 + 2 * methods.top.len() + i].push(pick(entry, &list[..n], current, true));
            }
        }
        if across {
            picks[rows - 1].push(super::new_device::evaluate(entry, train, current));
        }
    }
    (picks, full_time)
}

pub(super) fn summarize(
    keys: usize,
    names: &[String],
    picks: Vec<Vec<Pick>>,
    full: f64,
) -> Evaluation {
    Evaluation {
        keys,
        held_out: picks.first().map_or(0, Vec::len),
        methods: names
            .iter()
            .zip(picks)
            .map(|(method, picks)| score(method.clone(), &picks, full))
            .collect(),
    }
}

/// The name of the row [`split_by`] adds across devices ([`new_device`]).
pub(super) const NEW_DEVICE: &str = "new-device tune-now";

/// What one method did for one key: the regret of its choice, the candidates it measured and
/// the tuning time it spent (ns; nothing for a method that measures nothing).
#[derive(Debug, Clone, Copy)]
pub(super) struct Pick {
    regret: f64,
    measured: usize,
    spent: f64,
}

/// Top-k on a device predicted from others: `k` candidates measured in up to four rounds,
/// the first the transferred prediction's top set (at least its diverse three), each later one
/// re-ranked as [`super::Voters::Devices`] with `measured` ranks, from what the earlier rounds
/// measured (their true medians), the restating fields `learnt` from `train` once.
fn adaptive(
    entry: &Entry,
    train: &[&Entry],
    predictor: &Predictor,
    current: &[CandidateId],
    k: usize,
    learnt: &Restated,
) -> Vec<CandidateId> {
    let fields = entry.key().fields();
    let batch = k.div_ceil(4).max(1);
    let walk = || train.iter().copied();
    let Some(first) = predictor.rank(fields, walk(), current, false, &[], Some(learnt)) else {
        return Vec::new();
    };
    // At least the diverse three first: agreement needs three measured to judge by.
    let mut picked = first.top(batch.max(super::DIVERSE_PICKS).min(k));
    while picked.len() < k {
        let measured: Vec<(CandidateId, f64)> = picked
            .iter()
            .filter_map(|c| Some((c.clone(), truth(entry, c).filter(|t| t.is_finite())?)))
            .collect();
        let Some(next) = predictor.rank(fields, walk(), current, false, &measured, Some(learnt))
        else {
            break;
        };
        let more: Vec<CandidateId> = next
            .ranking
            .iter()
            .map(|(c, _)| c)
            .filter(|c| !picked.contains(c))
            .take(batch.min(k - picked.len()))
            .cloned()
            .collect();
        if more.is_empty() {
            break;
        }
        picked.extend(more);
    }
    picked
}

/// The candidate of `list` with the best true median, as measuring `list` finds it (`measures`:
/// the method measures its list, even of one; otherwise it uses its one choice unmeasured).
pub(super) fn pick(
    entry: &Entry,
    list: &[CandidateId],
    current: &[CandidateId],
    measures: bool,
) -> Pick {
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
    let (measured, spent) = if measures {
        (list.len(), list.iter().map(|c| cost(entry, c)).sum())
    } else {
        (0, 0.0)
    };
    Pick {
        regret,
        measured,
        spent,
    }
}

fn score(method: String, picks: &[Pick], full_time: f64) -> MethodScore {
    let n = picks.len().max(1) as f64;
    let log_sum: f64 = picks.iter().map(|p| p.regret.ln_1p()).sum();
    let mut shares: Vec<f64> = picks.iter().map(|p| 1.0 / (1.0 + p.regret)).collect();
    shares.sort_by(f64::total_cmp);
    MethodScore {
        method,
        geomean_regret: (log_sum / n).exp() - 1.0,
        worst_regret: picks.iter().map(|p| p.regret).fold(0.0, f64::max),
        p10_share: shares.get(shares.len() / 10).copied().unwrap_or(1.0),
        below_90: shares.iter().filter(|&&s| s < 0.9).count(),
        exact: picks.iter().filter(|p| p.regret <= 0.0).count(),
        measured_per_key: picks.iter().map(|p| p.measured as f64).sum::<f64>() / n,
        tuning_share: if full_time > 0.0 {
            picks.iter().map(|p| p.spent).sum::<f64>() / full_time
        } else {
            0.0
        },
    }
}

/// The true median of `c` for the key (infinite if it failed), or `None` if not recorded.
pub(super) fn truth(entry: &Entry, c: &CandidateId) -> Option<f64> {
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
pub(super) mod tests {
    use cache_core::cache_format::{Candidate, Fields, Fingerprint, Key, Origin, Stats, Value};

    use super::*;

    pub(in crate::predict) fn tiles() -> Vec<CandidateId> {
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

    pub(in crate::predict) fn grid() -> Vec<Entry> {
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
            Predictor::default().scope_of(&other, &entries, &tiles()),
            None
        );
        let same = entries[0].key().fields().clone();
        assert_eq!(
            Predictor::default().scope_of(&same, &entries, &tiles()),
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
            .scope_of(&target, &entries, &current)
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
            .scope_of(&mid, &pair, &current)
            .expect("predicted");
        assert_eq!(p.neighbours[0].key.fields().get("m"), Some(&Value::Int(63)));
    }
}
