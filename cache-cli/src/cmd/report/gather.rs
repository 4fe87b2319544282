//! What `tunecache report` shows, gathered in one walk of the entries: per namespace, counts
//! over every entry (winners, provenance, margins, scopes) and a sample of keys to draw.
//!
//! The sample is the keys of smallest fingerprint (a bottom-k sample: uniform, and the same
//! whatever order the entries come in), at most [`Budget::points`] per namespace, so a page
//! stays a few megabytes whatever the size of the cache; the page says when it samples.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use cache_core::cache_format::{Entry, Fields, Fingerprint, Origin, Outcome, Scope};

/// How much of a cache the page draws.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    /// Keys drawn per namespace.
    pub(crate) points: usize,
    /// Namespaces shown in full (the rest are listed with their counts).
    pub(crate) namespaces: usize,
    /// Keys listed whose winners differ between scopes, per namespace.
    pub(crate) differing: usize,
}

impl Budget {
    /// About 6,000 keys drawn in all (each on two charts, about 300 bytes a drawing), between
    /// 100 and 1,500 per namespace, for at most 40 namespaces: a page of a few megabytes
    /// whatever the cache holds (a million entries in 40 namespaces: about 4 MB).
    pub(crate) fn for_namespaces(n: usize) -> Budget {
        let shown = n.clamp(1, 40);
        Budget {
            points: (6_000 / shown).clamp(100, 1_500),
            namespaces: 40,
            differing: 25,
        }
    }
}

/// Where an entry's winner came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Provenance {
    /// Measured by a process on this host.
    MeasuredHere,
    /// Measured on another host (a merged or bundled file).
    MeasuredElsewhere,
    /// Fetched from a shared tier.
    Shared,
    /// Imported from another tool's file, with timings.
    Imported,
    /// Shipped: another tool chose it, without timings (a vLLM config, say).
    Shipped,
    /// Every candidate failed: no winner.
    NoWinner,
}

impl Provenance {
    pub(crate) const ALL: [Provenance; 6] = [
        Provenance::MeasuredHere,
        Provenance::MeasuredElsewhere,
        Provenance::Shared,
        Provenance::Imported,
        Provenance::Shipped,
        Provenance::NoWinner,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Provenance::MeasuredHere => "measured on this host",
            Provenance::MeasuredElsewhere => "measured on another host",
            Provenance::Shared => "from a shared tier",
            Provenance::Imported => "imported with timings",
            Provenance::Shipped => "shipped (chosen without timings)",
            Provenance::NoWinner => "no winner (every candidate failed)",
        }
    }

    fn of(entry: &Entry, host: &str) -> Provenance {
        let Some(best) = entry.best() else {
            return Provenance::NoWinner;
        };
        if matches!(best.outcome, Outcome::Chosen(_)) {
            return Provenance::Shipped;
        }
        match entry.origin() {
            Origin::Measured(by) if by.split(" pid ").next() == Some(host) => {
                Provenance::MeasuredHere
            }
            Origin::Measured(_) => Provenance::MeasuredElsewhere,
            Origin::Remote(_) => Provenance::Shared,
            Origin::Imported(_) => Provenance::Imported,
        }
    }
}

/// The bins of the runner-up's margin (how much slower the second best is), in percent.
pub(crate) const MARGIN_BINS: [(f64, &str); 6] = [
    (1.0, "under 1%"),
    (2.0, "1-2%"),
    (5.0, "2-5%"),
    (10.0, "5-10%"),
    (25.0, "10-25%"),
    (f64::INFINITY, "25% or more"),
];

/// One key drawn on the page.
#[derive(Debug, Clone)]
pub(crate) struct Point {
    /// Its place in the bottom-k order.
    rank: u64,
    pub(crate) fields: Fields,
    pub(crate) key: String,
    pub(crate) scope: usize,
    pub(crate) winner: Option<String>,
    pub(crate) median_ns: Option<f64>,
    /// How much slower the runner-up is, in percent.
    pub(crate) margin: Option<f64>,
}

impl PartialEq for Point {
    fn eq(&self, other: &Self) -> bool {
        self.rank == other.rank
    }
}
impl Eq for Point {}
impl PartialOrd for Point {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Point {
    fn cmp(&self, other: &Self) -> Ordering {
        self.rank.cmp(&other.rank)
    }
}

/// Everything shown of one namespace.
#[derive(Debug, Default)]
pub(crate) struct Namespace {
    pub(crate) keys: usize,
    /// Keys per winner (label).
    pub(crate) winners: HashMap<String, usize>,
    pub(crate) provenance: BTreeMap<Provenance, usize>,
    /// Keys per [`MARGIN_BINS`] bin; keys with one measured candidate are not counted.
    pub(crate) margins: [usize; MARGIN_BINS.len()],
    /// Keys whose margin is within the winner's own spread: their winner may flip.
    pub(crate) within_noise: usize,
    /// Keys per scope (index into [`Gathered::scopes`]).
    pub(crate) scopes: BTreeMap<usize, usize>,
    sample: BinaryHeap<Point>,
    /// Every key's fingerprint, scope and winner (an index into `labels`), to compare scopes.
    seen: Vec<(Fingerprint, u32, u32)>,
    labels: HashMap<String, u32>,
}

/// What the walk gathered.
#[derive(Debug, Default)]
pub(crate) struct Gathered {
    pub(crate) scopes: Vec<Scope>,
    pub(crate) namespaces: BTreeMap<String, Namespace>,
    pub(crate) entries: usize,
}

impl Gathered {
    /// Adds one entry.
    pub(crate) fn add(
        &mut self,
        scope: &Scope,
        ns: &str,
        entry: &Entry,
        host: &str,
        budget: Budget,
    ) {
        self.entries += 1;
        let scope_at = match self.scopes.iter().position(|s| s == scope) {
            Some(i) => i,
            None => {
                self.scopes.push(scope.clone());
                self.scopes.len() - 1
            }
        };
        if !self.namespaces.contains_key(ns) {
            self.namespaces.insert(ns.to_owned(), Namespace::default());
        }
        let n = self.namespaces.get_mut(ns).expect("just inserted");
        n.keys += 1;
        *n.scopes.entry(scope_at).or_default() += 1;
        *n.provenance.entry(Provenance::of(entry, host)).or_default() += 1;
        let best = entry.best();
        let winner = best.map(|c| c.id.label());
        let median = best.and_then(|c| c.stats()).map(|s| s.median_ns);
        let runner_up = entry
            .candidates()
            .get(1)
            .and_then(|c| c.stats())
            .map(|s| s.median_ns);
        let margin = match (median, runner_up) {
            (Some(m), Some(r)) if m > 0.0 => Some((r / m - 1.0) * 100.0),
            _ => None,
        };
        if let Some(margin) = margin {
            let bin = MARGIN_BINS
                .iter()
                .position(|(upto, _)| margin < *upto)
                .unwrap_or(MARGIN_BINS.len() - 1);
            n.margins[bin] += 1;
            let spread = best.and_then(|c| c.stats()).map(|s| s.spread_ns);
            if let (Some(spread), Some(m)) = (spread, median)
                && margin <= spread / m * 100.0
            {
                n.within_noise += 1;
            }
        }
        let label_at = match &winner {
            Some(w) => {
                *n.winners.entry(w.clone()).or_default() += 1;
                let next = n.labels.len() as u32;
                *n.labels.entry(w.clone()).or_insert(next)
            }
            None => u32::MAX,
        };
        let fp = entry.fingerprint();
        n.seen.push((fp, scope_at as u32, label_at));
        let rank = sample_rank(&fp, scope_at);
        if n.sample.len() < budget.points || n.sample.peek().is_some_and(|p| rank < p.rank) {
            n.sample.push(Point {
                rank,
                fields: entry.key().fields().clone(),
                key: entry.key().to_string(),
                scope: scope_at,
                winner,
                median_ns: median,
                margin,
            });
            if n.sample.len() > budget.points {
                n.sample.pop();
            }
        }
    }
}

/// A key's place in the sample: its fingerprint's first bytes, the scope mixed in so that the
/// same key under several scopes is not always drawn or left out together.
fn sample_rank(fp: &Fingerprint, scope: usize) -> u64 {
    let bytes = fp.to_hex();
    let head = u64::from_str_radix(&bytes[..16], 16).unwrap_or(0);
    head ^ (scope as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Keys present under two or more scopes whose winners differ.
#[derive(Debug, Default)]
pub(crate) struct Differing {
    /// Keys under two or more scopes.
    pub(crate) shared: usize,
    /// Of them, those whose winners differ.
    pub(crate) differ: usize,
    /// The first few such keys (by fingerprint): each scope's winner.
    pub(crate) rows: Vec<(Fingerprint, BTreeMap<usize, Option<String>>)>,
}

impl Namespace {
    /// The sample, in a stable order (by rank).
    pub(crate) fn sample(&self) -> Vec<Point> {
        let mut points: Vec<Point> = self.sample.iter().cloned().collect();
        points.sort();
        points
    }

    /// Whether the sample holds fewer keys than the namespace.
    pub(crate) fn sampled(&self) -> bool {
        self.sample.len() < self.keys
    }

    /// The keys whose winners differ between scopes (see [`Differing`]); at most `rows` listed.
    pub(crate) fn differing(&mut self, rows: usize) -> Differing {
        let mut out = Differing::default();
        if self.scopes.len() < 2 {
            return out;
        }
        let names: HashMap<u32, String> =
            self.labels.iter().map(|(l, i)| (*i, l.clone())).collect();
        self.seen
            .sort_unstable_by_key(|(fp, scope, _)| (*fp, *scope));
        for group in self.seen.chunk_by(|a, b| a.0 == b.0) {
            if group.len() < 2 {
                continue;
            }
            out.shared += 1;
            if group.iter().all(|(_, _, w)| *w == group[0].2) {
                continue;
            }
            out.differ += 1;
            if out.rows.len() < rows {
                let winners = group
                    .iter()
                    .map(|(_, s, w)| (*s as usize, names.get(w).cloned()))
                    .collect();
                out.rows.push((group[0].0, winners));
            }
        }
        out
    }
}
