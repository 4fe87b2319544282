//! The splits an evaluation scores ([`super::evaluate`] scores each): k-fold cross-validation
//! by key fingerprint, each fold predicted from the other folds alone, and transfer, every key
//! of one scope predicted from another scope's keys alone.

use std::collections::HashMap;

use cache_core::cache_format::{CandidateId, Entry, Fields, Fingerprint, Key};

use super::Predictor;
use super::evaluate::{
    Evaluation, Keyed, Methods, Pick, Voters, complete, names, split_by, summarize,
};

/// The fold of a key in a `folds`-fold cross-validation: by its fingerprint, so a key is in
/// the same fold whatever else is in the data.
pub(crate) fn fold_of(entry: &Entry, folds: usize) -> usize {
    (entry.fingerprint().low_u64() % folds.max(1) as u64) as usize
}

/// The fold of a key when keys that agree on the fields `by` share one
/// ([`super::Methods::fold_by`]): by the fingerprint of those fields alone (the ones the key
/// has); `fold_of` when `by` is empty.
fn fold_by(entry: &Entry, folds: usize, by: &[String]) -> usize {
    if by.is_empty() {
        return fold_of(entry, folds);
    }
    let fields = entry.key().fields();
    let part: Fields = by
        .iter()
        .filter_map(|n| Some((n.clone(), fields.get(n)?.clone())))
        .collect();
    (Key::new(part).fingerprint().low_u64() % folds.max(1) as u64) as usize
}

/// A k-fold cross-validation ([`cross_validate`]): each fold's figures, and all folds' held-out
/// keys together.
#[derive(Debug, Clone, PartialEq)]
pub struct CrossValidation {
    /// Fold `i` holds out the keys of `fold_of` `i`, predicted from the other folds alone.
    pub folds: Vec<Evaluation>,
    /// Every key, each predicted once (from the folds it is not in).
    pub overall: Evaluation,
}

/// `folds`-fold cross-validation of `predictor` on `entries` (as [`super::evaluate`] takes them):
/// each fold's keys are predicted from the keys of the other folds only, never from their own.
pub fn cross_validate(
    entries: &[Entry],
    current: &dyn Fn(&Entry) -> Vec<CandidateId>,
    predictor: &Predictor,
    folds: usize,
    methods: &Methods<'_>,
) -> CrossValidation {
    let with = Rotation {
        hold: true,
        source: &[],
    };
    rotate(entries, current, predictor, folds, methods, &with)
}

/// The other way round: with only one fold in `folds` tuned (10% for 10 folds, as a device
/// with a few keys tuned), every other key predicted from that fold alone, for each fold in
/// turn. `CrossValidation::folds[i]` is the one trained on fold `i`.
pub fn few_tuned(
    entries: &[Entry],
    current: &dyn Fn(&Entry) -> Vec<CandidateId>,
    predictor: &Predictor,
    folds: usize,
    methods: &Methods<'_>,
) -> CrossValidation {
    let with = Rotation {
        hold: false,
        source: &[],
    };
    rotate(entries, current, predictor, folds, methods, &with)
}

/// [`few_tuned`] on `target` with every key of `source` (another scope: another device) tuned
/// too: each fold of `target` in turn tuned, the rest of `target` predicted from it with the
/// same key's entry in `source` voting beside ([`super::Voters::Scope`], as the tuner
/// does; from the source alone where no tuned key of the target is comparable).
pub fn few_tuned_with(
    source: &[Entry],
    target: &[Entry],
    current: &dyn Fn(&Entry) -> Vec<CandidateId>,
    predictor: &Predictor,
    folds: usize,
    methods: &Methods<'_>,
) -> CrossValidation {
    let with = Rotation {
        hold: false,
        source,
    };
    rotate(target, current, predictor, folds, methods, &with)
}

/// How [`rotate`] splits: each fold held out (`hold`) or alone tuned, with every key of
/// `source` (another scope) tuned too, voting beside for the same key.
struct Rotation<'s> {
    hold: bool,
    source: &'s [Entry],
}

/// Each fold in turn held out from, or alone trained on, the others (see [`Rotation`]).
fn rotate(
    entries: &[Entry],
    current: &dyn Fn(&Entry) -> Vec<CandidateId>,
    predictor: &Predictor,
    folds: usize,
    methods: &Methods<'_>,
    with: &Rotation<'_>,
) -> CrossValidation {
    let folds = folds.max(2);
    let complete = complete(entries, current);
    let names = names(predictor, methods, false);
    let mut all: Vec<Vec<Pick>> = names.iter().map(|_| Vec::new()).collect();
    let mut all_full = 0.0;
    let mut per_fold = Vec::with_capacity(folds);
    let mut by_key: HashMap<Fingerprint, Vec<&Entry>> = HashMap::new();
    for e in with.source {
        by_key.entry(e.fingerprint()).or_default().push(e);
    }
    let voters = if with.source.is_empty() {
        Voters::Here
    } else {
        Voters::Beside(&by_key)
    };
    for f in 0..folds {
        let (held, train): (Vec<&Keyed<'_>>, Vec<&Keyed<'_>>) = complete
            .iter()
            .partition(|(e, _)| (fold_by(e, folds, methods.fold_by) == f) == with.hold);
        let train: Vec<&Entry> = train.into_iter().map(|(e, _)| *e).collect();
        let (picks, full) = split_by(&held, &train, predictor, methods, &voters);
        let n = held.len();
        for (into, from) in all.iter_mut().zip(&picks) {
            into.extend(from.iter().copied());
        }
        all_full += full;
        per_fold.push(summarize(n, &names, picks, full));
    }
    // Trained on one fold, each key is held out folds - 1 times: the overall figures
    // weigh every prediction alike.
    CrossValidation {
        folds: per_fold,
        overall: summarize(complete.len(), &names, all, all_full),
    }
}

/// Transfer to another scope: every key of `target` (entries of one scope) predicted from
/// `source` (entries of another scope, the same namespace) alone, as a device never tuned
/// would be (a key tuned on the source is its nearest neighbour there). Top-k measures on the
/// target.
pub fn transfer(
    source: &[Entry],
    target: &[Entry],
    current: &dyn Fn(&Entry) -> Vec<CandidateId>,
    predictor: &Predictor,
    methods: &Methods<'_>,
) -> Evaluation {
    let held = complete(target, current);
    let held: Vec<&Keyed<'_>> = held.iter().collect();
    let train: Vec<&Entry> = source.iter().collect();
    let (picks, full) = split_by(&held, &train, predictor, methods, &Voters::Across);
    summarize(held.len(), &names(predictor, methods, true), picks, full)
}

/// Every key of `target` predicted from `tuned` alone: keys of the same namespace and scope
/// tuned for another workload (a workload never tuned, on a device whose others were), with
/// `elsewhere`'s result for the same key (another device's, any of this workload) voting
/// beside them as the tuner lets it ([`super::Voters::Scope`]). A key `tuned` shares with
/// `target` does not vote: it would be a hit, not a prediction. Top-k measures on the target,
/// as a miss does.
pub fn from_tuned(
    tuned: &[Entry],
    elsewhere: &[Entry],
    target: &[Entry],
    current: &dyn Fn(&Entry) -> Vec<CandidateId>,
    predictor: &Predictor,
    methods: &Methods<'_>,
) -> Evaluation {
    let held = complete(target, current);
    let held: Vec<&Keyed<'_>> = held.iter().collect();
    let own: std::collections::HashSet<Fingerprint> =
        target.iter().map(Entry::fingerprint).collect();
    let train: Vec<&Entry> = tuned
        .iter()
        .filter(|e| !own.contains(&e.fingerprint()))
        .collect();
    let mut by_key: HashMap<Fingerprint, Vec<&Entry>> = HashMap::new();
    for e in elsewhere {
        by_key.entry(e.fingerprint()).or_default().push(e);
    }
    let voters = if elsewhere.is_empty() {
        Voters::Here
    } else {
        Voters::Beside(&by_key)
    };
    let (picks, full) = split_by(&held, &train, predictor, methods, &voters);
    summarize(held.len(), &names(predictor, methods, false), picks, full)
}

#[cfg(test)]
mod tests {
    use cache_core::cache_format::{Candidate, Origin, Stats, Value};

    use super::*;

    /// Folds never leak: every key of fold f has the winner `c<f>` and all keys are nearly
    /// the same problem, so a key predicted from its own fold would be exact; predicted from
    /// the other folds alone, no method that measures nothing ever is.
    #[test]
    fn a_fold_is_predicted_from_the_other_folds_alone() {
        const FOLDS: usize = 5;
        let ids: Vec<CandidateId> = (0..FOLDS)
            .map(|f| CandidateId::new(format!("c{f}"), &[]))
            .collect();
        let entries: Vec<Entry> = (0..200i64)
            .map(|i| {
                // The fold of the key (by its fingerprint alone: no candidates needed).
                let fold = fold_of(&timed(1000 + i, &[], &[]), FOLDS);
                let medians: Vec<f64> = (0..FOLDS)
                    .map(|f| if f == fold { 10.0 } else { 20.0 + f as f64 })
                    .collect();
                timed(1000 + i, &ids, &medians)
            })
            .collect();
        let methods = Methods {
            top: &[1],
            default: None,
            fold_by: &[],
        };
        let cv = cross_validate(
            &entries,
            &|_: &Entry| ids.clone(),
            &Predictor::default(),
            FOLDS,
            &methods,
        );
        assert_eq!(cv.folds.len(), FOLDS);
        assert_eq!(
            cv.folds.iter().map(|f| f.held_out).sum::<usize>(),
            200,
            "each key held out once"
        );
        assert_eq!(cv.overall.held_out, 200);
        for fold in &cv.folds {
            assert!(fold.held_out > 10, "{fold:?}");
            for m in &fold.methods[1..3] {
                assert_eq!(m.exact, 0, "{} saw its own fold: {m:?}", m.method);
            }
        }
        // The control: predicted from its own fold's other keys, a key is exact.
        let fold = fold_of(&entries[0], FOLDS);
        let mates: Vec<&Entry> = entries[1..]
            .iter()
            .filter(|e| fold_of(e, FOLDS) == fold)
            .collect();
        let leaky = Predictor::default()
            .scope_of(entries[0].key().fields(), mates, &ids)
            .expect("a prediction");
        assert_eq!(leaky.winner(), &ids[fold]);
    }

    /// Another workload's keys predict this one's; a key both have is a hit there, so it
    /// does not vote.
    #[test]
    fn a_workload_never_tuned_is_predicted_from_the_others_without_its_own_keys() {
        let grid = super::super::evaluate::tests::grid();
        let tiles = |_: &Entry| super::super::evaluate::tests::tiles();
        let (target, other): (Vec<Entry>, Vec<Entry>) = grid
            .iter()
            .cloned()
            .partition(|e| e.key().fields().get("n") == Some(&Value::Int(256)));
        let methods = Methods {
            top: &[2],
            default: None,
            fold_by: &[],
        };
        let p = Predictor::default();
        let alone = from_tuned(&other, &[], &target, &tiles, &p, &methods);
        assert_eq!(alone.held_out, target.len());
        let (first, prediction) = (&alone.methods[0], &alone.methods[2]);
        assert!(
            prediction.share_of_optimum() > first.share_of_optimum(),
            "{alone:?}"
        );
        // Given every key, the target's own among them: the same figures.
        assert_eq!(from_tuned(&grid, &[], &target, &tiles, &p, &methods), alone);
        // Another device's result for the very key, voting beside: no worse.
        let beside = from_tuned(&other, &target, &target, &tiles, &p, &methods);
        assert!(
            beside.methods[2].share_of_optimum() >= prediction.share_of_optimum(),
            "{beside:?}"
        );
    }

    #[test]
    fn a_declared_default_is_the_baseline_where_a_key_has_it() {
        let default = super::super::evaluate::tests::tiles()[5].clone();
        let methods = Methods {
            top: &[1, 3],
            default: Some(&default),
            fold_by: &[],
        };
        let cv = cross_validate(
            &super::super::evaluate::tests::grid(),
            &|_: &Entry| super::super::evaluate::tests::tiles(),
            &Predictor::default(),
            5,
            &methods,
        );
        let names: Vec<&str> = cv
            .overall
            .methods
            .iter()
            .map(|m| m.method.as_str())
            .collect();
        assert_eq!(names[0], "default (blocked {\"tile\":256})", "{names:?}");
        assert_eq!(names.len(), 9);
        assert_eq!(
            names[5..],
            [
                "static list of 1 per dtype",
                "static list of 3 per dtype",
                "top-1 stopping early",
                "top-3 stopping early"
            ]
        );
        let (base, pred) = (&cv.overall.methods[0], &cv.overall.methods[2]);
        assert!(pred.share_of_optimum() > base.share_of_optimum(), "{cv:?}");
        assert!(pred.p10_share > 0.0 && pred.p10_share <= 1.0, "{pred:?}");
        assert!(cv.overall.methods[4].measured_per_key >= 3.0);
    }

    /// An entry of key `m` timing `ids[i]` at `medians[i]`.
    fn timed(m: i64, ids: &[CandidateId], medians: &[f64]) -> Entry {
        let key = Key::new(Fields::from([("m".to_owned(), Value::Int(m))]));
        let candidates = ids.iter().zip(medians).map(|(id, &median)| {
            let stats = Stats {
                median_ns: median,
                min_ns: median,
                spread_ns: 0.0,
                samples: 3,
            };
            Candidate::measured(&id.algorithm, Fields::new(), stats)
        });
        Entry::new(
            key,
            Fingerprint::default(),
            Origin::Measured("t".into()),
            0,
            candidates,
        )
    }

    /// `fold_by` holds out keys that agree on the fields named together: each size here has
    /// two layouts (a flag) with the same winner and no other size near it, so predicted by
    /// fingerprint a key mostly hears its twin, and with the fields `m` alone, never.
    #[test]
    fn keys_that_agree_on_the_fold_fields_are_held_out_together() {
        const FOLDS: usize = 5;
        let ids: Vec<CandidateId> = (0..5)
            .map(|c| CandidateId::new(format!("c{c}"), &[]))
            .collect();
        let mut entries = Vec::new();
        for i in 1..31i64 {
            // Sizes 4^i apart: ln 4 > 1, so the twin one flag away is the nearest key.
            let winner = ((i * 7 + 3) % 5) as usize;
            let medians: Vec<f64> = (0..5)
                .map(|c| if c == winner { 10.0 } else { 20.0 })
                .collect();
            for contiguous in [true, false] {
                let mut e = timed(1i64 << (2 * i), &ids, &medians);
                let mut fields = e.key().fields().clone();
                fields.insert("contiguous", Value::Bool(contiguous));
                e = Entry::new(
                    Key::new(fields),
                    Fingerprint::default(),
                    Origin::Measured("t".into()),
                    0,
                    e.candidates().iter().map(|c| Candidate::clone(c)),
                );
                entries.push(e);
            }
        }
        let by = ["m".to_owned()];
        for pair in entries.chunks(2) {
            assert_eq!(fold_by(&pair[0], FOLDS, &by), fold_by(&pair[1], FOLDS, &by));
        }
        let exact = |fold_by: &[String]| {
            let methods = Methods {
                top: &[1],
                default: None,
                fold_by,
            };
            let cv = cross_validate(
                &entries,
                &|_: &Entry| ids.clone(),
                &Predictor { neighbours: 1 },
                FOLDS,
                &methods,
            );
            assert_eq!(cv.overall.held_out, entries.len());
            cv.overall.methods[1].exact
        };
        let (apart, together) = (exact(&[]), exact(&by));
        assert!(apart >= 40, "by fingerprint the twin mostly votes: {apart}");
        assert!(together <= 20, "held out with its twin: {together}");
    }

    /// With another device's keys tuned too, a held-out key hears only that device's result
    /// for the same key, beside its own device's tuned keys: the other device's keys nearest
    /// to it (but other keys) never vote. Here they all say `c1` while this device's truth is
    /// `c0` everywhere, so one vote of theirs would make the prediction wrong.
    #[test]
    fn another_devices_other_keys_never_vote_only_its_result_for_the_same_key() {
        let ids = [CandidateId::new("c0", &[]), CandidateId::new("c1", &[])];
        let target: Vec<Entry> = (0..200)
            .map(|i| timed(1000 + 2 * i, &ids, &[10.0, 20.0]))
            .collect();
        let source: Vec<Entry> = (0..200)
            .map(|i| timed(1001 + 2 * i, &ids, &[100.0, 1.0]))
            .collect();
        let methods = Methods {
            top: &[1],
            default: None,
            fold_by: &[],
        };
        let few = few_tuned_with(
            &source,
            &target,
            &|_: &Entry| ids.to_vec(),
            &Predictor::default(),
            10,
            &methods,
        );
        let prediction = &few.overall.methods[2];
        assert_eq!(prediction.exact, few.overall.held_out, "{prediction:?}");
        // And the same key's result there does vote: a source that has the target's keys,
        // with c1 decisively ahead, pulls the nearest-key baseline (one own key beside it)
        // over to c1 for some keys.
        let same: Vec<Entry> = (0..200)
            .map(|i| timed(1000 + 2 * i, &ids, &[100.0, 1.0]))
            .collect();
        let beside = few_tuned_with(
            &same,
            &target,
            &|_: &Entry| ids.to_vec(),
            &Predictor { neighbours: 1 },
            10,
            &methods,
        );
        assert!(
            beside.overall.methods[2].exact < beside.overall.held_out,
            "{beside:?}"
        );
        // Beside needs a key of this device: with none, it is not a prediction (the tuner
        // transfers instead).
        let (held, elsewhere) = (&target[0], &same[0]);
        let alone = Predictor::default().scope_beside(held.key().fields(), [], [elsewhere], &ids);
        assert!(alone.is_none());
        let with = Predictor::default()
            .scope_beside(held.key().fields(), &target[1..], [elsewhere], &ids)
            .expect("a prediction");
        assert_eq!(
            with.neighbours.iter().filter(|n| n.elsewhere).count(),
            1,
            "{with:?}"
        );
        assert!(!with.transferred);
    }

    #[test]
    fn with_few_tuned_each_fold_alone_predicts_all_the_others() {
        let methods = Methods {
            top: &[1],
            default: None,
            fold_by: &[],
        };
        let grid = super::super::evaluate::tests::grid();
        let few = few_tuned(
            &grid,
            &|_: &Entry| super::super::evaluate::tests::tiles(),
            &Predictor::default(),
            5,
            &methods,
        );
        let many = cross_validate(
            &grid,
            &|_: &Entry| super::super::evaluate::tests::tiles(),
            &Predictor::default(),
            5,
            &methods,
        );
        // Each key is predicted by four folds' single-fold training sets, once by the others.
        assert_eq!(few.overall.held_out, 4 * many.overall.held_out);
        assert!(
            few.overall.methods[2].share_of_optimum()
                <= many.overall.methods[2].share_of_optimum() + 1e-9,
            "fewer tuned keys predict no better: {few:?}"
        );
    }
}
