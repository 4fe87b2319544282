//! What a cache tells its user: every warning text in one place, each logged at most once per
//! cache and condition, and never while an in-memory lock is held.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use cache_migrate::Report;

use super::{Mode, lock};
use crate::disk::Event;
use crate::error::StoreError;

/// A message to log, with the condition that de-duplicates it (`None`: log every time).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Notice {
    /// The condition: one message per cache and condition.
    key: Option<String>,
    level: Level,
    text: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Warn,
    Info,
    Debug,
}

impl Notice {
    fn warn(key: impl Into<String>, text: String) -> Self {
        Notice {
            key: Some(key.into()),
            level: Level::Warn,
            text,
        }
    }

    fn info(text: String) -> Self {
        Notice {
            key: None,
            level: Level::Info,
            text,
        }
    }

    fn debug(text: String) -> Self {
        Notice {
            key: None,
            level: Level::Debug,
            text,
        }
    }

    /// A configuration warning (from resolving the location).
    pub(super) fn config(text: String) -> Self {
        Notice::warn(text.clone(), text)
    }

    pub(super) fn memory_only(reason: &str) -> Self {
        Notice::warn(
            "memory",
            format!("tunecache keeps results in memory only: {reason}"),
        )
    }

    pub(super) fn unwritable(path: &Path, reason: &str) -> Self {
        Notice::warn(
            "unwritable",
            format!(
                "tunecache cannot write its cache at {}: {reason}; results are kept in memory only",
                path.display()
            ),
        )
    }

    pub(super) fn first_read_failed(e: &StoreError) -> Self {
        Notice::warn(
            format!("read:{e}"),
            format!("tunecache could not read its cache yet: {e}; the saver will retry"),
        )
    }

    pub(super) fn no_saver(e: &std::io::Error) -> Self {
        Notice::warn(
            "spawn",
            format!(
                "tunecache could not start its saver thread: {e}; results are kept in memory only"
            ),
        )
    }

    pub(super) fn unsaved_at_close(pending: usize, waited: std::time::Duration) -> Self {
        let what = match pending {
            0 => "the pending rewrite of the cache file was".to_owned(),
            1 => "1 result was".to_owned(),
            n => format!("{n} results were"),
        };
        Notice::warn(
            "unsaved",
            format!(
                "tunecache: {what} not saved within {waited:?}; the saver keeps trying while this process runs"
            ),
        )
    }

    pub(super) fn unsaved_at_exit(unsaved: usize) -> Self {
        Notice::warn(
            "unsaved-at-exit",
            format!(
                "tunecache: {} could not be saved before shutdown",
                results(unsaved)
            ),
        )
    }

    /// A save failed and will be retried. The condition is the kind of failure (and, for an
    /// OS error, its kind), never its text: that names temporary files, so a full disk would
    /// otherwise warn on every retry.
    pub(super) fn save_failed(e: &StoreError) -> Self {
        Notice::warn(
            format!("save:{}", e.condition()),
            format!("tunecache could not save yet: {e}"),
        )
    }

    /// A background rewrite of the file put its copy in place.
    pub(super) fn compacted(dropped: usize) -> Self {
        Notice::debug(match dropped {
            0 => "tunecache rewrote its cache file (a compaction)".to_owned(),
            n => format!(
                "tunecache rewrote its cache file (a compaction), dropping {n} entries past its retention limits"
            ),
        })
    }

    /// A background rewrite was dropped, changing nothing.
    pub(super) fn compaction_dropped(why: &str) -> Self {
        Notice::debug(format!(
            "tunecache dropped a rewrite of its cache file: {why}"
        ))
    }

    /// A background rewrite failed, changing nothing; a later save starts another.
    pub(super) fn compaction_failed(e: &StoreError) -> Self {
        Notice::warn(
            format!(
                "compaction:{}",
                Notice::save_failed(e).key.unwrap_or_default()
            ),
            format!("tunecache could not rewrite its cache file (it stays as it is): {e}"),
        )
    }

    pub(super) fn refresh_failed(e: &StoreError) -> Self {
        Notice::debug(format!("tunecache refresh failed: {e}"))
    }

    pub(super) fn left_untouched(path: &Path, reason: &str) -> Self {
        Notice::warn(
            format!("blocked:{}", path.display()),
            format!(
                "tunecache is leaving {} untouched ({reason}); results are kept in memory only",
                path.display()
            ),
        )
    }

    /// Timestamps from the future (a wrong clock here or where the data came from) were set
    /// to the present.
    pub(super) fn clamped(ahead_ms: u64) -> Self {
        Notice::warn(
            "future-timestamps",
            format!(
                "tunecache: timestamps up to {:.0} s in the future (a wrong clock, here or where they were measured) were set to the present so that later measurements can replace them",
                ahead_ms as f64 / 1000.0
            ),
        )
    }

    /// An entry no reader would accept was refused where it entered (one condition for all).
    pub(super) fn refused_entry(ns: &str, why: &crate::error::Refusal) -> Self {
        Notice::warn(
            "refused-entry",
            format!(
                "tunecache: an entry of namespace {ns:?} was not recorded: {why} (a file holding it could not be read)"
            ),
        )
    }

    /// A result just recorded lost the merge to one of the same candidate with a later
    /// timestamp.
    pub(super) fn lost_merge(candidate: &str, kept_at: u64) -> Self {
        Notice::warn(
            "lost-merge",
            format!(
                "tunecache: a result for {candidate} was not kept: the cache holds one measured later (at {kept_at} ms since 1970); check the clocks of the machines that share this cache"
            ),
        )
    }

    /// A put or an import took an entry past the candidates one entry holds: the merge keeps
    /// the winner and the most recently measured (FORMAT.md, "Merging"). One warning per key.
    pub(super) fn entry_full(ns: &str, key: &cache_format::Key, held: usize) -> Self {
        let max = cache_format::Limits::default().max_candidates;
        Notice::warn(
            format!("entry-full:{ns}:{}", key.fingerprint()),
            format!(
                "tunecache: the entry for {key} of namespace {ns:?} would hold {held} candidates, over the {max} one entry keeps: those measured longest ago are dropped, the winner stays (a candidate whose params change with every measurement, a time or a counter, makes a new one each time)"
            ),
        )
    }

    /// An entry of the cache file could not be read (a damaged block, a file changed in place):
    /// one warning per entry, naming the file and the entry.
    pub(super) fn damaged_entry(
        path: &Path,
        ns: &str,
        key: &cache_format::table::TKey,
        why: &str,
    ) -> Self {
        // One condition per damage: the entries under one damaged node give one line.
        Notice::warn(
            format!("damaged:{}:{why}", path.display()),
            format!(
                "tunecache: the entry {} of namespace {ns:?} in {} cannot be read ({why}); it is treated as missing and will be measured again (`tunecache verify` lists every damaged entry)",
                key.key(),
                path.display()
            ),
        )
    }

    /// The cache's path (or its journal or lock) is not a regular file. `link` is the path
    /// as given, when it is a symbolic link to the one `e` names.
    pub(super) fn not_a_file(e: &StoreError, link: Option<&Path>) -> Self {
        let via = link
            .map(|l| format!("{} is a link: ", l.display()))
            .unwrap_or_default();
        Notice::warn(
            "not-a-file",
            format!("tunecache: {via}{e}; results are kept in memory only"),
        )
    }

    /// One condition for all unusable namespaces: a file with thousands gives one line (and
    /// a count when the cache closes).
    pub(super) fn unusable_namespace(ns: &str) -> Self {
        Notice::warn(
            "unusable-namespace",
            format!("tunecache skips entries of unusable namespace {ns:?}"),
        )
    }

    /// The lines that tell the user about something the disk tier did or found.
    pub(crate) fn of_event(event: &Event) -> Vec<Notice> {
        match event {
            Event::Quarantined {
                original,
                moved_to,
                reason,
            } => vec![Notice::warn(
                format!("quarantine:{}", moved_to.display()),
                format!(
                    "tunecache: {} is unusable ({reason}); moved it to {} and continuing without it",
                    original.display(),
                    moved_to.display()
                ),
            )],
            Event::Unusable { path, cause } => vec![Notice::warn(
                format!("unusable:{}", path.display()),
                format!(
                    "tunecache: {} is unusable ({cause}); it will be moved aside once the lock is free",
                    path.display()
                ),
            )],
            Event::TornTail {
                path,
                offset,
                len,
                kept,
            } => vec![Notice::warn(
                format!("torn:{}:{offset}", path.display()),
                format!(
                    "tunecache: dropped {len} incomplete bytes at offset {offset} of {} (an interrupted write){}",
                    path.display(),
                    kept_at(kept.as_deref())
                ),
            )],
            Event::DamagedRecords { path, count, kept } => vec![Notice::warn(
                format!("damaged:{}", path.display()),
                format!(
                    "tunecache: damage in {count} places of {} (records damaged only in their \
                     frames are read by their checksums, the others skipped){}",
                    path.display(),
                    kept_at(kept.as_deref())
                ),
            )],
            Event::DamagedTable {
                path,
                problems,
                first,
                kept,
            } => vec![Notice::warn(
                format!("damaged-table:{}", path.display()),
                format!(
                    "tunecache: {} had {problems} damaged blocks ({first}); what could be read was written again and the rest is lost{}",
                    path.display(),
                    kept_at(kept.as_deref())
                ),
            )],
            Event::PassedOver {
                path,
                seq,
                read,
                problem,
                kept,
            } => vec![Notice::warn(
                format!("passed-over:{}", path.display()),
                format!(
                    "tunecache: {}: commit {seq} does not read back ({problem}), so commit {read} \
                     serves and the results only commit {seq} held are missing from it; the \
                     file as it was is kept at {} (`tunecache verify` reads it)",
                    path.display(),
                    kept.display()
                ),
            )],
            Event::StaleJournal { path } => vec![Notice::debug(format!(
                "tunecache removed the stale journal {}",
                path.display()
            ))],
            Event::JournalLost { path, why } => vec![Notice::warn(
                format!("journal-lost:{}", path.display()),
                format!(
                    "tunecache: {} lost records this process had written ({why}); they are \
                     written again from memory",
                    path.display()
                ),
            )],
            Event::Migrated { path, report } => migrated(path, report),
            Event::Backup { path } => vec![Notice::info(format!(
                "tunecache kept the pre-migration file as {}",
                path.display()
            ))],
        }
    }
}

/// "1 result", "2 results".
fn results(n: usize) -> String {
    if n == 1 {
        "1 result".to_owned()
    } else {
        format!("{n} results")
    }
}

fn kept_at(kept: Option<&Path>) -> String {
    kept.map(|k| format!("; a copy is at {}", k.display()))
        .unwrap_or_default()
}

fn migrated(path: &Path, report: &Report) -> Vec<Notice> {
    let mut lines: Vec<Notice> = report
        .steps
        .iter()
        .map(|step| Notice::info(format!("cache migration {step}")))
        .collect();
    lines.extend(report.collisions.iter().map(|c| Notice {
        key: None,
        level: Level::Warn,
        text: format!("cache migration collision: {c}"),
    }));
    lines.push(Notice::info(format!(
        "migrated {} cache v{} → v{} ({} entries) in {}",
        report.app,
        report.from,
        report.to,
        report.entries,
        path.display()
    )));
    lines
}

/// Logs what the disk tier did or found for a write made without a [`Cache`](super::Cache)
/// (a CLI import, a merge into a file): each line once, at its level.
pub(crate) fn log_events(events: &[Event]) {
    for notice in events.iter().flat_map(Notice::of_event) {
        notice.log();
    }
}

impl Notice {
    fn log(&self) {
        match self.level {
            Level::Warn => tracing::warn!("{}", self.text),
            Level::Info => tracing::info!("{}", self.text),
            Level::Debug => tracing::debug!("{}", self.text),
        }
    }
}

/// What a cache has told its user (each condition once, the repeats counted) and what its
/// health reports of its file: the mode it runs in and why, the files it quarantined, the
/// migration it made.
pub(super) struct Notices {
    diag: Mutex<Diagnostics>,
}

pub(super) struct Diagnostics {
    pub(super) mode: Mode,
    pub(super) reason: Option<String>,
    /// Conditions already reported: how many more times each came up, and its first line.
    warned: HashMap<String, (u64, String)>,
    pub(super) quarantined: Vec<PathBuf>,
    pub(super) migration: Option<Report>,
}

impl Diagnostics {
    fn new() -> Self {
        Diagnostics {
            mode: Mode::Memory,
            reason: None,
            warned: HashMap::new(),
            quarantined: Vec::new(),
            migration: None,
        }
    }
}

impl Notices {
    pub(super) fn new() -> Self {
        Notices {
            diag: Mutex::new(Diagnostics::new()),
        }
    }

    /// The diagnostics, to read or set the mode and its reason.
    pub(super) fn lock(&self) -> MutexGuard<'_, Diagnostics> {
        lock(&self.diag)
    }

    /// Says `notice`, if any, and records `reason`, if any, as why the cache is not persistent.
    pub(super) fn set_reason(&self, reason: Option<String>, notice: Option<Notice>) {
        if let Some(notice) = notice {
            self.notify(notice);
        }
        if reason.is_some() {
            self.lock().reason = reason;
        }
    }

    /// Logs `notice` unless its condition was already reported by this cache. The diagnostics
    /// lock is released before anything is logged, and callers hold no other in-memory lock.
    pub(super) fn notify(&self, notice: Notice) {
        if let Some(key) = &notice.key {
            let mut diag = self.lock();
            if let Some((repeats, _)) = diag.warned.get_mut(key) {
                *repeats += 1;
                return;
            }
            diag.warned.insert(key.clone(), (0, notice.text.clone()));
        }
        notice.log();
    }

    /// Once, when the cache closes: how many times each reported condition came up again.
    pub(super) fn summarize_repeats(&self) {
        let repeated: Vec<(u64, String)> = {
            let mut diag = self.lock();
            diag.warned
                .values_mut()
                .filter(|(n, _)| *n > 0)
                .map(|(n, text)| (std::mem::take(n), text.clone()))
                .collect()
        };
        for (n, text) in repeated {
            tracing::warn!("tunecache: {n} more like this were not shown: {text}");
        }
    }

    /// The file must never be written by this build: stay in memory.
    pub(super) fn block(&self, path: &Path, reason: &str) {
        {
            let mut diag = self.lock();
            diag.mode = Mode::Memory;
            diag.reason = Some(format!("{} left untouched: {reason}", path.display()));
        }
        self.notify(Notice::left_untouched(path, reason));
    }

    /// Tells the user about `event` (once per condition) and records what health reports.
    pub(super) fn report(&self, event: Event) {
        {
            let mut diag = self.lock();
            match &event {
                Event::Quarantined { moved_to, .. } => diag.quarantined.push(moved_to.clone()),
                Event::Migrated { report, .. } => diag.migration = Some(report.clone()),
                _ => {}
            }
        }
        for notice in Notice::of_event(&event) {
            self.notify(notice);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_lock_is_one_condition_whatever_its_wait() {
        let a = StoreError::LockTimeout {
            path: "/x.lock".into(),
            waited: std::time::Duration::from_millis(5000),
        };
        let b = StoreError::LockTimeout {
            path: "/x.lock".into(),
            waited: std::time::Duration::from_millis(7000),
        };
        assert_eq!(Notice::save_failed(&a).key, Notice::save_failed(&b).key);
        assert_ne!(Notice::save_failed(&a).text, Notice::save_failed(&b).text);
    }

    #[test]
    fn a_full_disk_is_one_condition_whatever_temporary_file_failed() {
        let full = |tmp: &str| {
            StoreError::io(
                "write",
                format!("/c/.c.tcache.tmp.{tmp}"),
                std::io::Error::from(std::io::ErrorKind::StorageFull),
            )
        };
        assert_eq!(
            Notice::save_failed(&full("1.1")).key,
            Notice::save_failed(&full("1.2")).key
        );
        assert_ne!(
            Notice::save_failed(&full("1.1")).key,
            Notice::save_failed(&StoreError::io(
                "write",
                "/c/x",
                std::io::Error::from(std::io::ErrorKind::PermissionDenied)
            ))
            .key,
            "another kind of failure is another condition"
        );
        assert_eq!(
            Notice::unusable_namespace("a").key,
            Notice::unusable_namespace("b").key
        );
    }
}
