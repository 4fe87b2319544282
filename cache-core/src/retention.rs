//! What a cache keeps: the age and size limits (`Retention`), and the order a size limit
//! drops entries in (stale scopes whole first, then the oldest). Pure rules over entries'
//! scopes, times and sizes, below the disk layer that applies them at each compaction and the
//! `gc` command that applies them on demand.

use std::time::Duration;

use cache_format::{CacheData, Fingerprint, Scope, now_millis};
use cache_migrate::Migrations;

/// How long entries are kept, and how large a snapshot may grow: applied by a `Cache` at each
/// compaction (see [`crate::CacheBuilder::retention`]) and by [`crate::gc_file`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    /// Drop entries recorded longer ago than this.
    pub max_age: Option<Duration>,
    /// Drop the entries recorded longest ago until the snapshot is at most this many bytes.
    pub max_bytes: Option<u64>,
}

/// A scope with no result recorded for this long, while others of the same file received
/// results since, is stale: a size limit drops its entries before any other's.
pub const STALE_SCOPE_AFTER: Duration = Duration::from_secs(30 * 24 * 3600);

/// The order a size limit drops scopes in: a scope nothing was recorded in for
/// [`STALE_SCOPE_AFTER`] while the file kept receiving results elsewhere (an old driver, a
/// retired GPU kind) goes whole before any other entry, the scope that went quiet longest ago
/// first; then every other entry, oldest first. One rule for [`prune`] and [`plan_drops`].
struct Staleness {
    /// Each scope's newest result.
    newest: std::collections::HashMap<Fingerprint, u64>,
    /// The file's newest result.
    file_newest: u64,
}

impl Staleness {
    /// From each entry's scope and recording time.
    fn of(entries: impl Iterator<Item = (Fingerprint, u64)>) -> Self {
        let mut newest = std::collections::HashMap::new();
        for (scope, at) in entries {
            let n = newest.entry(scope).or_insert(0u64);
            *n = (*n).max(at);
        }
        let file_newest = newest.values().copied().max().unwrap_or(0);
        Staleness {
            newest,
            file_newest,
        }
    }

    /// A scope's place in the drop order: stale scopes first (the quietest first), then the
    /// rest, equal (their entries then go oldest first).
    fn rank(&self, scope: &Fingerprint) -> (u8, u64) {
        let stale_gap = u64::try_from(STALE_SCOPE_AFTER.as_millis()).unwrap_or(u64::MAX);
        let last = self.newest.get(scope).copied().unwrap_or(0);
        if last.saturating_add(stale_gap) < self.file_newest {
            (0, last)
        } else {
            (1, 0)
        }
    }
}

/// The time before which an entry is older than `max_age`, if there is an age limit.
fn oldest_kept(max_age: Option<Duration>) -> Option<u64> {
    max_age
        .map(|age| now_millis().saturating_sub(u64::try_from(age.as_millis()).unwrap_or(u64::MAX)))
}

/// `data` without the entries recorded before `max_age` ago, then without the entries of
/// stale scopes (see [`STALE_SCOPE_AFTER`]) and those recorded longest ago until its snapshot
/// encodes in at most `max_bytes`; returns what is
/// kept, how many went for age and for size, and the encoded size of what is kept.
pub(crate) fn prune(
    data: &CacheData,
    registry: &Migrations,
    max_age: Option<Duration>,
    max_bytes: Option<u64>,
) -> (CacheData, usize, usize, u64) {
    // Oldest first, ties broken by identity so the choice does not depend on map order.
    let mut all: Vec<(u64, Fingerprint, String, Fingerprint, Scope)> = data
        .entries()
        .map(|(s, ns, e)| {
            (
                e.recorded_at(),
                s.fingerprint(),
                ns.to_owned(),
                e.fingerprint(),
                s.clone(),
            )
        })
        .collect();
    let staleness = Staleness::of(all.iter().map(|(at, s, ..)| (*s, *at)));
    all.sort_by(|a, b| {
        let (ra, rb) = (staleness.rank(&a.1), staleness.rank(&b.1));
        (ra, a.0, a.1, &a.2, a.3).cmp(&(rb, b.0, b.1, &b.2, b.3))
    });
    let oldest_kept = oldest_kept(max_age);
    let mut kept = CacheData::new();
    let mut by_age = 0;
    let mut order = Vec::new();
    for (at, _, ns, fp, scope) in &all {
        if oldest_kept.is_some_and(|t| *at < t) {
            by_age += 1;
            continue;
        }
        order.push((scope.clone(), ns.clone(), *fp));
    }
    for (scope, ns, fp) in &order {
        if let Some(e) = data.get(scope, ns, fp) {
            kept.insert(scope, ns, e.clone());
        }
    }
    // Drop the oldest until the encoded snapshot fits: first by each entry's share of the
    // payload, then exactly.
    let mut bytes = encoded_len(registry, &kept);
    let mut by_size = 0;
    if let Some(max) = max_bytes
        && bytes > max
    {
        let per_entry = bytes as f64 / kept.len().max(1) as f64;
        let estimate = (((bytes - max) as f64 / per_entry).ceil() as usize).min(order.len());
        let mut dropped = estimate.saturating_sub(1);
        loop {
            let mut smaller = CacheData::new();
            for (scope, ns, fp) in &order[dropped..] {
                if let Some(e) = data.get(scope, ns, fp) {
                    smaller.insert(scope, ns, e.clone());
                }
            }
            bytes = encoded_len(registry, &smaller);
            kept = smaller;
            if bytes <= max || dropped >= order.len() {
                break;
            }
            dropped += 1 + (dropped / 64);
            dropped = dropped.min(order.len());
        }
        by_size = dropped;
    }
    (kept, by_age, by_size, bytes)
}

/// The size of the table `data` makes.
fn encoded_len(registry: &Migrations, data: &CacheData) -> u64 {
    cache_format::table::table_bytes(registry.app(), registry.current(), Some(0), data).len() as u64
}

/// What a size and age limit drop, decided from each entry's scope, time and size alone (for
/// a rewrite that streams the table): the same order as [`prune`] (stale scopes first, then
/// the oldest), by an estimate of each entry's share of the table (its bytes and its record
/// in a leaf) on top of `fixed` bytes. Returns the indices of `items` to drop, how many of
/// them went for age, and the estimated size of what is kept.
pub(crate) fn plan_drops(
    items: &[(Fingerprint, u64, u64)],
    fixed: u64,
    retention: &Retention,
) -> (std::collections::HashSet<usize>, usize, u64) {
    let staleness = Staleness::of(items.iter().map(|(s, at, _)| (*s, *at)));
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| (staleness.rank(&items[i].0), items[i].1, i));
    let oldest_kept = oldest_kept(retention.max_age);
    let mut drop = std::collections::HashSet::new();
    let mut total = fixed;
    for &i in &order {
        if oldest_kept.is_some_and(|t| items[i].1 < t) {
            drop.insert(i);
        } else {
            total += items[i].2 + 66;
        }
    }
    let by_age = drop.len();
    if let Some(max) = retention.max_bytes {
        for &i in &order {
            if total <= max {
                break;
            }
            if drop.insert(i) {
                total = total.saturating_sub(items[i].2 + 66);
            }
        }
    }
    (drop, by_age, total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cache_format::{Candidate, CandidateId, Entry, Fields, Key, Origin, Outcome, Stats, Value};

    fn entry(id: i64, at: u64) -> Entry {
        let mut c = Candidate::new(
            CandidateId::new("tiled", &[("tile", 8)]),
            Outcome::Measured(Stats {
                median_ns: 100.0,
                min_ns: 90.0,
                spread_ns: 2.0,
                samples: 9,
            }),
        );
        c.measured_at = at;
        let key = Key::new(Fields::from([("id".to_owned(), Value::Int(id))]));
        Entry::new(
            key,
            Fingerprint::default(),
            Origin::Imported("t".into()),
            at,
            [c],
        )
    }

    fn scope(driver: i64) -> Scope {
        Scope::new(Fields::from([("driver".to_owned(), Value::Int(driver))]))
    }

    #[test]
    fn a_size_limit_drops_a_stale_scope_before_older_entries_of_a_live_one() {
        const DAY: u64 = 24 * 3600 * 1000;
        let now = now_millis();
        let (old, live) = (scope(550), scope(560));
        let mut data = CacheData::new();
        // The old driver's scope went quiet 60 days ago, with 20 entries.
        for i in 0..20 {
            data.insert(&old, "mm", entry(i, now - 60 * DAY - i as u64));
        }
        // The live scope has one entry older than all of those, and 20 recent ones.
        data.insert(&live, "mm", entry(1000, now - 90 * DAY));
        for i in 0..20 {
            data.insert(&live, "mm", entry(2000 + i, now - i as u64 * 1000));
        }
        let registry = Migrations::new("gc", 1);
        let mut live_only = CacheData::new();
        for (s, ns, e) in data.entries().filter(|(s, ..)| **s == live) {
            live_only.insert(s, ns, e.clone());
        }
        let limit = encoded_len(&registry, &live_only);
        let (kept, by_age, by_size, bytes) = prune(&data, &registry, None, Some(limit));
        assert!(bytes <= limit);
        assert_eq!((by_age, by_size), (0, 20));
        assert_eq!(kept.len(), 21);
        assert!(
            kept.entries().all(|(s, ..)| *s == live),
            "the stale scope went whole"
        );

        // Without a gap of STALE_SCOPE_AFTER, age alone decides: the oldest live entry goes first.
        let mut fresh = CacheData::new();
        for i in 0..20 {
            fresh.insert(&old, "mm", entry(i, now - 60 * DAY - i as u64));
        }
        fresh.insert(&live, "mm", entry(1000, now - 90 * DAY));
        for i in 0..20 {
            fresh.insert(&live, "mm", entry(2000 + i, now - 59 * DAY - i as u64));
        }
        let (kept, _, by_size, _) = prune(&fresh, &registry, None, Some(limit));
        assert!(by_size >= 1);
        let oldest = Key::new(Fields::from([("id".to_owned(), Value::Int(1000))]));
        assert!(kept.get(&live, "mm", &oldest.fingerprint()).is_none());
    }
}
