//! The cache's file as lookups read it: the table and its journal's entries, published by the
//! saver after each read or write ([`FileView`]), and read by the calling thread a key at a
//! time (the nodes on the key's path and the entry, each checked against its checksum).
//! Memory keeps what was read; when the saver publishes a view in which keys changed, the
//! entries memory holds for them become partial, to be read again when used.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cache_format::table::{TKey, namespace_hash};
use cache_format::{CacheData, Entry, Fingerprint, Scope};

use super::notice::Notice;
use super::{Shared, lock};
use crate::disk::{self, Changed, View};
use crate::namespace::Namespace;

/// The cache's file as lookups see it: where it is, the view the saver published last and
/// its epoch, and the entries of other scopes a read brought or imports left to save.
pub(super) struct FileSide {
    pub(super) path: Option<PathBuf>,
    /// The file as lookups read it, published by the saver.
    view: arc_swap::ArcSwapOption<FileView>,
    /// The epoch of the latest publication of `view`.
    pub(super) epoch: AtomicU64,
    /// Entries of the other scopes (another GPU, an older driver) that a file read whole had
    /// (an older format) or that wait to be saved (imports): not for the hot path, but for
    /// warm starts after an upgrade. A table's are read from it when asked for.
    pub(super) others: Mutex<CacheData>,
}

impl FileSide {
    /// No view yet: a file at `path`, if any.
    pub(super) fn new(path: Option<PathBuf>) -> Self {
        FileSide {
            path,
            view: arc_swap::ArcSwapOption::empty(),
            epoch: AtomicU64::new(0),
            others: Mutex::new(CacheData::new()),
        }
    }
}

/// What lookups read, as of one publication.
#[derive(Debug)]
pub(crate) struct FileView {
    /// Bumped with every publication: a read made under an older view fills memory with a
    /// partial entry, never a complete one.
    pub(crate) epoch: u64,
    pub(crate) view: View,
}

impl FileView {
    /// Whether a key memory knows nothing of may be in the file.
    fn has_more(&self) -> bool {
        self.view.table.is_some() || !self.view.journal.is_empty()
    }
}

impl Shared {
    /// Makes `view` what lookups read, then brings memory in line with what changed. Returns
    /// whether the file may lack what this process recorded (a file replaced by one that is
    /// not a faithful rewrite): the caller then writes those results again.
    pub(super) fn publish(&self, view: View) -> bool {
        let changed = view.changed.clone();
        self.memory.set_backed(view.table.is_some());
        {
            // Holding the file slot while the epoch moves, so a fill never sees the new epoch
            // with the old view.
            let epoch = self.file.epoch.fetch_add(1, Ordering::AcqRel) + 1;
            self.file
                .view
                .store(Some(Arc::new(FileView { epoch, view })));
        }
        match changed {
            Changed::Keys(keys) if keys.is_empty() => false,
            Changed::Keys(keys) => {
                // The keys of this scope that changed, by fingerprint: an entry of another
                // namespace with the same fingerprint is read again too, which costs a read.
                let fps: HashSet<Fingerprint> = disk::scope_keys(&keys, &self.scope)
                    .into_iter()
                    .map(|(_, fp)| fp)
                    .collect();
                if !fps.is_empty() {
                    self.memory.forget_file(Some(&fps));
                }
                false
            }
            Changed::All { faithful } => {
                self.memory.forget_file(None);
                !faithful
            }
        }
    }

    /// The view lookups read now, if the file may hold more than memory does.
    fn view(&self) -> Option<Arc<FileView>> {
        self.file.view.load_full().filter(|v| v.has_more())
    }

    /// Whether a lookup of a key memory knows nothing of must read the file.
    pub(super) fn file_has_more(&self) -> bool {
        self.file.view.load().as_ref().is_some_and(|v| v.has_more())
    }

    /// The entry for `fp` in `ns` read from the file and joined with what memory holds (which
    /// keeps the result): a few `pread`s, the first time a key is used. `None`: neither has it.
    pub(super) fn read_file(&self, ns: Namespace, fp: &Fingerprint) -> Option<Arc<Entry>> {
        let Some(view) = self.view() else {
            return self.memory.get(ns, fp);
        };
        let (found, damage) = disk::lookup(&view.view, &self.scope, ns.name(), fp);
        if let Some((key, e)) = damage
            && let Some(path) = &self.file.path
        {
            self.diag
                .notify(Notice::damaged_entry(path, ns.name(), &key, &e.to_string()));
        }
        let mut found = found;
        if let Some(e) = &mut found {
            self.clamp(std::iter::once(e));
        }
        self.memory
            .fill(ns, fp, found, view.epoch, &self.file.epoch)
    }

    /// The entry for `fp` in `ns` in memory or the file (not the lower tiers).
    pub(crate) fn local(&self, ns: Namespace, fp: &Fingerprint) -> Option<Arc<Entry>> {
        match self.memory.resident(ns, fp) {
            crate::memory::Resident::Complete(e) => Some(e),
            crate::memory::Resident::Absent => None,
            _ => self.read_file(ns, fp),
        }
    }

    /// Every entry of this scope (of namespace `only`, if given): the table's, walked in order
    /// and decoded without being kept (one read of each), joined with the journal's and with
    /// what memory holds; sorted by namespace and fingerprint.
    pub(super) fn all_entries(&self, only: Option<Namespace>) -> Vec<(Namespace, Arc<Entry>)> {
        let held: HashMap<(Namespace, Fingerprint), (Arc<Entry>, bool)> = self
            .memory
            .held()
            .into_iter()
            .filter(|(ns, ..)| only.is_none_or(|o| o == *ns))
            .map(|(ns, e, complete)| ((ns, e.fingerprint()), (e, complete)))
            .collect();
        let mut out: Vec<(Namespace, Arc<Entry>)> = Vec::new();
        let mut seen: HashSet<(Namespace, Fingerprint)> = HashSet::new();
        if let Some(view) = self.view() {
            if let Some(table) = &view.view.table {
                self.walk_table(table, &view.view, only, &held, &mut out, &mut seen);
            }
            let journal = &view.view.journal;
            let own = journal
                .parts()
                .into_iter()
                .filter_map(|part| part.scopes().find(|(s, _)| **s == self.scope));
            for (_, data) in own {
                for (name, entries) in data.namespaces() {
                    let Ok(ns) = Namespace::new(name) else {
                        continue;
                    };
                    if only.is_some_and(|o| o != ns) {
                        continue;
                    }
                    for fp in entries.keys() {
                        if !seen.insert((ns, *fp)) {
                            continue;
                        }
                        // Both parts' entry merged, the first time the key is met.
                        let Some(e) = journal.get(&self.scope, name, fp) else {
                            continue;
                        };
                        let mut e = e.into_owned();
                        if let Some((held, _)) = held.get(&(ns, *fp)) {
                            e.merge_from(held);
                        }
                        out.push((ns, Arc::new(e)));
                    }
                }
            }
        }
        for ((ns, fp), (e, _)) in held {
            if !seen.contains(&(ns, fp)) {
                out.push((ns, e));
            }
        }
        out.sort_by(|a, b| (a.0.name(), a.1.fingerprint()).cmp(&(b.0.name(), b.1.fingerprint())));
        out
    }

    fn walk_table(
        &self,
        table: &crate::tablefile::TableFile,
        view: &View,
        only: Option<Namespace>,
        held: &HashMap<(Namespace, Fingerprint), (Arc<Entry>, bool)>,
        out: &mut Vec<(Namespace, Arc<Entry>)>,
        seen: &mut HashSet<(Namespace, Fingerprint)>,
    ) {
        let scope_fp = self.scope.fingerprint();
        let hash = only.map(|ns| namespace_hash(ns.name()));
        let start = match &hash {
            Some(h) => TKey::namespace_start(&scope_fp, h),
            None => TKey::scope_start(&scope_fp),
        };
        let dir = match table.directory() {
            Ok(d) => d,
            Err(e) => return self.damaged(&TKey::scope_start(&scope_fp), "", &e.to_string()),
        };
        let mut names: HashMap<Fingerprint, Option<Namespace>> = HashMap::new();
        for item in table.cursor(&start) {
            // A lost part of the tree is said once; the walk goes on after it.
            let (key, r) = match item {
                Ok(item) => item,
                Err(lost) => {
                    self.damaged(&lost.from.unwrap_or(start), "", &lost.to_string());
                    continue;
                }
            };
            if key.scope() != scope_fp || hash.is_some_and(|h| key.namespace() != h) {
                break;
            }
            let ns = *names.entry(key.namespace()).or_insert_with(|| {
                dir.names
                    .get(&key.namespace())
                    .and_then(|n| Namespace::new(n).ok())
            });
            let Some(ns) = ns else {
                continue;
            };
            let fp = key.key();
            seen.insert((ns, fp));
            if let Some((e, true)) = held.get(&(ns, fp)) {
                out.push((ns, Arc::clone(e)));
                continue;
            }
            let read = table
                .entry_bytes(&r)
                .map_err(|e| e.to_string())
                .and_then(|b| {
                    table
                        .decode_entry(&key, ns.name(), &b)
                        .map_err(|e| e.to_string())
                });
            let mut entry = match read {
                Ok(e) => e,
                Err(why) => {
                    self.damaged(&key, ns.name(), &why);
                    continue;
                }
            };
            if let Some(j) = view.journal.get(&self.scope, ns.name(), &fp) {
                entry.merge_from(&j);
            }
            if let Some((e, _)) = held.get(&(ns, fp)) {
                entry.merge_from(e);
            }
            self.clamp(std::iter::once(&mut entry));
            out.push((ns, Arc::new(entry)));
        }
    }

    fn damaged(&self, key: &TKey, ns: &str, why: &str) {
        if let Some(path) = &self.file.path {
            self.diag.notify(Notice::damaged_entry(path, ns, key, why));
        }
    }

    /// How many entries this scope has: the table's count, and the keys memory and the
    /// journal hold that the table lacks.
    pub(super) fn count(&self) -> usize {
        let Some(view) = self.view() else {
            return self.memory.len();
        };
        let Some(table) = &view.view.table else {
            return self.all_entries(None).len();
        };
        let scope_fp = self.scope.fingerprint();
        let in_table = table
            .directory()
            .map_or(0, |d| d.entries_of(&scope_fp) as usize);
        let mut extra: HashSet<TKey> = HashSet::new();
        for (ns, e, _) in self.memory.held() {
            extra.insert(TKey::of(&self.scope, ns.name(), &e.fingerprint()));
        }
        let own = view
            .view
            .journal
            .parts()
            .into_iter()
            .filter_map(|part| part.scopes().find(|(s, _)| **s == self.scope));
        for data in own {
            for (ns, entries) in data.1.namespaces() {
                for fp in entries.keys() {
                    extra.insert(TKey::of(&self.scope, ns, fp));
                }
            }
        }
        let new = extra
            .iter()
            .filter(|k| matches!(table.locate(k), Ok(None)))
            .count();
        in_table + new
    }

    /// The entries recorded for `fp` in `ns` under scopes other than this cache's: the
    /// table's (one lookup per scope it holds), the journal's, and those waiting in memory.
    pub(super) fn other_scopes(&self, ns: Namespace, fp: &Fingerprint) -> Vec<(Scope, Entry)> {
        let mut out: Vec<(Scope, Entry)> = Vec::new();
        let add = |out: &mut Vec<(Scope, Entry)>, scope: &Scope, e: Entry| match out
            .iter_mut()
            .find(|(s, _)| s == scope)
        {
            Some((_, held)) => held.merge(e),
            None => out.push((scope.clone(), e)),
        };
        if let Some(view) = self.view() {
            if let Some(table) = &view.view.table
                && let Ok(dir) = table.directory()
            {
                for (scope_fp, s) in &dir.scopes {
                    if *scope_fp == self.scope.fingerprint() {
                        continue;
                    }
                    let key = TKey::new(scope_fp, &namespace_hash(ns.name()), fp);
                    match table.get(&key) {
                        Ok(Some(bytes)) => match table.decode_entry(&key, ns.name(), &bytes) {
                            Ok(e) => add(&mut out, &s.scope, e),
                            Err(e) => self.damaged(&key, ns.name(), &e.to_string()),
                        },
                        Ok(None) => {}
                        Err(e) => self.damaged(&key, ns.name(), &e.to_string()),
                    }
                }
            }
            // An entry in both parts of the journal is met twice: `add` merges the two.
            for (scope, data) in view
                .view
                .journal
                .parts()
                .into_iter()
                .flat_map(|p| p.scopes())
            {
                if *scope == self.scope {
                    continue;
                }
                if let Some(e) = data.namespace(ns.name()).and_then(|n| n.get(fp)) {
                    add(&mut out, scope, e.clone());
                }
            }
        }
        let others = lock(&self.file.others);
        for (scope, data) in others.scopes() {
            if let Some(e) = data.namespace(ns.name()).and_then(|n| n.get(fp)) {
                add(&mut out, scope, e.clone());
            }
        }
        out
    }
}
