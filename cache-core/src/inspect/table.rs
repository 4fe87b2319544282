//! [`super::Inspection`] of a table (format 4): walked in key order a block at a time, each
//! entry decoded once, the journal's records merged in; counted from the table's directory;
//! a key looked up in each scope the table holds; checked whole by `check_table`.

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use cache_format::table::{TKey, check_table};
use cache_format::{Entry, Fingerprint, Scope};

use super::Inspection;
use crate::tablefile::TableFile;

impl Inspection {
    /// Every entry of the table with the journal's records merged, in key order (the one
    /// walk, [`Inspection::in_key_order`]); what could not be read, one line each, and the
    /// number of keys the table files.
    pub(super) fn walk_table(
        &self,
        visit: &mut dyn FnMut(&Scope, &str, &Entry) -> ControlFlow<()>,
    ) -> (Vec<String>, u64) {
        let mut walk = self.in_key_order();
        for (_, scope, ns, entry) in walk.by_ref() {
            if visit(&scope, &ns, &entry).is_break() {
                break;
            }
        }
        (walk.problems().to_vec(), walk.stored())
    }

    /// Entries per scope and namespace: the table's directory, and the journal's keys the
    /// table lacks.
    pub(super) fn counts_table(
        &self,
        t: &TableFile,
    ) -> (BTreeMap<Scope, BTreeMap<String, usize>>, Option<String>) {
        let mut counts: BTreeMap<Scope, BTreeMap<String, usize>> = BTreeMap::new();
        let dir = match t.directory() {
            Ok(d) => d,
            Err(e) => {
                return (
                    counts,
                    Some(format!("{}: the directory: {e}", self.path.display())),
                );
            }
        };
        for s in dir.scopes.values() {
            let by_ns = counts.entry(s.scope.clone()).or_default();
            for (h, n) in &s.counts {
                let name = dir.names.get(h).cloned().unwrap_or_else(|| h.to_hex());
                // A count is taken as stored (FORMAT.md, "Directory"), and a lie can be as
                // large as 2^64 - 1: the sums saturate rather than overflow.
                let at = by_ns.entry(name).or_default();
                *at = at.saturating_add(usize::try_from(*n).unwrap_or(usize::MAX));
            }
        }
        for (scope, ns, entry) in self.journal_data.entries() {
            let key = TKey::of(scope, ns, &entry.fingerprint());
            if matches!(t.locate(&key), Ok(None)) {
                let at = counts
                    .entry(scope.clone())
                    .or_default()
                    .entry(ns.to_owned())
                    .or_default();
                *at = at.saturating_add(1);
            }
        }
        (counts, None)
    }

    /// The entries for key `fp` of `ns`, one per scope: a lookup in each scope the table
    /// holds, the journal's merged in.
    /// Whether the table (or the journal) files an entry for `fp` of `ns` in the scope
    /// whose fingerprint is `scope`: the index walked, the entry neither read nor decoded. An
    /// index that cannot be read answers no (the entry is as good as missing).
    pub(super) fn holds_table(
        &self,
        t: &TableFile,
        scope: &Fingerprint,
        ns: &str,
        fp: &Fingerprint,
    ) -> bool {
        let in_table = t.directory().ok().is_some_and(|dir| {
            dir.scopes
                .get(scope)
                .is_some_and(|s| matches!(t.locate(&TKey::of(&s.scope, ns, fp)), Ok(Some(_))))
        });
        in_table || holds_data(&self.journal_data, scope, ns, fp)
    }

    pub(super) fn find_table(
        &self,
        t: &TableFile,
        ns: &str,
        fp: &Fingerprint,
        problems: &mut Vec<String>,
    ) -> Vec<(Scope, Entry)> {
        let mut found: Vec<(Scope, Entry)> = Vec::new();
        let unreadable = |e: &dyn std::fmt::Display| {
            format!(
                "{}: the entry {} of namespace {ns:?} cannot be read: {e}",
                self.path.display(),
                fp.to_hex()
            )
        };
        match t.directory() {
            Ok(dir) => {
                for s in dir.scopes.values() {
                    let key = TKey::of(&s.scope, ns, fp);
                    match t.get(&key) {
                        Ok(Some(bytes)) => match t.decode_entry(&key, ns, &bytes) {
                            Ok(e) => found.push((s.scope.clone(), e)),
                            Err(e) => problems.push(unreadable(&e)),
                        },
                        Ok(None) => {}
                        Err(e) => problems.push(unreadable(&e)),
                    }
                }
            }
            Err(e) => problems.push(format!("{}: {e}", self.path.display())),
        }
        for (scope, data) in self.journal_data.scopes() {
            if let Some(j) = data.namespace(ns).and_then(|n| n.get(fp)) {
                match found.iter_mut().find(|(s, _)| s == scope) {
                    Some((_, e)) => e.merge(j.clone()),
                    None => found.push((scope.clone(), j.clone())),
                }
            }
        }
        found
    }

    /// Every byte the table uses checked (`check_table`), and the journal's new keys counted.
    pub(super) fn check_table(&self, t: &TableFile) -> (usize, Vec<String>) {
        let report = check_table(t, |_, _, _| ControlFlow::Continue(()));
        let mut problems: Vec<String> = report
            .problems
            .iter()
            .map(|p| format!("{}: {p}", self.path.display()))
            .collect();
        let mut entries = usize::try_from(report.entries).unwrap_or(usize::MAX);
        for (scope, ns, entry) in self.journal_data.entries() {
            let key = TKey::of(scope, ns, &entry.fingerprint());
            match t.locate(&key) {
                Ok(None) => entries += 1,
                Ok(Some(_)) => {}
                Err(e) => problems.push(format!("{}: {e}", self.path.display())),
            }
        }
        (entries, problems)
    }
}

/// Whether `data` holds an entry for `fp` of `ns` in the scope whose fingerprint is `scope`.
pub(super) fn holds_data(
    data: &cache_format::CacheData,
    scope: &Fingerprint,
    ns: &str,
    fp: &Fingerprint,
) -> bool {
    data.scopes().any(|(s, d)| {
        s.fingerprint() == *scope && d.namespace(ns).is_some_and(|n| n.get(fp).is_some())
    })
}
