//! The baseline a prediction's top-k must beat: a fixed, shape-blind list of k candidates per
//! class of keys (their text fields: the dtypes, say), learnt from the tuned keys. It is what a
//! library ships when it tunes only a short list (AutoHeuristic's "cuBLAS, then the most
//! frequent winners"), and on Inductor's published A100 timings a list of three already
//! reaches 99.7% of the optimum: top-3 tuning is worth its prediction only where it does
//! better at the same cost.

use std::collections::HashMap;

use cache_core::cache_format::{CandidateId, Entry, Fields, Value};

use super::FAILED_SLOWDOWN;
use super::evaluate::truth;

/// Candidates in the order a list takes them: one order per class seen in training, and one
/// from every training key for a class it never saw. A key's list of k is the first k of its
/// class's order that the key has (a config a shape cannot run is not counted against it).
pub(super) struct StaticLists {
    by_class: HashMap<String, Vec<CandidateId>>,
    all: Vec<CandidateId>,
}

impl StaticLists {
    /// The orders learnt from `train`: per class, greedily for the first [`GREEDY_LEN`], each
    /// next candidate the one that most raises the geometric mean over the class's keys of the
    /// share of the optimum the list so far reaches (its best member's median over the key's
    /// best), then every other candidate the class's keys have, in id order. One order
    /// whatever k is asked, so a list of k is the same beside any other k, and a key lacking
    /// some of the first still gets k of its own.
    pub(super) fn learn(train: &[&Entry]) -> StaticLists {
        let len = GREEDY_LEN;
        let mut classes: HashMap<String, Vec<&Entry>> = HashMap::new();
        for e in train {
            classes.entry(class(e.key().fields())).or_default().push(e);
        }
        StaticLists {
            by_class: classes
                .into_iter()
                .map(|(c, keys)| (c, greedy(&keys, len)))
                .collect(),
            all: greedy(train, len),
        }
    }

    /// The list of `k` for `entry`, whose current candidates are `current`.
    pub(super) fn list_for(
        &self,
        entry: &Entry,
        k: usize,
        current: &[CandidateId],
    ) -> Vec<CandidateId> {
        self.by_class
            .get(&class(entry.key().fields()))
            .unwrap_or(&self.all)
            .iter()
            .filter(|c| current.contains(c))
            .take(k)
            .cloned()
            .collect()
    }
}

/// A key's class: its top-level text fields.
fn class(fields: &Fields) -> String {
    let mut text = String::new();
    for (name, value) in fields.iter() {
        if let Value::Str(s) = value {
            // Length-prefixed, so no two classes spell the same.
            text.push_str(&format!("{}:{name}{}:{s}", name.len(), s.len()));
        }
    }
    text
}

/// How much of a class's order is chosen greedily (the rest follows in id order): the lists
/// scored are rarely longer.
const GREEDY_LEN: usize = 32;

/// The order for `keys`: greedy for the first `k`, then the rest of their candidates (see
/// [`StaticLists::learn`]).
fn greedy(keys: &[&Entry], k: usize) -> Vec<CandidateId> {
    // Each key's ok medians by candidate, and its best.
    let timed: Vec<(HashMap<&CandidateId, f64>, f64)> = keys
        .iter()
        .map(|e| {
            let medians: HashMap<&CandidateId, f64> = e
                .candidates()
                .iter()
                .filter_map(|c| Some((&c.id, truth(e, &c.id).filter(|t| t.is_finite())?)))
                .collect();
            let best = medians.values().copied().fold(f64::INFINITY, f64::min);
            (medians, best)
        })
        .filter(|(_, best)| best.is_finite() && *best > 0.0)
        .collect();
    let mut pool: Vec<&CandidateId> = timed.iter().flat_map(|(m, _)| m.keys().copied()).collect();
    pool.sort();
    pool.dedup();
    // The list's best median so far per key (none yet: a failed choice's slowdown).
    let mut reached: Vec<f64> = timed
        .iter()
        .map(|(_, best)| best * FAILED_SLOWDOWN)
        .collect();
    let mut list = Vec::new();
    while list.len() < k && !pool.is_empty() {
        let gain = |c: &CandidateId| -> f64 {
            timed
                .iter()
                .zip(&reached)
                .map(|((m, _), &r)| m.get(c).map_or(0.0, |&t| (r / t.min(r)).ln()))
                .sum()
        };
        // The first in id order among equal gains, so the list is the same on every run.
        let (at, _) = pool.iter().enumerate().map(|(i, c)| (i, gain(c))).fold(
            (0, f64::NEG_INFINITY),
            |best, (i, g)| {
                if g > best.1 { (i, g) } else { best }
            },
        );
        let chosen = pool.remove(at);
        for ((m, _), r) in timed.iter().zip(&mut reached) {
            if let Some(&t) = m.get(chosen) {
                *r = r.min(t);
            }
        }
        list.push(chosen.clone());
    }
    list.extend(pool.into_iter().cloned());
    list
}

#[cfg(test)]
mod tests {
    use cache_core::cache_format::{Candidate, Fingerprint, Key, Origin, Stats};

    use super::*;

    fn stats(median: f64) -> Stats {
        Stats {
            median_ns: median,
            min_ns: median,
            spread_ns: 0.0,
            samples: 3,
        }
    }

    fn entry(dtype: &str, m: i64, medians: &[(&str, f64)]) -> Entry {
        let key = Key::new(Fields::from([
            ("dtype".to_owned(), Value::from(dtype)),
            ("m".to_owned(), Value::Int(m)),
        ]));
        let candidates = medians.iter().map(|(id, median)| {
            let stats = Stats {
                median_ns: *median,
                min_ns: *median,
                spread_ns: 0.0,
                samples: 3,
            };
            Candidate::measured(*id, Fields::new(), stats)
        });
        Entry::new(
            key,
            Fingerprint::default(),
            Origin::Measured("t".into()),
            0,
            candidates,
        )
    }

    #[test]
    fn a_list_per_class_covers_its_keys_and_an_unseen_class_gets_the_common_list() {
        // f16: "a" wins half the keys, "b" the other half, "c" is second everywhere. The best
        // single candidate is "c" (never far off); the best pair is "a" and "b".
        let mut train = Vec::new();
        for m in 0..10 {
            let (a, b) = if m % 2 == 0 {
                (10.0, 30.0)
            } else {
                (30.0, 10.0)
            };
            train.push(entry("f16", m, &[("a", a), ("b", b), ("c", 12.0)]));
        }
        // f32: "d" always wins.
        for m in 0..4 {
            train.push(entry("f32", m, &[("a", 20.0), ("d", 10.0)]));
        }
        let refs: Vec<&Entry> = train.iter().collect();
        let lists = StaticLists::learn(&refs);
        let id = |s: &str| CandidateId::new(s, &[]);
        let all = [id("a"), id("b"), id("c"), id("d")];
        assert_eq!(lists.list_for(&train[0], 1, &all), [id("c")]);
        assert_eq!(
            lists.list_for(&train[0], 2, &all),
            [id("c"), id("a")],
            "then a, the first of a and b in id order"
        );
        assert_eq!(lists.list_for(&train[12], 1, &all), [id("d")]);
        // A key without c takes the next in the order.
        assert_eq!(lists.list_for(&train[0], 2, &all[..2]), [id("a"), id("b")]);
        // The order goes on past what is asked: a key with only d and b in f16 gets b.
        assert_eq!(lists.list_for(&train[0], 1, &[id("b"), id("d")]), [id("b")]);
        let unseen = entry("bf16", 3, &[("a", 1.0)]);
        assert_eq!(
            lists.list_for(&unseen, 1, &all),
            [id("c")],
            "all keys: c is never far off"
        );
    }

    /// A hostile review: the static list of 3 scored 94.1% beside `--top 1,3` and 96.1% beside
    /// `--top 3,1000` (its order was learnt as long as the longest list asked); and keys with
    /// one candidate, or all of whose times were zero, were scored (100%, or a made-up 25%).
    #[test]
    fn a_list_of_k_scores_the_same_beside_any_other_k_and_unscorable_keys_are_left_out() {
        use super::super::evaluate::tests::{grid, tiles};
        let mut entries = grid();
        let figures = |top: &[usize], entries: &[Entry]| {
            super::super::evaluate(entries, &|_: &Entry| tiles(), &Default::default(), top)
        };
        let static_3 = |e: &super::super::Evaluation| {
            e.methods
                .iter()
                .find(|m| m.method == "static list of 3 per dtype")
                .cloned()
                .expect("the row")
        };
        let alone = figures(&[3], &entries);
        assert_eq!(static_3(&figures(&[1, 3, 50], &entries)), static_3(&alone));
        // Two keys nothing can be scored on: one candidate, and every time zero.
        let key = |m: i64| Key::new(Fields::from([("m".to_owned(), Value::Int(m))]));
        let one = Entry::new(
            key(7),
            Fingerprint::default(),
            Origin::Measured("t".into()),
            0,
            [Candidate::measured("blocked", Fields::new(), stats(5.0))],
        );
        let zero = Entry::new(
            key(9),
            Fingerprint::default(),
            Origin::Measured("t".into()),
            0,
            tiles()
                .into_iter()
                .map(|id| Candidate::measured(&id.algorithm, id.params.clone(), stats(0.0))),
        );
        entries.extend([one, zero]);
        let current = |e: &Entry| e.candidates().iter().map(|c| c.id.clone()).collect();
        let with = super::super::evaluate(&entries, &current, &Default::default(), &[3]);
        assert_eq!(with.keys, grid().len(), "{with:?}");
    }
}
