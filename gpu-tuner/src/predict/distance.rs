//! How far apart two keys are, for choosing the tuned keys that vote on a miss.
//!
//! Two keys are comparable when they have the same fields, the same list lengths and equal
//! text, bytes and float values. Their distance is a sum over the values:
//!
//! - an integer: |ln(a+1) − ln(b+1)| + [`ALIGNMENT_WEIGHT`] · |alignment(a) − alignment(b)|,
//!   plus 1 when one is negative and the other not;
//! - a flag (a boolean): [`FLAG_DISTANCE`] when they differ. A key that differs only in a
//!   flag (a memory layout, say: `mat1_iscontig`) is a neighbour, not a stranger;
//! - a size that *restates* others ([`Restated`]): nothing, when it restates in both keys.
//!
//! Kernel keys often say a layout twice: a contiguous row-major matrix's strides are its
//! column count and 1, a transposed one's 1 and its row count, beside flags that already say
//! which. Counted as sizes, those strides count the shape a second time within a layout and
//! put a wall of several units between two layouts of the same shape. [`Restated::learn`]
//! finds such fields from the tuned keys themselves, so no key format has to declare them.

use cache_core::cache_format::{Fields, Value};

/// How much a difference in power-of-two alignment adds to a key distance, per power of two
/// (the trailing zero bits of a positive size, counted up to 7: 128-aligned and beyond are
/// alike). GPU kernels run differently on sizes their tiles divide: on Inductor's published
/// A100 TIMM mm timings this took the prediction from 96.8% to 97.7% of the optimum (5-fold;
/// chosen from 0, 0.3, 1 and 2.8, docs/rust.md).
pub(crate) const ALIGNMENT_WEIGHT: f64 = 0.3;

/// What a differing flag adds to a key distance: about the distance between sizes e and e²
/// times apart. Chosen on the AutoHeuristic A100 mm timings from 0.5, 1, 2.5 and 5 (with
/// restating sizes not counted, 1 was best; docs/rust.md).
pub(crate) const FLAG_DISTANCE: f64 = 1.0;

/// The share of a namespace's keys in which an integer field must restate another size for
/// it to count as restating ([`Restated::learn`]).
pub(crate) const RESTATING_SHARE: f64 = 0.9;

/// Fewer keys than this with a field never make it restating: two or three keys may agree
/// by chance.
const RESTATING_MIN_KEYS: usize = 8;

/// The top-level integer fields of a namespace's keys that restate other sizes: fields equal
/// to 1 or to another integer field of the same key in at least [`RESTATING_SHARE`] of the
/// keys (strides beside the sizes they are made of, say). Where both keys restate such a field
/// it adds nothing to their distance; where either has a value of its own (a padded leading
/// dimension) it counts as a size. A value restates only sizes that are not restating
/// themselves, so a size is always counted once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Restated(Vec<String>);

impl Restated {
    /// Learns the restating fields from the keys of a namespace: first each integer field's
    /// share of keys where it equals 1 or another integer field; then, most restating first
    /// (by name among equals), each field with a share of at least [`RESTATING_SHARE`] is
    /// taken if it still has it counting only the fields not already taken. Of two fields
    /// always equal (a stride and the size it always is), one is taken and the other stays a
    /// size, so every size is counted once.
    pub(crate) fn learn<'a>(keys: impl IntoIterator<Item = &'a Fields>) -> Restated {
        let keys: Vec<&'a Fields> = keys.into_iter().collect();
        let share = |name: &str, taken: &[String]| -> Option<f64> {
            let (mut held, mut restating) = (0usize, 0usize);
            for fields in &keys {
                let Some(Value::Int(v)) = fields.get(name) else {
                    continue;
                };
                held += 1;
                let restates = *v == 1
                    || fields.iter().any(|(other, w)| {
                        other != name && *w == Value::Int(*v) && !taken.contains(other)
                    });
                restating += usize::from(restates);
            }
            (held >= RESTATING_MIN_KEYS).then(|| restating as f64 / held as f64)
        };
        let mut names: Vec<&str> = keys
            .iter()
            .flat_map(|f| f.iter())
            .filter(|(_, v)| matches!(v, Value::Int(_)))
            .map(|(n, _)| n.as_str())
            .collect();
        names.sort_unstable();
        names.dedup();
        let mut candidates: Vec<(f64, &str)> = names
            .into_iter()
            .filter_map(|n| Some((share(n, &[])?, n)))
            .filter(|(s, _)| *s >= RESTATING_SHARE)
            .collect();
        candidates.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
        let mut taken: Vec<String> = Vec::new();
        for (_, name) in candidates {
            if share(name, &taken).is_some_and(|s| s >= RESTATING_SHARE) {
                taken.push(name.to_owned());
            }
        }
        taken.sort();
        Restated(taken)
    }

    /// The restating fields' names, in order.
    pub(crate) fn names(&self) -> &[String] {
        &self.0
    }

    /// Whether `name` is a restating field.
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.0.binary_search_by(|n| n.as_str().cmp(name)).is_ok()
    }

    /// Whether the value `v` of the restating field `name` restates in `fields`: it is 1, or
    /// equal to a field that is not restating.
    fn restates(&self, fields: &Fields, name: &str, v: i64) -> bool {
        v == 1
            || fields
                .iter()
                .any(|(other, w)| other != name && *w == Value::Int(v) && !self.contains(other))
    }
}

/// The power of two a size is a multiple of, as its trailing zero bits up to 7.
pub(crate) fn alignment(v: i64) -> f64 {
    if v > 0 {
        f64::from(v.trailing_zeros().min(7))
    } else {
        0.0
    }
}

/// The distance between two keys (see the module docs); `None` when they are not comparable.
pub(crate) fn distance(a: &Fields, b: &Fields, restated: &Restated) -> Option<f64> {
    distance_within(a, b, restated, f64::INFINITY)
}

/// [`distance`], giving up as soon as the sum passes `bound` (then some value above `bound`,
/// which may be less than the whole distance, or `None` for keys found incomparable so far): a
/// search for the nearest keys dismisses most keys after a field or two.
pub(crate) fn distance_within(
    a: &Fields,
    b: &Fields,
    restated: &Restated,
    bound: f64,
) -> Option<f64> {
    if a.len() != b.len() {
        return None;
    }
    let mut total = 0.0;
    for ((ka, va), (kb, vb)) in a.iter().zip(b.iter()) {
        if ka != kb {
            return None;
        }
        total += match (va, vb) {
            (Value::Int(x), Value::Int(y))
                if restated.contains(ka)
                    && restated.restates(a, ka, *x)
                    && restated.restates(b, kb, *y) =>
            {
                0.0
            }
            _ => value_distance(va, vb)?,
        };
        if total > bound {
            return Some(total);
        }
    }
    Some(total)
}

fn value_distance(a: &Value, b: &Value) -> Option<f64> {
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => {
            let f = |v: i64| ((v.max(0) as f64) + 1.0).ln();
            let sign = if (x < &0) != (y < &0) { 1.0 } else { 0.0 };
            Some(
                (f(*x) - f(*y)).abs()
                    + ALIGNMENT_WEIGHT * (alignment(*x) - alignment(*y)).abs()
                    + sign,
            )
        }
        (Value::Bool(x), Value::Bool(y)) => Some(if x == y { 0.0 } else { FLAG_DISTANCE }),
        (Value::List(x), Value::List(y)) if x.len() == y.len() => {
            x.iter().zip(y).map(|(p, q)| value_distance(p, q)).sum()
        }
        (Value::Map(x), Value::Map(y)) => distance(x, y, &Restated::default()),
        (x, y) if x == y => Some(0.0),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(pairs: &[(&str, i64)]) -> Fields {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::Int(*v)))
            .collect()
    }

    fn none() -> Restated {
        Restated::default()
    }

    #[test]
    fn distance_needs_the_same_fields_and_prefers_close_sizes() {
        let a = f(&[("m", 128), ("n", 128)]);
        let near = f(&[("m", 128), ("n", 256)]);
        let far = f(&[("m", 4096), ("n", 4096)]);
        let d = |x: &Fields, y: &Fields| distance(x, y, &none()).expect("comparable");
        assert!(d(&a, &near) < d(&a, &far));
        assert_eq!(distance(&a, &f(&[("m", 128)]), &none()), None);
        // Of two sizes about as near, the one its tiles divide as they divide the key's is
        // nearer: 1024 and 1023 differ by 0.001 in size but by ten powers of two in alignment.
        let aligned = f(&[("m", 1024), ("n", 128)]);
        let odd = f(&[("m", 1023), ("n", 128)]);
        let gap = d(&aligned, &odd);
        assert!(
            (gap - (0.3 * 7.0 + (1025f64 / 1024.0).ln())).abs() < 1e-9,
            "{gap}"
        );
        assert!(d(&aligned, &f(&[("m", 1152), ("n", 128)])) < gap);
        let mut typed = a.clone();
        typed.insert("dtype", Value::from("f16"));
        let mut other = a.clone();
        other.insert("dtype", Value::from("f32"));
        assert_eq!(
            distance(&typed, &other, &none()),
            None,
            "different dtypes never stand in for each other"
        );
    }

    #[test]
    fn a_differing_flag_makes_a_neighbour_one_unit_away() {
        let mut a = f(&[("m", 128), ("n", 128)]);
        a.insert("contiguous", Value::Bool(true));
        let mut b = a.clone();
        b.insert("contiguous", Value::Bool(false));
        assert_eq!(distance(&a, &b, &none()), Some(FLAG_DISTANCE));
        let mut c = b.clone();
        c.insert("contiguous", Value::from("False"));
        assert_eq!(distance(&a, &c, &none()), None, "a flag is not its text");
    }

    /// A matmul key with its strides: row-major (k, 1) or transposed (1, m), or padded.
    fn mm(m: i64, k: i64, layout: &str) -> Fields {
        let (s0, s1) = match layout {
            "row" => (k, 1),
            "col" => (1, m),
            _ => (k + 128, 1),
        };
        let mut key = f(&[("m", m), ("k", k), ("stride_0", s0), ("stride_1", s1)]);
        key.insert("contiguous", Value::Bool(layout != "col"));
        key
    }

    #[test]
    fn strides_that_restate_the_shape_are_learnt_and_counted_once() {
        let mut keys: Vec<Fields> = Vec::new();
        for i in 0..40 {
            let layout = if i % 3 == 0 { "col" } else { "row" };
            keys.push(mm(64 << (i % 7), 32 << (i % 5), layout));
        }
        // One padded key in forty is still restating in 97.5% of them.
        keys.push(mm(256, 100, "pad"));
        let restated = Restated::learn(&keys);
        assert_eq!(restated.names(), ["stride_0", "stride_1"]);
        let d = |x: &Fields, y: &Fields| distance(x, y, &restated).expect("comparable");
        // Within a layout the stride adds nothing: k is counted once.
        let (a, b) = (mm(256, 128, "row"), mm(256, 1024, "row"));
        assert!((d(&a, &b) - (1025f64 / 129.0).ln()).abs() < 1e-9);
        // Across layouts: the flag alone.
        assert_eq!(d(&mm(256, 128, "row"), &mm(256, 128, "col")), FLAG_DISTANCE);
        // A padded stride is a size of its own: near the dense one, not equal to it.
        let padded = d(&mm(300, 128, "row"), &mm(300, 128, "pad"));
        assert!(padded > 0.0 && padded < 1.0, "{padded}");
        // Without the learnt fields, the strides count: k twice, a wall between layouts.
        assert!(distance(&a, &b, &none()) > Some(1.9 * (1025f64 / 129.0).ln()));
        assert!(distance(&mm(256, 128, "row"), &mm(256, 128, "col"), &none()) > Some(5.0));
    }

    #[test]
    fn sizes_that_agree_by_chance_are_not_restating() {
        // m equals n in a fifth of the keys: both stay sizes, counted in full.
        let keys: Vec<Fields> = (0..50)
            .map(|i| f(&[("m", 64 + i), ("n", if i % 5 == 0 { 64 + i } else { 999 })]))
            .collect();
        assert!(Restated::learn(&keys).names().is_empty());
        // Too few keys to tell, whatever they say.
        let few: Vec<Fields> = (0..7).map(|i| f(&[("m", i + 2), ("n", i + 2)])).collect();
        assert!(Restated::learn(&few).names().is_empty());
        // Two fields always equal (a stride that is always its size): one is taken, the other
        // stays a size, so the size is counted exactly once.
        let twins: Vec<Fields> = (0..20).map(|i| f(&[("k", i + 5), ("ld", i + 5)])).collect();
        let restated = Restated::learn(&twins);
        assert_eq!(restated.names(), ["k"], "the first by name among equals");
        let (a, b) = (&twins[0], &twins[19]);
        let once = distance(&f(&[("k", 5)]), &f(&[("k", 24)]), &none());
        assert_eq!(distance(a, b, &restated), once);
    }
}
