//! A namespace's charts: the winners over the two numeric key fields that vary most, one
//! panel per value of the third (so keys that differ in it are not drawn over each other),
//! and the winner's time against problem size, unless the map already is that chart (one
//! field against the time).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

use cache_core::cache_format::{Fields, Value};

use super::gather::Point;
use super::html::{HOVER, colour_of};
use super::svg::{Axis, Dot, Ticks, escape, scatter, shorten};
use crate::render::fmt_ns;

/// The most panels a map is split into; past it, the third field's values are grouped.
const PANELS: usize = 6;

/// The integer fields of a key, top level and in lists (`name[i]`), by name.
fn numbers(fields: &Fields) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for (name, v) in fields {
        match v {
            Value::Int(i) => out.push((name.clone(), *i)),
            Value::List(items) => {
                for (j, item) in items.iter().enumerate() {
                    if let Value::Int(i) = item {
                        out.push((format!("{name}[{j}]"), *i));
                    }
                }
            }
            _ => {}
        }
    }
    out
}

fn log2_size(v: i64) -> f64 {
    ((v.max(0) as f64) + 1.0).log2()
}

fn number(p: &Point, name: &str) -> Option<i64> {
    numbers(&p.fields)
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v)
}

/// The numeric fields that vary over the sample (on the log scale), most first.
fn axes(points: &[Point]) -> Vec<String> {
    let mut sums: BTreeMap<String, (f64, f64, usize)> = BTreeMap::new();
    for p in points {
        for (name, v) in numbers(&p.fields) {
            let x = log2_size(v);
            let e = sums.entry(name).or_default();
            e.0 += x;
            e.1 += x * x;
            e.2 += 1;
        }
    }
    let mut spread: Vec<(String, f64)> = sums
        .into_iter()
        .filter(|(_, (_, _, n))| *n * 2 >= points.len())
        .map(|(name, (sum, sq, n))| {
            let mean = sum / n as f64;
            (name, sq / n as f64 - mean * mean)
        })
        .filter(|(_, var)| *var > 1e-9)
        .collect();
    spread.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    spread.into_iter().map(|(n, _)| n).collect()
}

/// Whether the winner map is drawn against the winner's time (one numeric field varies): the
/// time-by-size chart would then draw the same thing again.
pub(super) fn map_is_time(points: &[Point]) -> bool {
    axes(points).len() == 1
}

/// What hovering a point of the winner map says.
fn title(p: &Point) -> String {
    format!(
        "{}\nscope {}\nwinner: {}\nmedian: {}\nrunner-up: {}",
        shorten(&p.key, HOVER),
        p.scope,
        p.winner
            .as_deref()
            .map_or("none".to_owned(), |w| shorten(w, HOVER)),
        p.median_ns.map_or("-".to_owned(), fmt_ns),
        p.margin
            .map_or("none measured".to_owned(), |m| format!("{m:.1}% slower")),
    )
}

/// The panels of the third field `name`: each with its caption and the range of values it
/// holds; one per value up to [`PANELS`], else that many groups of neighbouring values; keys
/// without the field in a panel of their own.
fn panels(points: &[Point], name: &str) -> Vec<(String, Option<(i64, i64)>)> {
    let values: Vec<i64> = points
        .iter()
        .filter_map(|p| number(p, name))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut out: Vec<(String, Option<(i64, i64)>)> = values
        .chunks(values.len().div_ceil(PANELS).max(1))
        .map(|group| {
            let (lo, hi) = (group[0], group[group.len() - 1]);
            let caption = if lo == hi {
                format!("{name} = {lo}")
            } else {
                format!("{name} from {lo} to {hi}")
            };
            (caption, Some((lo, hi)))
        })
        .collect();
    if points.iter().any(|p| number(p, name).is_none()) {
        out.push((format!("without {name}"), None));
    }
    out
}

/// Winners over the two numeric fields that vary most, a panel per value of the third (or one
/// field against the time).
pub(super) fn winner_map(points: &[Point], colours: &HashMap<String, &'static str>) -> String {
    let names = axes(points);
    let log = |p: &Point, name: &str| number(p, name).map(log2_size);
    let (xs, ys): (Vec<Option<f64>>, Vec<Option<f64>>) = match names.as_slice() {
        [a, b, ..] => points.iter().map(|p| (log(p, a), log(p, b))).unzip(),
        [a] => points
            .iter()
            .map(|p| (log(p, a), p.median_ns.map(f64::log10)))
            .unzip(),
        [] => return "<p class=\"note nomap\">No numeric key field varies: no map of the winners.</p>".to_owned(),
    };
    let x = Axis::over(&names[0], xs.iter().flatten().copied(), Ticks::Log2);
    let y = match names.get(1) {
        Some(b) => Axis::over(b, ys.iter().flatten().copied(), Ticks::Log2),
        None => Axis::over(
            "winner's median",
            ys.iter().flatten().copied(),
            Ticks::Log10Nanos,
        ),
    };
    let (Some(x), Some(y)) = (x, y) else {
        return String::new();
    };
    let dot = |i: usize| -> Option<Dot> {
        Some(Dot {
            x: xs[i]?,
            y: ys[i]?,
            colour: colour_of(colours, &points[i]),
            title: title(&points[i]),
        })
    };
    let caption = format!(
        "Winners by <code>{}</code>{}",
        escape(&names[0]),
        names.get(1).map_or(String::new(), |b| format!(
            " and <code>{}</code>",
            escape(b)
        ))
    );
    let Some(third) = names.get(2) else {
        let dots: Vec<Dot> = (0..points.len()).filter_map(dot).collect();
        return format!(
            "<figure><figcaption>{caption}</figcaption>{}</figure>",
            scatter("winner-map", &x, &y, &dots)
        );
    };
    let mut out = String::new();
    for (panel, range) in panels(points, third) {
        let dots: Vec<Dot> = (0..points.len())
            .filter(|&i| match (number(&points[i], third), range) {
                (Some(v), Some((lo, hi))) => (lo..=hi).contains(&v),
                (None, None) => true,
                _ => false,
            })
            .filter_map(dot)
            .collect();
        let _ = write!(
            out,
            "<figure><figcaption>{caption}, {}</figcaption>{}</figure>",
            escape(&panel),
            scatter("winner-map", &x, &y, &dots)
        );
    }
    if names.len() > 3 {
        let rest: Vec<String> = names[3..]
            .iter()
            .map(|n| format!("<code>{}</code>", escape(n)))
            .collect();
        let _ = write!(
            out,
            "<p class=\"note overlap\">Keys that differ only in {} are drawn over each other.</p>",
            rest.join(", ")
        );
    }
    out
}

/// The winner's median against the problem size (the product of the numeric fields).
pub(super) fn time_by_size(points: &[Point], colours: &HashMap<String, &'static str>) -> String {
    let sized: Vec<(&Point, f64, f64)> = points
        .iter()
        .filter_map(|p| {
            let size: f64 = numbers(&p.fields)
                .into_iter()
                .map(|(_, v)| log2_size(v))
                .sum();
            let t = p.median_ns.filter(|t| *t > 0.0)?.log10();
            (size > 0.0).then_some((p, size, t))
        })
        .collect();
    let x = Axis::over(
        "problem size (product of the numeric fields)",
        sized.iter().map(|s| s.1),
        Ticks::Log2,
    );
    let y = Axis::over(
        "winner's median",
        sized.iter().map(|s| s.2),
        Ticks::Log10Nanos,
    );
    let (Some(x), Some(y)) = (x, y) else {
        return "<p class=\"note notime\">No timed winner with a numeric key: no time chart.</p>"
            .to_owned();
    };
    let dots: Vec<Dot> = sized
        .iter()
        .map(|(p, sx, ty)| Dot {
            x: *sx,
            y: *ty,
            colour: colour_of(colours, p),
            title: format!(
                "{}\n{}",
                shorten(&p.key, HOVER / 2),
                p.median_ns.map_or(String::new(), fmt_ns)
            ),
        })
        .collect();
    format!(
        "<figure><figcaption>The winner's time against problem size</figcaption>{}</figure>",
        scatter("time-by-size", &x, &y, &dots)
    )
}

#[cfg(test)]
mod tests {
    use cache_core::cache_format::{Candidate, Entry, Fingerprint, Key, Origin, Scope, Stats};

    use super::super::gather::{Budget, Gathered};
    use super::*;

    /// The sample of one namespace whose keys are `keys` (name, value pairs).
    fn sample(keys: &[Vec<(&str, i64)>]) -> Vec<Point> {
        let scope = Scope::new(Fields::from([("device".to_owned(), Value::from("x"))]));
        let mut g = Gathered::default();
        for (i, k) in keys.iter().enumerate() {
            let key = Key::new(
                k.iter()
                    .map(|(n, v)| ((*n).to_owned(), Value::Int(*v)))
                    .collect(),
            );
            let stats = Stats {
                median_ns: 100.0 + i as f64,
                min_ns: 100.0,
                spread_ns: 1.0,
                samples: 5,
            };
            let c = Candidate::measured(if i % 2 == 0 { "a" } else { "b" }, Fields::new(), stats);
            let e = Entry::new(
                key,
                Fingerprint::default(),
                Origin::Measured("h".into()),
                0,
                [c],
            );
            g.add(&scope, "op", &e, "h", Budget::for_namespaces(1));
        }
        g.namespaces["op"].sample()
    }

    fn count(s: &str, needle: &str) -> usize {
        s.matches(needle).count()
    }

    #[test]
    fn keys_that_differ_in_a_third_field_are_drawn_in_panels_of_their_own() {
        let mut keys = Vec::new();
        for m in [16, 64, 256, 1024] {
            for n in [32, 128, 512, 2048] {
                for k in [64, 128] {
                    keys.push(vec![("m", m), ("n", n), ("k", k)]);
                }
            }
        }
        let points = sample(&keys);
        let map = winner_map(&points, &HashMap::new());
        assert_eq!(count(&map, "<svg class=\"winner-map\""), 2, "{map}");
        assert_eq!(
            count(&map, "<circle class=\"dot\""),
            keys.len(),
            "every key once"
        );
        assert!(map.contains(", k = 64</figcaption>") && map.contains(", k = 128</figcaption>"));
        assert!(!map_is_time(&points));
        assert!(!map.contains("drawn over each other"));
    }

    #[test]
    fn many_values_of_the_third_field_are_grouped_and_a_fourth_is_said() {
        let mut keys = Vec::new();
        for m in [16, 256, 4096] {
            for n in [8, 1024] {
                for k in 1..=20 {
                    keys.push(vec![("m", m), ("n", n), ("k", k * 8), ("batch", k % 2 + 1)]);
                }
            }
        }
        let points = sample(&keys);
        let map = winner_map(&points, &HashMap::new());
        let panels = count(&map, "<svg class=\"winner-map\"");
        assert!((2..=PANELS).contains(&panels), "{panels} panels");
        assert_eq!(count(&map, "<circle class=\"dot\""), keys.len());
        assert!(map.contains("k from 8 to 32"), "{map}");
        assert!(map.contains("differ only in <code>batch</code>"), "{map}");
    }

    #[test]
    fn one_varying_field_is_drawn_once_against_the_time() {
        let keys: Vec<Vec<(&str, i64)>> = (10..20)
            .map(|p| vec![("n", 1i64 << p), ("dtype_bits", 32)])
            .collect();
        let points = sample(&keys);
        assert!(map_is_time(&points), "the map is the time chart");
        let map = winner_map(&points, &HashMap::new());
        assert_eq!(count(&map, "<svg class=\"winner-map\""), 1);
        assert!(
            map.contains("Winners by <code>n</code></figcaption>"),
            "{map}"
        );
    }
}
