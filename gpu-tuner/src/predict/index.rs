//! An index of tuned keys, so a prediction among 100k of them looks at a few hundred rather
//! than all (issue 41's budget: 100 µs).
//!
//! Two keys are comparable when they have the same fields, the same list lengths and equal
//! text, bytes and float values (their *layout*); their distance is then a sum over the
//! integers of |ln(a+1) − ln(b+1)| + w·|alignment(a) − alignment(b)| + [signs differ], plus
//! [`FLAG_DISTANCE`] per differing flag, where restating fields count only as sizes of their own
//! (see `distance.rs`). Leaving the restating fields out, that is the L1 distance between points
//! with three coordinates per integer and one per flag, a lower bound of the whole distance; so
//! the keys of one layout go into a k-d tree over those points, each node with the box its
//! points span.
//! A search visits the nearer child first and skips a node whose box is farther than the
//! selection's k-th key ([`Selection::bound`]); every key it reaches is offered to the same
//! selection a walk of all keys uses, which measures the exact distance on the fields, so the
//! index returns exactly the keys a walk would (a test compares the two on random keys).

use std::collections::{HashMap, HashSet};
use std::fmt::Write;
use std::sync::Arc;

use cache_core::cache_format::{Entry, Fields, Fingerprint, Value};

use super::distance::{ALIGNMENT_WEIGHT, FLAG_DISTANCE, Restated, alignment};
use super::select::{ROOM, Selection};

/// Points per leaf: below this a node is searched point by point.
const LEAF: usize = 16;

/// The tuned keys of one namespace and scope, by layout, for nearest-key search (see the
/// module docs). Built once from a walk of the entries; a prediction then costs about the
/// logarithm of their number. Immutable: entries recorded later are passed beside it
/// ([`super::TunedKeys::Indexed`]) until it is built again.
#[derive(Debug, Default)]
pub struct KeyIndex {
    entries: Vec<Arc<Entry>>,
    trees: HashMap<String, Tree>,
    /// Learnt from the entries when the index is built, and used for the fresher keys too.
    restated: Restated,
}

impl KeyIndex {
    /// Indexes `entries`; of two entries of the same key, the later is kept.
    pub fn new(entries: impl IntoIterator<Item = Arc<Entry>>) -> KeyIndex {
        let mut at: HashMap<Fingerprint, usize> = HashMap::new();
        let mut entries: Vec<Arc<Entry>> = entries
            .into_iter()
            .enumerate()
            .map(|(i, e)| {
                at.insert(e.fingerprint(), i);
                e
            })
            .collect();
        let mut i = 0;
        entries.retain(|e| {
            i += 1;
            at.get(&e.fingerprint()) == Some(&(i - 1))
        });
        let restated = Restated::learn(entries.iter().map(|e| e.key().fields()));
        let mut layouts: HashMap<String, (Vec<f64>, Vec<u32>)> = HashMap::new();
        for (i, e) in entries.iter().enumerate() {
            let (layout, point) = coordinates(e.key().fields(), &restated);
            let (points, ids) = layouts.entry(layout).or_default();
            points.extend(point);
            ids.push(i as u32);
        }
        let trees = layouts
            .into_iter()
            .map(|(layout, (points, ids))| {
                let dims = points.len() / ids.len().max(1);
                (layout, Tree::build(dims, points, ids))
            })
            .collect();
        KeyIndex {
            entries,
            trees,
            restated,
        }
    }

    /// The restating fields learnt from its keys.
    pub(crate) fn restated(&self) -> &Restated {
        &self.restated
    }

    /// How many keys it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds no key.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Offers `selection` every key of `target`'s layout that could be among its nearest,
    /// except those whose fingerprint is in `skip`.
    pub(super) fn select<'a>(
        &'a self,
        target: &Fields,
        selection: &mut Selection<'a, '_>,
        skip: &HashSet<Fingerprint>,
    ) {
        let (layout, point) = coordinates(target, &self.restated);
        if let Some(tree) = self.trees.get(&layout) {
            let mut visit = Visit {
                tree,
                entries: &self.entries,
                query: &point,
                skip,
            };
            visit.node(0, selection);
        }
    }
}

/// A key's layout (what must be equal for two keys to be comparable) and its point.
fn coordinates(fields: &Fields, restated: &Restated) -> (String, Vec<f64>) {
    let mut layout = String::new();
    let mut point = Vec::new();
    fields_into(fields, restated, &mut layout, &mut point);
    (layout, point)
}

/// `restated` applies to the key's own fields; nested ones pass none.
fn fields_into(fields: &Fields, restated: &Restated, layout: &mut String, point: &mut Vec<f64>) {
    for (name, value) in fields {
        // Length-prefixed, so no two layouts spell the same.
        let _ = write!(layout, "{}:{name}", name.len());
        if matches!(value, Value::Int(_)) && restated.contains(name) {
            // Left out of the point: it adds nothing where both keys restate it.
            layout.push('r');
        } else {
            value_into(value, layout, point);
        }
    }
}

fn value_into(value: &Value, layout: &mut String, point: &mut Vec<f64>) {
    match value {
        Value::Int(v) => {
            layout.push('i');
            point.push(((*v).max(0) as f64 + 1.0).ln());
            point.push(ALIGNMENT_WEIGHT * alignment(*v));
            point.push(if *v < 0 { 1.0 } else { 0.0 });
        }
        Value::Bool(b) => {
            layout.push('b');
            point.push(if *b { FLAG_DISTANCE } else { 0.0 });
        }
        Value::List(items) => {
            let _ = write!(layout, "[{}", items.len());
            for item in items {
                value_into(item, layout, point);
            }
            layout.push(']');
        }
        Value::Map(fields) => {
            layout.push('{');
            fields_into(fields, &Restated::default(), layout, point);
            layout.push('}');
        }
        other => {
            let exact = format!("{other:?}");
            let _ = write!(layout, "={}:{exact}", exact.len());
        }
    }
}

/// The keys of one layout as a k-d tree (see the module docs).
#[derive(Debug)]
struct Tree {
    dims: usize,
    /// `dims` coordinates per key, in tree order.
    points: Vec<f64>,
    /// Which entry each point is.
    ids: Vec<u32>,
    nodes: Vec<Node>,
    /// Each node's box: `dims` lows, then `dims` highs.
    boxes: Vec<f64>,
}

#[derive(Debug, Clone, Copy)]
struct Node {
    start: u32,
    end: u32,
    /// The two children, or none for a leaf.
    children: Option<(u32, u32)>,
}

impl Tree {
    fn build(dims: usize, points: Vec<f64>, ids: Vec<u32>) -> Tree {
        let mut order: Vec<u32> = (0..ids.len() as u32).collect();
        let mut tree = Tree {
            dims,
            points: Vec::with_capacity(points.len()),
            ids: Vec::with_capacity(ids.len()),
            nodes: Vec::new(),
            boxes: Vec::new(),
        };
        if !order.is_empty() {
            tree.split(&points, &mut order, 0);
        }
        for &i in &order {
            let i = i as usize;
            tree.points
                .extend_from_slice(&points[i * dims..(i + 1) * dims]);
            tree.ids.push(ids[i]);
        }
        tree
    }

    /// Builds the node over `order` (positions `start..` in tree order); returns its number.
    fn split(&mut self, points: &[f64], order: &mut [u32], start: usize) -> u32 {
        let dims = self.dims;
        let at = |i: u32, d: usize| points[i as usize * dims + d];
        let mut lo = vec![f64::INFINITY; dims];
        let mut hi = vec![f64::NEG_INFINITY; dims];
        for &i in order.iter() {
            for d in 0..dims {
                lo[d] = lo[d].min(at(i, d));
                hi[d] = hi[d].max(at(i, d));
            }
        }
        let id = self.nodes.len() as u32;
        self.nodes.push(Node {
            start: start as u32,
            end: (start + order.len()) as u32,
            children: None,
        });
        self.boxes.extend_from_slice(&lo);
        self.boxes.extend_from_slice(&hi);
        let widest = (0..dims).max_by(|&a, &b| (hi[a] - lo[a]).total_cmp(&(hi[b] - lo[b])));
        let Some(d) = widest.filter(|&d| order.len() > LEAF && hi[d] > lo[d]) else {
            return id;
        };
        let mid = order.len() / 2;
        order.select_nth_unstable_by(mid, |&a, &b| at(a, d).total_cmp(&at(b, d)));
        let (left, right) = order.split_at_mut(mid);
        let l = self.split(points, left, start);
        let r = self.split(points, right, start + mid);
        self.nodes[id as usize].children = Some((l, r));
        id
    }

    /// The L1 distance from `q` to node `n`'s box (0 inside it).
    fn box_distance(&self, n: u32, q: &[f64]) -> f64 {
        let b = &self.boxes[n as usize * 2 * self.dims..(n as usize + 1) * 2 * self.dims];
        let (lo, hi) = b.split_at(self.dims);
        q.iter()
            .zip(lo.iter().zip(hi))
            .map(|(&x, (&l, &h))| (l - x).max(x - h).max(0.0))
            .sum()
    }

    fn point_distance(&self, i: usize, q: &[f64]) -> f64 {
        let p = &self.points[i * self.dims..(i + 1) * self.dims];
        p.iter().zip(q).map(|(a, b)| (a - b).abs()).sum()
    }
}

/// One search of a tree.
struct Visit<'a, 'q> {
    tree: &'a Tree,
    entries: &'a [Arc<Entry>],
    query: &'q [f64],
    skip: &'q HashSet<Fingerprint>,
}

impl<'a> Visit<'a, '_> {
    /// Whether a distance (measured on the points, which round differently from the fields)
    /// may still be within the selection's reach.
    fn within(d: f64, selection: &Selection<'a, '_>) -> bool {
        d <= selection.bound() + ROOM
    }

    fn node(&mut self, n: u32, selection: &mut Selection<'a, '_>) {
        let node = self.tree.nodes[n as usize];
        match node.children {
            None => {
                for i in node.start as usize..node.end as usize {
                    if !Self::within(self.tree.point_distance(i, self.query), selection) {
                        continue;
                    }
                    let e = &self.entries[self.tree.ids[i] as usize];
                    if !self.skip.contains(&e.fingerprint()) {
                        selection.offer(e);
                    }
                }
            }
            Some((l, r)) => {
                let dl = self.tree.box_distance(l, self.query);
                let dr = self.tree.box_distance(r, self.query);
                let (first, df, second, ds) = if dl <= dr {
                    (l, dl, r, dr)
                } else {
                    (r, dr, l, dl)
                };
                if Self::within(df, selection) {
                    self.node(first, selection);
                }
                if Self::within(ds, selection) {
                    self.node(second, selection);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use cache_core::cache_format::{Candidate, CandidateId, Key, Origin, Stats};

    use super::super::Predictor;
    use super::*;

    /// A small deterministic generator (xorshift), so a failure names its seed.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }

        /// A size: often a power of two or a multiple of one, sometimes 0 or negative.
        fn size(&mut self) -> i64 {
            match self.next(10) {
                0 => 0,
                1 => -(self.next(5) as i64) - 1,
                2..=4 => 1 << self.next(14),
                _ => (self.next(300) as i64 + 1) * (1 << self.next(5)),
            }
        }
    }

    fn fields(r: &mut Rng) -> Fields {
        let dtype = ["f16", "bf16", "f32"][r.next(3) as usize];
        let k = r.size();
        // A leading dimension that restates k (or 1) in most keys, a padded one in a few: it
        // is learnt as restating, and the index leaves it out of its points.
        let ld = match r.next(100) {
            0..=92 => k,
            93..=96 => 1,
            _ => r.size(),
        };
        let mut f = Fields::from([
            ("m".to_owned(), Value::Int(r.size())),
            ("n".to_owned(), Value::Int(r.size())),
            ("k".to_owned(), Value::Int(k)),
            ("ld".to_owned(), Value::Int(ld)),
            ("contiguous".to_owned(), Value::Bool(r.next(3) != 0)),
            ("dtype".to_owned(), Value::from(dtype)),
        ]);
        // A second layout: a stride list and a flag.
        if r.next(4) == 0 {
            let strides = vec![Value::Int(r.size()), Value::Int(1)];
            f.insert("strides".to_owned(), Value::List(strides));
            f.insert("fused".to_owned(), Value::Bool(r.next(2) == 0));
        }
        f
    }

    fn entry(f: Fields, r: &mut Rng, candidates: &[CandidateId]) -> Entry {
        let mut measured = Vec::new();
        for c in candidates {
            if r.next(5) == 0 {
                continue;
            }
            let t = 100.0 + r.next(50) as f64;
            let stats = Stats {
                median_ns: t,
                min_ns: t,
                spread_ns: 0.0,
                samples: 3,
            };
            measured.push(Candidate::measured(&c.algorithm, c.params.clone(), stats));
        }
        Entry::new(
            Key::new(f),
            Fingerprint::default(),
            Origin::Measured("t".into()),
            0,
            measured,
        )
    }

    /// The index must choose exactly the keys a walk of every key chooses, whatever the
    /// layouts, ties, duplicates, keys without a measured candidate and fresher versions.
    #[test]
    fn the_index_chooses_what_a_walk_of_every_key_chooses() {
        let candidates: Vec<CandidateId> = (0..4)
            .map(|i| CandidateId::new("tile", &[("t", i)]))
            .collect();
        for seed in 1..=6u64 {
            let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let mut tuned: Vec<Arc<Entry>> = (0..3000)
                .map(|_| {
                    let f = fields(&mut r);
                    Arc::new(entry(f, &mut r, &candidates))
                })
                .collect();
            // Some keys recorded twice: the later is kept.
            for i in (0..3000).step_by(61) {
                let f = tuned[i].key().fields().clone();
                tuned.push(Arc::new(entry(f, &mut r, &candidates)));
            }
            // Newer versions of some keys (recorded since the index was built), and new keys.
            let mut keys: Vec<Fields> = tuned
                .iter()
                .step_by(97)
                .map(|e| e.key().fields().clone())
                .collect();
            keys.extend((0..20).map(|_| fields(&mut r)));
            let fresher: Vec<Arc<Entry>> = keys
                .into_iter()
                .map(|f| Arc::new(entry(f, &mut r, &candidates)))
                .collect();
            let index = KeyIndex::new(tuned.iter().cloned());
            assert_eq!(index.restated().names(), ["ld"], "seed {seed}");
            let mut everything: HashMap<Fingerprint, Arc<Entry>> = tuned
                .iter()
                .map(|e| (e.fingerprint(), Arc::clone(e)))
                .collect();
            for e in &fresher {
                everything.insert(e.fingerprint(), Arc::clone(e));
            }
            assert!(
                index.len() < tuned.len(),
                "some keys come twice: the later is kept"
            );
            let walk: Vec<&Entry> = everything.values().map(|e| e.as_ref()).collect();
            for t in 0..60 {
                // Some targets are tuned keys themselves (their own entry is left out).
                let target = if t % 5 == 0 {
                    tuned[r.next(tuned.len() as u64) as usize]
                        .key()
                        .fields()
                        .clone()
                } else {
                    fields(&mut r)
                };
                for k in [1, 4, 9] {
                    let p = Predictor { neighbours: k };
                    let indexed = p.indexed(&target, &index, &fresher, &candidates);
                    let walked = p.scope_of(&target, walk.iter().copied(), &candidates);
                    assert_eq!(indexed, walked, "seed {seed}, target {t}, k {k}");
                }
            }
        }
    }

    #[test]
    fn an_empty_index_predicts_from_the_fresher_keys_alone() {
        let candidates = [CandidateId::new("a", &[])];
        let mut r = Rng(7);
        let f = fields(&mut r);
        let fresher = [Arc::new(entry(f.clone(), &mut r, &candidates))];
        let index = KeyIndex::new([]);
        assert!(index.is_empty());
        let mut other = f;
        other.insert("m".to_owned(), Value::Int(12_345));
        let p = Predictor::default().indexed(&other, &index, &fresher, &candidates);
        let none = Predictor::default().indexed(&other, &index, &[], &candidates);
        assert_eq!(p.map(|p| p.neighbours.len()), Some(1));
        assert_eq!(none, None);
    }
}
