//! Checking every byte a table uses: every node on every path (checksum, kind, height, keys
//! in order, each record's key the smallest of its subtree), every entry (checksum, decoded
//! with every check, filed under its own key), the directory's counts against the tree, and
//! the commit's count. What `tunecache verify` runs; a damaged node costs the entries under
//! it, a damaged entry only itself, and each is reported with where it is.

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use super::read::{Table, TableError};
use super::{ReadAt, TKey};
use crate::fingerprint::Fingerprint;
use crate::model::{Entry, Scope};

/// What [`check_table`] found.
#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    /// Entries that decoded.
    pub entries: u64,
    /// Everything wrong, one line each (without the file's name).
    pub problems: Vec<String>,
}

/// Walks the whole table `t` (as of its commit), checking everything (see the module docs),
/// and calls `visit` with each entry that decodes, in key order, until it returns `Break`.
pub fn check_table<R: ReadAt>(
    t: &Table<R>,
    mut visit: impl FnMut(&Scope, &str, Entry) -> ControlFlow<()>,
) -> CheckReport {
    let mut report = CheckReport::default();
    let dir = match t.directory() {
        Ok(d) => d,
        Err(e) => {
            report.problems.push(format!("the directory: {e}"));
            return report;
        }
    };
    let mut walk = Walk {
        t,
        dir: &dir,
        counts: BTreeMap::new(),
        last: None,
        report: &mut report,
        visit: &mut visit,
        stopped: false,
    };
    let mut cursor = t.cursor(&TKey([0; 48]));
    for item in cursor.by_ref() {
        match item {
            Ok((key, r)) => walk.entry(&key, &r),
            Err(lost) => walk.report.problems.push(lost.to_string()),
        }
        if walk.stopped {
            return report;
        }
    }
    walk.report
        .problems
        .extend(cursor.oddities().iter().cloned());
    let counts = std::mem::take(&mut walk.counts);
    let damaged = !report.problems.is_empty();
    for (scope_fp, s) in &dir.scopes {
        for (ns, listed) in &s.counts {
            let found = counts.get(&(*scope_fp, *ns)).copied().unwrap_or(0);
            let name = dir.names.get(ns).map_or("?", String::as_str);
            if damaged && found < *listed {
                report.problems.push(format!(
                    "{} of the {listed} entries of namespace {name:?} in scope {} could not be read",
                    listed - found,
                    s.scope
                ));
            } else if found != *listed && !damaged {
                report.problems.push(format!(
                    "the directory counts {listed} entries of namespace {name:?} in scope {}, the tree holds {found}",
                    s.scope
                ));
            }
        }
    }
    for ((scope_fp, ns), n) in &counts {
        if dir
            .scopes
            .get(scope_fp)
            .is_none_or(|s| !s.counts.contains_key(ns))
        {
            report.problems.push(format!(
                "{n} entries of a scope or namespace the directory does not list ({scope_fp}/{ns})"
            ));
        }
    }
    if !damaged && report.entries != t.commit().entries {
        report.problems.push(format!(
            "the commit counts {} entries, the tree holds {}",
            t.commit().entries,
            report.entries
        ));
    }
    report
}

struct Walk<'a, R, F> {
    t: &'a Table<R>,
    dir: &'a super::wire::Directory,
    counts: BTreeMap<(Fingerprint, Fingerprint), u64>,
    last: Option<TKey>,
    report: &'a mut CheckReport,
    visit: &'a mut F,
    stopped: bool,
}

impl<R: ReadAt, F: FnMut(&Scope, &str, Entry) -> ControlFlow<()>> Walk<'_, R, F> {
    fn entry(&mut self, key: &TKey, r: &super::BlockRef) {
        if self.last.is_some_and(|last| last >= *key) {
            self.report
                .problems
                .push(format!("the key {key:?} is out of order"));
        }
        self.last = Some(*key);
        let Some(name) = self.dir.names.get(&key.namespace()) else {
            self.report.problems.push(format!(
                "the entry {key:?}: its namespace is not in the directory"
            ));
            return;
        };
        let Some(scope) = self.dir.scopes.get(&key.scope()) else {
            self.report.problems.push(format!(
                "the entry {key:?}: its scope is not in the directory"
            ));
            return;
        };
        let decoded = self
            .t
            .entry_bytes(r)
            .and_then(|bytes| Ok(self.t.decode_entry(key, name, &bytes)?));
        match decoded {
            Ok(entry) => {
                self.report.entries += 1;
                *self
                    .counts
                    .entry((key.scope(), key.namespace()))
                    .or_default() += 1;
                if (self.visit)(&scope.scope, name, entry).is_break() {
                    self.stopped = true;
                }
            }
            Err(e) => self.report.problems.push(entry_problem(name, key, r, &e)),
        }
    }
}

/// How a damaged entry is named: its namespace, key and offset.
pub(crate) fn entry_problem(ns: &str, key: &TKey, r: &super::BlockRef, e: &TableError) -> String {
    format!(
        "the entry {} of namespace {ns:?} (scope {}) at offset {}: {e}",
        key.key(),
        key.scope(),
        r.offset
    )
}
