//! The save queue: which entries changed and wait for the saver, and how what a read found
//! comes into memory. Callers and the saver meet here, under the state lock, for moments.

use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use cache_format::{CacheData, Entry, Fingerprint, Scope};

use super::notice::Notice;
use super::{Shared, State, lock};
use crate::disk::Incoming;
use crate::error::{Refusal, StoreError};
use crate::namespace::Namespace;

/// What [`Cache::import`](super::Cache::import) took and left out.
#[derive(Debug, Default)]
pub struct Imported {
    /// Entries taken.
    pub taken: usize,
    /// Why the others were left out: `StoreError::InvalidNamespace` once per namespace,
    /// `StoreError::Refused` once per entry.
    pub refused: Vec<StoreError>,
}

impl super::Cache {
    /// Queues entries of any scope for saving (e.g. an import); entries of the current scope
    /// are also merged into memory. An entry in a namespace whose name is not valid
    /// ([`Namespace::new`]), or that no reader would accept ([`check_entry`]), is left out and
    /// said in the result, one error per namespace or entry; the others are taken. A caller
    /// that wants all or nothing checks first ([`crate::ImportLines`] does).
    pub fn import(&self, data: CacheData) -> Imported {
        let mut imported = Imported::default();
        let mut mine = Vec::new();
        let mut others = CacheData::new();
        for (scope, data) in data.into_scopes() {
            for (ns_name, entries) in data.into_namespaces() {
                let ns = match Namespace::new(&ns_name) {
                    Ok(ns) => ns,
                    Err(e) => {
                        imported.refused.push(e);
                        continue;
                    }
                };
                for entry in entries.into_values() {
                    if let Err(reason) = self.shared.admissible(&scope, &ns_name, &entry) {
                        imported.refused.push(StoreError::Refused {
                            namespace: ns_name.clone(),
                            reason,
                        });
                        continue;
                    }
                    imported.taken += 1;
                    if scope == self.shared.scope {
                        mine.push((ns, entry));
                    } else {
                        others.insert(&scope, &ns_name, entry);
                    }
                }
            }
        }
        self.shared.clamp(mine.iter_mut().map(|(_, e)| e));
        let keys: Vec<_> = mine.iter().map(|(ns, e)| (*ns, e.fingerprint())).collect();
        self.shared.offer(&keys);
        self.shared.memory.merge_many(mine);
        lock(&self.shared.others).merge(others.clone());
        let mut st = lock(&self.shared.state);
        st.own.extend(keys.iter().copied());
        st.dirty.extend(keys);
        st.other.merge(others);
        self.shared.mark_dirty(&mut st);
        imported
    }
}

impl Shared {
    /// Waits for the saver to signal, until `deadline` at most; `FlushTimeout(timeout)` once
    /// the deadline has passed.
    pub(super) fn wait_until<'a>(
        &self,
        st: MutexGuard<'a, State>,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<MutexGuard<'a, State>, StoreError> {
        let now = Instant::now();
        if now >= deadline {
            return Err(StoreError::FlushTimeout(timeout));
        }
        Ok(self
            .cv
            .wait_timeout(st, deadline - now)
            .unwrap_or_else(|p| p.into_inner())
            .0)
    }

    /// Counts a change; wakes the saver only when the cache goes from clean to dirty (it
    /// then sleeps until the save is due, so later changes need no wake-up).
    pub(super) fn mark_dirty(&self, st: &mut State) {
        st.put_seq += 1;
        if st.dirty_since.is_none() {
            st.dirty_since = Some(Instant::now());
            self.cv.notify_all();
        }
    }

    /// The entries to write for the queued keys (read from memory now), plus other scopes.
    pub(super) fn take_batch(&self, st: &mut State) -> CacheData {
        let mut batch = std::mem::take(&mut st.other);
        for (ns, fp) in st.dirty.drain() {
            if let Some(entry) = self.memory.get(ns, &fp) {
                batch.insert(&self.scope, ns.name(), Entry::clone(&entry));
            }
        }
        batch
    }

    /// Puts a batch that could not be written back in the queue.
    pub(super) fn requeue(&self, st: &mut State, batch: CacheData) {
        for (scope, data) in batch.into_scopes() {
            for (ns_name, entries) in data.into_namespaces() {
                match (scope == self.scope)
                    .then(|| Namespace::new(&ns_name).ok())
                    .flatten()
                {
                    Some(ns) => st.dirty.extend(entries.keys().map(|fp| (ns, *fp))),
                    None => {
                        for entry in entries.into_values() {
                            st.other.insert(&scope, &ns_name, entry);
                        }
                    }
                }
            }
        }
    }

    /// Takes what a read found into memory, and reports its events once each.
    pub(super) fn absorb(&self, inc: Incoming, persistent: bool) {
        let mirrors = inc.mirrors();
        let Incoming {
            data,
            salvaged,
            events,
            needs_rewrite,
            whole,
            replaced,
            view,
        } = inc;
        // What lookups read changes first, then memory follows what changed in it. A file
        // replaced by one that may lack this process's results gets them again.
        let mut rewrite_own = replaced;
        if let Some(view) = view {
            rewrite_own |= self.publish(view);
        }
        // A file read whole that lacks what this process acknowledged (an old copy restored,
        // another tool's rename): those entries are written again. A compaction by another
        // process holds them already, so it costs nothing.
        let lacking: Vec<(Namespace, Fingerprint)> =
            if whole && mirrors && persistent && !self.memory.is_empty() {
                self.memory
                    .snapshot()
                    .into_iter()
                    .filter(|(ns, e)| {
                        let fp = e.fingerprint();
                        !data
                            .get(&self.scope, ns.name(), &fp)
                            .is_some_and(|on_disk| covers(on_disk, e))
                    })
                    .map(|(ns, e)| (ns, e.fingerprint()))
                    .collect()
            } else {
                Vec::new()
            };
        let mut mine = Vec::new();
        let mut others = CacheData::new();
        for (scope, scope_data) in data.into_scopes().chain(salvaged.clone().into_scopes()) {
            if scope != self.scope {
                if mirrors {
                    for (ns, entries) in scope_data.into_namespaces() {
                        for entry in entries.into_values() {
                            others.insert(&scope, &ns, entry);
                        }
                    }
                }
                continue;
            }
            for (ns, entries) in scope_data.into_namespaces() {
                let Ok(ns) = Namespace::new(&ns) else {
                    self.notify(Notice::unusable_namespace(&ns));
                    continue;
                };
                mine.extend(entries.into_values().map(|e| (ns, e)));
            }
        }
        self.clamp(mine.iter_mut().map(|(_, e)| e));
        if mirrors {
            // Memory mirrors a file read whole (an older format): everything comes in.
            self.memory.merge_many(mine);
        } else {
            // A table's journal: what memory holds is brought up to date; the rest is read
            // from the file when used.
            self.memory.merge_held(mine);
        }
        if !others.is_empty() {
            lock(&self.others).merge(others);
        }
        let requeue = persistent
            && (needs_rewrite || !salvaged.is_empty() || !lacking.is_empty() || rewrite_own);
        if requeue {
            let mut st = lock(&self.state);
            st.rewrite |= needs_rewrite;
            self.requeue(&mut st, salvaged);
            st.dirty.extend(lacking);
            if rewrite_own {
                let own: Vec<_> = st.own.iter().copied().collect();
                st.dirty.extend(own);
            }
            self.mark_dirty(&mut st);
        }
        for event in events {
            self.report(event);
        }
    }

    /// Sets timestamps from the future to the present: every entry that comes into memory
    /// passes here. Skew of up to a minute (machines sharing a file) passes silently; more is
    /// a wrong clock, and gets one warning.
    pub(super) fn clamp<'a>(&self, entries: impl Iterator<Item = &'a mut Entry>) {
        let now = cache_format::now_millis();
        let ahead = entries.map(|e| e.clamp_future(now)).max().unwrap_or(0);
        if ahead > WRONG_CLOCK_MS {
            self.notify(Notice::clamped(ahead));
        }
    }
}

/// How far ahead of this machine's clock a timestamp may be before it is called a wrong clock.
const WRONG_CLOCK_MS: u64 = 60_000;

/// Whether `on_disk` already holds everything of `mine`: merging `mine` into it changes
/// nothing.
fn covers(on_disk: &Entry, mine: &Entry) -> bool {
    let mut merged = on_disk.clone();
    merged.merge(mine.clone());
    merged == *on_disk
}

impl Shared {
    /// [`check_entry`] with this cache's limits.
    pub(super) fn admissible(&self, scope: &Scope, ns: &str, entry: &Entry) -> Result<(), Refusal> {
        check_entry(scope, ns, entry, &self.limits)
    }
}

/// Whether every reader would accept `entry` (in `scope` and namespace `ns`): finite
/// statistics, and its encoding within the bounds and caps of `limits`. A `Cache` refuses what
/// is not where it enters (`put`, `import`), with a warning, so it never holds back the good
/// entries saved with it; a tool that imports all or nothing checks first with this.
pub fn check_entry(
    scope: &Scope,
    ns: &str,
    entry: &Entry,
    limits: &cache_format::Limits,
) -> Result<(), Refusal> {
    let key = cache_format::table::TKey::of(scope, ns, &entry.fingerprint());
    let bytes = cache_format::table::encode_entry(entry);
    check_encoded(scope, ns, entry, &key, &bytes, limits)
}

/// What [`check_entry`] checks on the model: nesting (named by field) and statistics.
fn check_model(scope: &Scope, entry: &Entry, limits: &cache_format::Limits) -> Result<(), Refusal> {
    // Nesting first, so the error names the field (the encoded check below only has an offset).
    let too_deep = |what: &str, fields: &cache_format::Fields, max: u32| {
        fields.iter().find_map(|(name, v)| {
            let depth = v.depth();
            (depth > max).then(|| Refusal::TooDeep {
                what: what.to_owned(),
                name: name.clone(),
                depth,
                max,
            })
        })
    };
    let nesting = too_deep(
        "scope field",
        scope.fields(),
        limits.max_scope_field_depth(),
    )
    .or_else(|| {
        too_deep(
            "key field",
            entry.key().fields(),
            limits.max_key_field_depth(),
        )
    })
    .or_else(|| {
        entry.candidates().iter().find_map(|c| {
            let what = format!("{} param", c.id.algorithm);
            too_deep(&what, &c.id.params, limits.max_param_depth())
        })
    });
    if let Some(why) = nesting {
        return Err(why);
    }
    for c in entry.candidates() {
        if let Some(s) = c.stats()
            && !(s.median_ns.is_finite() && s.min_ns.is_finite() && s.spread_ns.is_finite())
        {
            return Err(Refusal::NonFinite {
                candidate: c.id.to_string(),
            });
        }
        if let Some(s) = c.stats()
            && (s.median_ns < 0.0 || s.min_ns < 0.0 || s.spread_ns < 0.0)
        {
            return Err(Refusal::Negative {
                candidate: c.id.to_string(),
            });
        }
    }
    Ok(())
}

/// [`check_entry`] of an entry already encoded as a table stores it (`bytes`, under `key`),
/// for writers that write those bytes next: the checks that do not need the bytes, then the
/// entry as a table's reader checks it (the quick check first; the decoder, for its message,
/// only when that declines).
pub(crate) fn check_encoded(
    scope: &Scope,
    ns: &str,
    entry: &Entry,
    key: &cache_format::table::TKey,
    bytes: &[u8],
    limits: &cache_format::Limits,
) -> Result<(), Refusal> {
    check_model(scope, entry, limits)?;
    cache_format::table::check_entry(key, ns, bytes, limits).map_err(Refusal::Unreadable)?;
    // The scope and namespace as a journal record or a table's directory holds them: checked
    // in a payload with this entry, once per thread for each scope, namespace and bounds.
    thread_local! {
        static CHECKED: std::cell::RefCell<Vec<(Fingerprint, String, cache_format::Limits)>> =
            const { std::cell::RefCell::new(Vec::new()) };
    }
    let fp = scope.fingerprint();
    let known =
        CHECKED.with_borrow(|c| c.iter().any(|(s, n, l)| *s == fp && n == ns && l == limits));
    if !known {
        let mut one = CacheData::new();
        one.insert(scope, ns, entry.clone());
        cache_format::check_payload(&cache_format::encode_payload(&one), limits)
            .map_err(Refusal::Unreadable)?;
        CHECKED.with_borrow_mut(|c| {
            if c.len() >= 64 {
                c.remove(0);
            }
            c.push((fp, ns.to_owned(), *limits));
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cache_format::{Candidate, Fields, Key, Limits, Origin, Stats, Value};

    fn entry(fields: usize, candidates: usize, depth: usize) -> Entry {
        let mut nested = Value::Int(1);
        for _ in 0..depth {
            nested = Value::List(vec![nested]);
        }
        let key = Key::new(
            (0..fields)
                .map(|i| (format!("f{i}"), Value::Int(i as i64)))
                .chain([("deep".to_owned(), nested)])
                .collect::<Fields>(),
        );
        let stats = Stats {
            median_ns: 10.0,
            min_ns: 9.0,
            spread_ns: 1.0,
            samples: 3,
        };
        Entry::new(
            key,
            Fingerprint::default(),
            Origin::Imported("t".into()),
            5,
            (0..candidates).map(|i| Candidate::measured(format!("a{i}"), Fields::new(), stats)),
        )
    }

    /// The quick check says what the whole-payload check says, on entries at and past every
    /// bound it looks at (fields, candidates, nesting), under tight and default limits.
    #[test]
    fn check_entry_agrees_with_the_payload_check() {
        let scope = Scope::default();
        let tight = Limits {
            max_fields: 8,
            max_candidates: 4,
            max_depth: 14,
            ..Limits::default()
        };
        for limits in [tight, Limits::default()] {
            for fields in [0, 6, 7, 8, 9, 300] {
                for candidates in [0, 1, 4, 5] {
                    for depth in [0, 3, 6, 7, 30] {
                        let e = entry(fields, candidates, depth);
                        let mut one = CacheData::new();
                        one.insert(&scope, "mm", e.clone());
                        let whole = cache_format::check_payload(
                            &cache_format::encode_payload(&one),
                            &limits,
                        );
                        let quick = check_entry(&scope, "mm", &e, &limits);
                        assert_eq!(
                            quick.is_ok(),
                            whole.is_ok(),
                            "fields {fields}, candidates {candidates}, depth {depth}, \
                             {limits:?}: {quick:?} against {whole:?}"
                        );
                    }
                }
            }
        }
    }
}
