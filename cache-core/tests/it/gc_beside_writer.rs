//! `gc` beside a running writer: what it drops on purpose stays dropped, and the writer does
//! not call it a loss. (The journal-loss check, added for journals that lose what a process
//! wrote, took a `gc --max-age` that folded the writer's journal for a loss: it warned "lost
//! records" and wrote every pruned key back, undoing the gc.)

use std::path::Path;
use std::time::Duration;

use cache_core::cache_format::{Entry, now_millis};
use cache_core::cache_migrate::Migrations;
use cache_core::{Cache, GcPolicy, Store, gc_file};

use crate::support::{APP, capture_logs, entry, key, logs_about, ns, path_in, temp_dir};

/// A cache that saves only when flushed and never folds: results stay in the journal.
fn open(path: &Path) -> Cache {
    crate::support::saving_on_flush(Migrations::new(APP, 1), path, false)
}

/// `entry(writer, id)`, recorded `days` ago.
fn aged(writer: u64, id: u64, days: u64) -> Entry {
    let (k, set, origin, _, candidates) = entry(writer, id).into_parts();
    Entry::new(k, set, origin, now_millis() - days * 86_400_000, candidates)
}

fn present(path: &Path, writer: u64, ids: std::ops::Range<u64>) -> Vec<u64> {
    let cache = open(path);
    ids.filter(|id| cache.lookup(ns(), &key(writer, *id)).is_some())
        .collect()
}

#[test]
fn a_gc_that_folds_a_running_writers_journal_is_not_a_loss_and_stays_done() {
    capture_logs();
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let writer = open(&path);
    // The first save writes the table; the next ones append to the journal.
    writer.put(ns(), entry(1, 100));
    writer.flush().expect("the table");
    for id in 0..6 {
        writer.put(ns(), aged(1, id, if id < 3 { 40 } else { 1 }));
    }
    writer.flush().expect("the journal");
    let policy = GcPolicy {
        max_age: Some(Duration::from_secs(30 * 86_400)),
        ..GcPolicy::default()
    };
    let report = gc_file(&path, &Migrations::new(APP, 1), &policy).expect("gc");
    assert_eq!(report.dropped_by_age, 3, "{report:?}");
    assert_eq!(present(&path, 1, 0..6), [3, 4, 5], "what gc left");
    // The writer goes on.
    writer.put(ns(), entry(1, 101));
    writer.flush().expect("after the gc");
    drop(writer);
    assert_eq!(present(&path, 1, 0..6), [3, 4, 5], "the gc stays done");
    assert_eq!(present(&path, 1, 100..102), [100, 101]);
    let path_text = path.display().to_string();
    let said: Vec<String> = logs_about("lost records")
        .into_iter()
        .filter(|l| l.contains(&path_text))
        .collect();
    assert!(said.is_empty(), "{said:?}");
}
