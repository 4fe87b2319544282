//! Choosing the tuned keys that vote: the `k` nearest with a measured current candidate, in
//! one pass that keeps only the `k` best so far. A key farther than the k-th is dismissed on
//! its distance alone, so a walk of a million keys costs a million distances, not a sort; and
//! an index ([`super::KeyIndex`]) asks the same selection how far it still needs to look.

use std::cmp::Ordering;

use cache_core::cache_format::{Entry, Fields, Fingerprint, Key, Value};

use super::distance::{Restated, distance_within};
use super::{Current, measured_best};

/// A tuned key as the selection orders it: distance, then the smaller problem, then the
/// fingerprint.
pub(super) type Near<'a> = (f64, f64, Fingerprint, &'a Entry);

/// Room left past the k-th's distance for the rounding of [`quantized`]: a key within it may
/// still tie with the k-th and enter on the finer order.
pub(super) const ROOM: f64 = 1e-6;

/// A distance rounded to 1e-9: sums of logarithms that are equal in exact arithmetic (sizes
/// mirrored around the target on the log scale) can differ in their last bits, and the
/// prefer-lower rule must see them as the tie they are.
pub(super) fn quantized(d: f64) -> f64 {
    (d * 1e9).round() / 1e9
}

pub(super) fn near_cmp(a: &Near<'_>, b: &Near<'_>) -> Ordering {
    a.0.total_cmp(&b.0)
        .then(a.1.total_cmp(&b.1))
        .then(a.2.cmp(&b.2))
}

/// The `k` nearest tuned keys so far (see the module docs).
pub(super) struct Selection<'a, 't> {
    target: &'t Fields,
    current: &'t Current<'t>,
    restated: &'t Restated,
    k: usize,
    /// The target's own fingerprint, when its own entry must be left out.
    own: Option<Fingerprint>,
    best: Vec<Near<'a>>,
}

impl<'a, 't> Selection<'a, 't> {
    pub(super) fn new(
        target: &'t Fields,
        current: &'t Current<'t>,
        restated: &'t Restated,
        k: usize,
        skip_own: bool,
    ) -> Self {
        Selection {
            target,
            current,
            restated,
            k: k.max(1),
            own: skip_own.then(|| Key::new(target.clone()).fingerprint()),
            // Grows past this only when there are that many keys: a huge `k` is "all".
            best: Vec::with_capacity(k.min(1024) + 1),
        }
    }

    /// How far a key may be and still enter (infinite until `k` keys are held).
    pub(super) fn bound(&self) -> f64 {
        match self.best.last() {
            Some(w) if self.best.len() == self.k => w.0 + ROOM,
            _ => f64::INFINITY,
        }
    }

    /// Considers one tuned key.
    pub(super) fn offer(&mut self, e: &'a Entry) {
        let Some(d) = distance_within(self.target, e.key().fields(), self.restated, self.bound())
            .map(quantized)
        else {
            return;
        };
        // Only a key within the k-th's distance can enter (ties go on to the finer order).
        let full = self.best.len() == self.k;
        if full && self.best.last().is_some_and(|w| d > w.0) {
            return;
        }
        if Some(e.fingerprint()) == self.own || measured_best(e, self.current).is_none() {
            return;
        }
        let cand = (
            d,
            lower_first(self.target, e.key().fields()),
            e.fingerprint(),
            e,
        );
        if full
            && self
                .best
                .last()
                .is_some_and(|w| near_cmp(&cand, w) != Ordering::Less)
        {
            return;
        }
        let at = self
            .best
            .binary_search_by(|x| near_cmp(x, &cand))
            .unwrap_or_else(|i| i);
        self.best.insert(at, cand);
        self.best.truncate(self.k);
    }

    /// The keys chosen, nearest first.
    pub(super) fn finish(self) -> Vec<Near<'a>> {
        self.best
    }
}

/// The `k` nearest tuned keys of `tuned` with a measured current candidate, nearest first,
/// and the restating fields the distance used: `learnt`, or else learnt from `tuned`.
pub(super) fn nearest<'a>(
    target: &Fields,
    tuned: impl IntoIterator<Item = &'a Entry>,
    current: &Current<'_>,
    k: usize,
    skip_own: bool,
    learnt: Option<&Restated>,
) -> (Vec<Near<'a>>, Restated) {
    let tuned: Vec<&'a Entry> = tuned.into_iter().collect();
    let restated = match learnt {
        Some(r) => r.clone(),
        None => Restated::learn(tuned.iter().map(|e| e.key().fields())),
    };
    let mut selection = Selection::new(target, current, &restated, k, skip_own);
    for e in tuned {
        selection.offer(e);
    }
    let near = selection.finish();
    (near, restated)
}

/// For ties in distance: how much larger the neighbour is than the target, on the log scale
/// (negative: smaller), so the smaller neighbour comes first.
pub(super) fn lower_first(target: &Fields, other: &Fields) -> f64 {
    target
        .iter()
        .zip(other.iter())
        .map(|((_, a), (_, b))| signed(a, b))
        .sum()
}

fn signed(a: &Value, b: &Value) -> f64 {
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => {
            let f = |v: i64| ((v.max(0) as f64) + 1.0).ln();
            f(*y) - f(*x)
        }
        (Value::List(x), Value::List(y)) => x.iter().zip(y).map(|(p, q)| signed(p, q)).sum(),
        (Value::Map(x), Value::Map(y)) => lower_first(x, y),
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use cache_core::cache_format::{Candidate, CandidateId, Origin, Stats};

    use super::super::distance::distance;
    use super::*;

    #[test]
    fn the_one_pass_selection_equals_sorting_every_key() {
        let current = vec![CandidateId::new("a", &[]), CandidateId::new("b", &[])];
        // Many keys at equal distances (mirror sizes around the target), some without a
        // measured current candidate, one of another layout.
        let mut entries = Vec::new();
        for (i, (m, n)) in (1..40i64)
            .flat_map(|m| (1..6i64).map(move |n| (m, n)))
            .enumerate()
        {
            let layout = if i % 17 == 0 { "nt" } else { "nn" };
            let key = Key::new(Fields::from([
                ("m".to_owned(), Value::Int(m * 8)),
                ("n".to_owned(), Value::Int(n * 8)),
                ("layout".to_owned(), Value::from(layout)),
            ]));
            let stats = Stats {
                median_ns: 10.0 + (i % 5) as f64,
                min_ns: 10.0,
                spread_ns: 0.0,
                samples: 3,
            };
            let algo = if i % 11 == 0 { "retired" } else { "a" };
            let c = Candidate::measured(algo, Fields::new(), stats);
            entries.push(Entry::new(
                key,
                Fingerprint::default(),
                Origin::Measured("t".into()),
                0,
                [c],
            ));
        }
        for (m, n) in [(160, 24), (8, 8), (333, 40), (1, 1)] {
            let target = Fields::from([
                ("m".to_owned(), Value::Int(m)),
                ("n".to_owned(), Value::Int(n)),
                ("layout".to_owned(), Value::from("nn")),
            ]);
            let own = Key::new(target.clone()).fingerprint();
            let mut all: Vec<Near<'_>> = entries
                .iter()
                .filter(|e| {
                    e.fingerprint() != own && measured_best(e, &Current::new(&current)).is_some()
                })
                .filter_map(|e| {
                    let d = quantized(distance(&target, e.key().fields(), &Restated::default())?);
                    Some((
                        d,
                        lower_first(&target, e.key().fields()),
                        e.fingerprint(),
                        e,
                    ))
                })
                .collect();
            all.sort_by(near_cmp);
            for k in [1, 4, 10] {
                let fast: Vec<Fingerprint> =
                    nearest(&target, &entries, &Current::new(&current), k, true, None)
                        .0
                        .iter()
                        .map(|n| n.2)
                        .collect();
                let slow: Vec<Fingerprint> = all.iter().take(k).map(|n| n.2).collect();
                assert_eq!(fast, slow, "target {m}x{n}, k {k}");
            }
        }
        // An exact tie met larger first: ln 64 - ln 16 = ln 16 - ln 4, so for m = 15 the keys
        // m = 63 and m = 3 are equally near, and the smaller one must win the one place.
        let key = |m: i64| {
            let stats = Stats {
                median_ns: 10.0,
                min_ns: 10.0,
                spread_ns: 0.0,
                samples: 3,
            };
            let c = Candidate::measured("a", Fields::new(), stats);
            let fields = Fields::from([("m".to_owned(), Value::Int(m))]);
            Entry::new(
                Key::new(fields),
                Fingerprint::default(),
                Origin::Measured("t".into()),
                0,
                [c],
            )
        };
        let pair = [key(63), key(3)];
        let target = Fields::from([("m".to_owned(), Value::Int(15))]);
        let (got, _) = nearest(&target, &pair, &Current::new(&current), 1, true, None);
        assert_eq!(got[0].3.key().fields().get("m"), Some(&Value::Int(3)));
    }
}
