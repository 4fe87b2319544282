//! The save queue: which entries changed and wait for the saver, and how what a read found
//! comes into memory. Callers and the saver meet here, under the state lock, for moments.

use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use cache_format::{CacheData, Entry, Fingerprint, Scope};

use super::notice::Notice;
use super::{Mode, Shared, State, lock};
use crate::check::check_entry;
use crate::disk::{Disk, Failure, Incoming};
use crate::error::{Refusal, StoreError};
use crate::namespace::Namespace;
use crate::tier::Fill;

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
        for (ns, e) in &mine {
            if let Some(stored) = self.shared.memory.get(*ns, &e.fingerprint()) {
                self.shared.say_if_full(*ns, &stored, e);
            }
        }
        let keys: Vec<_> = mine.iter().map(|(ns, e)| (*ns, e.fingerprint())).collect();
        self.shared.lower.offer(&keys);
        self.shared.memory.merge_many(mine);
        lock(&self.shared.file.others).merge(others.clone());
        let mut st = lock(&self.shared.saving.state);
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
            .saving
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
            self.saving.cv.notify_all();
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

    /// What memory holds for every key this process recorded (to write again into a file
    /// that may lack them).
    pub(super) fn own_entries(&self) -> CacheData {
        let own: Vec<(Namespace, Fingerprint)> =
            lock(&self.saving.state).own.iter().copied().collect();
        let mut data = CacheData::new();
        for (ns, fp) in own {
            if let Some(entry) = self.memory.get(ns, &fp) {
                data.insert(&self.scope, ns.name(), Entry::clone(&entry));
            }
        }
        data
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
                            .is_some_and(|on_disk| on_disk.covers(e))
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
                    self.diag.notify(Notice::unusable_namespace(&ns));
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
            lock(&self.file.others).merge(others);
        }
        let requeue = persistent
            && (needs_rewrite || !salvaged.is_empty() || !lacking.is_empty() || rewrite_own);
        if requeue {
            let mut st = lock(&self.saving.state);
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
            self.diag.report(event);
        }
    }

    /// Sets timestamps from the future to the present: every entry that comes into memory
    /// passes here. Skew of up to a minute (machines sharing a file) passes silently; more is
    /// a wrong clock, and gets one warning.
    pub(super) fn clamp<'a>(&self, entries: impl Iterator<Item = &'a mut Entry>) {
        let now = cache_format::now_millis();
        let ahead = entries.map(|e| e.clamp_future(now)).max().unwrap_or(0);
        if ahead > WRONG_CLOCK_MS {
            self.diag.notify(Notice::clamped(ahead));
        }
    }
}

/// How far ahead of this machine's clock a timestamp may be before it is called a wrong clock.
const WRONG_CLOCK_MS: u64 = 60_000;

impl Shared {
    /// Says when merging `entry` into `stored` unites more candidates than one entry keeps
    /// (the merge then drops those measured longest ago).
    pub(super) fn say_if_full(&self, ns: Namespace, stored: &Entry, entry: &Entry) {
        let dropped = stored.dropped_by_merging(entry);
        if dropped > 0 {
            let max = cache_format::Limits::default().max_candidates as usize;
            self.diag
                .notify(Notice::entry_full(ns.name(), entry.key(), max + dropped));
        }
    }

    /// [`check_entry`] with this cache's limits.
    pub(super) fn admissible(&self, scope: &Scope, ns: &str, entry: &Entry) -> Result<(), Refusal> {
        check_entry(scope, ns, entry, &self.limits)
    }

    /// The first read of the file (see [`super::open::open_read`]); false if the file must not be used
    /// (the cache then stays in memory).
    pub(super) fn first_read(&self, disk: &mut Disk, mode: Mode) -> bool {
        match super::open::open_read(disk, mode == Mode::Persistent) {
            Ok(reads) => {
                for inc in reads {
                    self.absorb(inc, mode == Mode::Persistent);
                }
            }
            Err(Failure::Blocked(b)) => {
                self.diag.block(&b.path, &b.cause.to_string());
                return false;
            }
            Err(Failure::Retry(e)) => {
                self.diag.notify(Notice::first_read_failed(&e));
                let mut st = lock(&self.saving.state);
                st.rewrite = true;
                st.dirty_since.get_or_insert_with(Instant::now);
            }
        }
        true
    }

    /// A miss in memory: each lower tier in order, until one has the key; what a
    /// [`Fill::Keep`] tier returns is kept.
    #[cold]
    pub(super) fn miss(&self, ns: Namespace, fp: &Fingerprint) -> Option<Arc<Entry>> {
        match self.lower.find(ns, fp)? {
            (found, Fill::Serve) => Some(found),
            (found, Fill::Keep) => {
                self.absorb_from_tier(vec![(ns, unwrap_or_clone(found))]);
                self.memory.get(ns, fp)
            }
        }
    }

    /// Asks each lower tier once for the keys of `fps` that memory and the tiers before it
    /// lack; returns how many the tiers had.
    pub(super) fn prefetch(&self, ns: Namespace, fps: &[Fingerprint]) -> usize {
        let missing: Vec<Fingerprint> = fps
            .iter()
            .filter(|fp| self.memory.get(ns, fp).is_none())
            .copied()
            .collect();
        self.lower.find_many(ns, missing, |found| {
            self.absorb_from_tier(
                found
                    .into_iter()
                    .map(|e| (ns, unwrap_or_clone(e)))
                    .collect(),
            );
        })
    }

    /// Merges entries a tier returned into memory and, for a persistent cache, queues the
    /// keys whose entry changed for the file (not for the tiers: they came from there).
    /// Returns how many changed.
    pub(crate) fn absorb_from_tier(&self, mut entries: Vec<(Namespace, Entry)>) -> usize {
        if entries.is_empty() {
            return 0;
        }
        self.clamp(entries.iter_mut().map(|(_, e)| e));
        let changed: Vec<(Namespace, Fingerprint)> = entries
            .iter()
            .filter(|(ns, e)| {
                self.memory.get(*ns, &e.fingerprint()).is_none_or(|held| {
                    let mut merged = Entry::clone(&held);
                    merged.merge_from(e);
                    merged != *held
                })
            })
            .map(|(ns, e)| (*ns, e.fingerprint()))
            .collect();
        self.memory.merge_many(entries);
        if !changed.is_empty() && self.diag.lock().mode == Mode::Persistent {
            let mut st = lock(&self.saving.state);
            st.dirty.extend(changed.iter().copied());
            self.mark_dirty(&mut st);
        }
        changed.len()
    }
}

/// The entry, copied only if another reference to it is alive.
fn unwrap_or_clone(e: Arc<Entry>) -> Entry {
    Arc::try_unwrap(e).unwrap_or_else(|shared| Entry::clone(&shared))
}

impl crate::tier::Served for Shared {
    fn local(&self, ns: Namespace, fp: &Fingerprint) -> Option<Arc<Entry>> {
        Shared::local(self, ns, fp)
    }

    fn absorb_from_tier(&self, entries: Vec<(Namespace, Entry)>) -> usize {
        Shared::absorb_from_tier(self, entries)
    }
}
