//! A journal that loses records a running process wrote to it (removed, cut short, replaced by
//! another, an older copy put back, bytes damaged where the process already read, removed
//! before another process's fold). The process's next save writes everything it recorded
//! again: a flush after the loss returns with the earlier results on disk, and a new process
//! reads them. Found by hostile reviews of save deltas (withdrawn since); the same loss hit
//! whole-entry saves for every key not recorded again. Each harm also records into a hot key
//! again, as deltas did, so a return of them is checked too.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cache_core::cache_format::{Candidate, Entry, Fields, Fingerprint, Origin, Stats, Value};
use cache_core::cache_migrate::Migrations;
use cache_core::{Cache, Store};

use crate::support::{APP, capture_logs, entry, key, logs_about, ns, path_in, temp_dir};

/// A cache that saves only when flushed; without `fold`, results stay in the journal.
fn open(path: &Path, fold: bool) -> Cache {
    crate::support::saving_on_flush(Migrations::new(APP, 1), path, fold)
}

fn journal(path: &Path) -> PathBuf {
    let mut j = path.as_os_str().to_owned();
    j.push(".journal");
    PathBuf::from(j)
}

/// One more measurement of writer 1's hot key: a candidate of its own (`tile` = `step`).
fn hot(step: i64) -> Entry {
    let stats = Stats {
        median_ns: 2000.0 + step as f64,
        min_ns: 1900.0,
        spread_ns: 3.0,
        samples: 9,
    };
    let params = Fields::from([("tile".to_owned(), Value::Int(step))]);
    Entry::new(
        key(1, HOT),
        Fingerprint::default(),
        Origin::Measured("writer 1".into()),
        cache_core::cache_format::now_millis(),
        [Candidate::measured("tiled", params, stats)],
    )
}

const HOT: u64 = 100;

/// Which of writer 1's first `n` results a new process reads, and how many candidates of the
/// hot key.
fn read_back(path: &Path, n: u64) -> (Vec<u64>, usize) {
    let cache = open(path, false);
    let ids = (0..n)
        .filter(|id| cache.lookup(ns(), &key(1, *id)).is_some())
        .collect();
    let hot = cache
        .lookup(ns(), &key(1, HOT))
        .map_or(0, |e| e.candidates().len());
    (ids, hot)
}

#[derive(Debug, Clone, Copy)]
enum Harm {
    Removed,
    CutShort,
    /// Removed, then another writer starts a new journal at the same commit.
    Replaced,
    /// The copy taken after the first append written back in place, then another writer's
    /// records make it longer than what this process read.
    OlderCopyThenGrown,
    /// A byte flipped inside the second record (of the journal), the length unchanged.
    Damaged,
    /// Removed, then another writer folds a journal of its own into the table: the commit
    /// moved, and the fold did not hold this process's records.
    RemovedThenFolded,
}

const HARMS: [Harm; 6] = [
    Harm::Removed,
    Harm::CutShort,
    Harm::Replaced,
    Harm::OlderCopyThenGrown,
    Harm::Damaged,
    Harm::RemovedThenFolded,
];

fn other_writer_records(path: &Path, ids: std::ops::Range<u64>) {
    other_writer(path, ids, false);
}

fn other_writer(path: &Path, ids: std::ops::Range<u64>, fold: bool) {
    let other = open(path, fold);
    for id in ids {
        other.put(ns(), entry(2, id));
    }
    other.flush().expect("the other writer saves");
}

#[test]
fn a_journal_that_lost_records_gets_them_written_again_by_the_next_save() {
    capture_logs();
    let mut wrong = Vec::new();
    for harm in HARMS {
        let dir = temp_dir();
        let path = path_in(&dir, "c.tcache");
        let cache = open(&path, false);
        // The first save writes the table; the next ones append to the journal.
        let mut after_first = Vec::new();
        for id in 0..4 {
            cache.put(ns(), entry(1, id));
            cache.put(ns(), hot(id as i64));
            cache.flush().expect("acknowledged");
            if id == 1 {
                after_first = std::fs::read(journal(&path)).expect("journal");
            }
        }
        let j = journal(&path);
        let len = std::fs::metadata(&j).expect("journal").len();
        match harm {
            Harm::Removed => std::fs::remove_file(&j).expect("remove"),
            Harm::CutShort => {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&j)
                    .expect("open");
                f.set_len(len / 2).expect("cut");
            }
            Harm::Replaced => {
                std::fs::remove_file(&j).expect("remove");
                other_writer_records(&path, 0..2);
            }
            Harm::OlderCopyThenGrown => {
                std::fs::write(&j, &after_first).expect("written back in place");
                other_writer_records(&path, 0..40);
                assert!(
                    std::fs::metadata(&j).expect("journal").len() > len,
                    "grown past it"
                );
            }
            Harm::Damaged => {
                let mut bytes = std::fs::read(&j).expect("journal");
                let at = after_first.len() + (bytes.len() - after_first.len()) / 4;
                bytes[at] ^= 0x5a;
                std::fs::write(&j, &bytes).expect("damaged in place");
            }
            Harm::RemovedThenFolded => {
                std::fs::remove_file(&j).expect("remove");
                other_writer(&path, 0..2, true);
                assert!(!j.exists(), "the other writer folded");
            }
        }
        cache.put(ns(), entry(1, 4));
        cache.put(ns(), hot(4));
        cache.flush().expect("flushed");
        // What another process reads now, before this one saves again or closes.
        let read = read_back(&path, 5);
        let said = !logs_about(&format!("{} lost records", j.display())).is_empty();
        if read != (vec![0, 1, 2, 3, 4], 5) || !said {
            wrong.push(format!(
                "{harm:?}: read back {read:?}, the loss said: {said}"
            ));
        }
        drop(cache);
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Another process's fold empties the journal on purpose (its records went into the table's
/// next commit): nothing is lost, nothing is said, nothing is written twice.
#[test]
fn a_fold_by_another_process_is_not_a_lost_journal() {
    capture_logs();
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let cache = open(&path, false);
    for id in 0..3 {
        cache.put(ns(), entry(1, id));
        cache.flush().expect("acknowledged");
    }
    let folder = open(&path, true);
    folder.put(ns(), entry(2, 0));
    folder.flush().expect("folds");
    drop(folder);
    assert!(!journal(&path).exists(), "the fold emptied the journal");
    cache.put(ns(), entry(1, 3));
    cache.flush().expect("flushed");
    assert_eq!(read_back(&path, 4), (vec![0, 1, 2, 3], 0));
    let said = logs_about(&format!("{} lost records", journal(&path).display()));
    assert!(said.is_empty(), "a fold is not a loss: {said:?}");
    drop(cache);
}

/// A node damaged in the table (a flipped bit in the root, found by a hostile review): the
/// next fold cannot go through it, so it rebuilds the table from what it can read and what
/// was under the node is lost. This process's results among them are written again from
/// memory in the same save.
#[test]
fn a_fold_that_met_a_damaged_node_writes_this_processs_results_again() {
    use cache_core::cache_format::table::Table;
    capture_logs();
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let cache = open(&path, true);
    for id in 0..300 {
        cache.put(ns(), entry(1, id));
    }
    cache.flush().expect("folded");
    let t = Table::open(
        std::fs::read(&path).expect("read"),
        &cache_core::cache_format::Limits::default(),
    )
    .expect("a table");
    assert!(t.commit().height > 0, "the root is a node above the leaves");
    let root = t.commit().root.expect("a root");
    flip_at(&path, root.offset + u64::from(root.len) / 2);
    cache.put(ns(), entry(1, 300));
    cache.flush().expect("flushed");
    assert_eq!(
        read_back(&path, 301).0.len(),
        301,
        "every result this process recorded"
    );
    drop(cache);
}

fn flip_at(path: &Path, at: u64) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open");
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, at).expect("read");
    byte[0] ^= 0x5a;
    file.write_all_at(&byte, at).expect("write");
}

/// Flips a byte of `k`'s entry where the table at `path` keeps it (as a failing disk would).
fn damage_entry(path: &Path, k: &cache_core::cache_format::Key) {
    use cache_core::cache_format::table::{TKey, Table};
    let t = Table::open(
        std::fs::read(path).expect("read"),
        &cache_core::cache_format::Limits::default(),
    )
    .expect("a table");
    let tkey = TKey::of(&Default::default(), ns().name(), &k.fingerprint());
    let at = t.locate(&tkey).expect("reads").expect("present");
    flip_at(path, at.offset + 10);
}

fn len_of(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// Found by a hostile review: the process's own background compaction renamed a rewritten
/// table in (the journal goes on applying to it) and the process forgot what it had written
/// to the journal, so a journal removed afterwards lost those results unnoticed.
#[test]
fn a_journal_lost_after_a_compaction_renamed_the_table_in_is_still_caught() {
    use std::os::unix::fs::MetadataExt;
    capture_logs();
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    {
        // Commits whose blocks the next ones leave behind: bytes for a compaction to drop.
        let p = open(&path, true);
        for id in 0..40 {
            p.put(ns(), entry(3, id));
            p.flush().expect("folded");
        }
    }
    let w = open(&path, false);
    for id in 0..4 {
        w.put(ns(), entry(1, id));
        w.flush().expect("appended");
    }
    let before = std::fs::metadata(&path).expect("table").ino();
    // Another process whose save appends and then finds the table worth rewriting.
    let c = Cache::builder(Migrations::new(APP, 1))
        .file(&path)
        .ignore_env()
        .refresh_interval(None)
        .compaction(0.0, 4096)
        .open();
    c.put(ns(), entry(2, 0));
    c.flush().expect("appended");
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while std::fs::metadata(&path).expect("table").ino() == before {
        assert!(std::time::Instant::now() < until, "no compaction ran");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(c);
    w.flush().expect("reads the rewritten table");
    assert!(journal(&path).exists(), "the journal goes on applying");
    std::fs::remove_file(journal(&path)).expect("remove");
    w.put(ns(), entry(1, 4));
    w.flush().expect("flushed");
    assert_eq!(read_back(&path, 5).0, vec![0, 1, 2, 3, 4]);
    drop(w);
}

/// Found by a hostile review of save deltas: an entry damaged in the table while the process
/// appends what it records into it (no fold of its own). A save writes the whole entry memory
/// holds, so the file keeps every candidate.
#[test]
fn a_record_into_an_entry_damaged_in_the_table_is_written_whole() {
    capture_logs();
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let w = open(&path, false);
    for step in 0..3 {
        w.put(ns(), hot(step));
        w.flush().expect("saved");
    }
    // Another process folds the journal: the hot key's three candidates are in the table.
    other_writer(&path, 0..1, true);
    assert!(!journal(&path).exists());
    // This process reads the fold (nothing of its own is lost) before the damage.
    w.refresh().expect("read");
    damage_entry(&path, &key(1, HOT));
    w.put(ns(), hot(3));
    w.flush().expect("flushed");
    assert_eq!(
        read_back(&path, 0).1,
        4,
        "every candidate this process recorded"
    );
    drop(w);
}

/// Found by a hostile review: once a process had read past damage in another writer's record,
/// it forgot what it had written to the journal before, so its own record damaged next went
/// unnoticed.
#[test]
fn damage_to_this_processs_record_after_damage_to_anothers_is_caught() {
    capture_logs();
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let w = open(&path, false);
    w.put(ns(), hot(0));
    w.flush().expect("the table");
    w.put(ns(), hot(1));
    w.flush().expect("appended");
    let a = len_of(&journal(&path));
    other_writer_records(&path, 0..1);
    let b = len_of(&journal(&path));
    w.put(ns(), hot(2));
    w.flush().expect("appended");
    let c = len_of(&journal(&path));
    flip_at(&journal(&path), (a + b) / 2);
    w.put(ns(), entry(1, 0));
    w.flush().expect("reads past the other's damage");
    flip_at(&journal(&path), (b + c) / 2);
    w.put(ns(), entry(1, 1));
    w.flush().expect("flushed");
    assert_eq!(read_back(&path, 2), (vec![0, 1], 3));
    drop(w);
}

/// Found by a hostile review: a byte of this process's record flipped in place with the
/// journal's length and modification time put back; the change time cannot be put back.
#[test]
fn damage_with_the_modification_time_put_back_is_caught() {
    capture_logs();
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let w = open(&path, false);
    for step in 0..3 {
        w.put(ns(), hot(step));
        w.flush().expect("saved");
    }
    let j = journal(&path);
    let modified = std::fs::metadata(&j)
        .and_then(|m| m.modified())
        .expect("mtime");
    flip_at(&j, len_of(&j) - 20);
    std::fs::File::options()
        .write(true)
        .open(&j)
        .and_then(|f| f.set_modified(modified))
        .expect("mtime put back");
    w.put(ns(), entry(1, 0));
    w.flush().expect("flushed");
    assert_eq!(read_back(&path, 1), (vec![0], 3));
    drop(w);
}

/// Found by a hostile review: entries damaged in the table for keys this process recorded once
/// and never again. Its folds never touch them; its compaction met the damage and gave up, at
/// every attempt, and the results stayed unreadable. A compaction that fails on damage now has
/// the next save rewrite the table from what reads back (a copy of the file kept) and write
/// this process's results again.
#[test]
fn a_compaction_that_met_a_damaged_entry_gets_this_processs_results_written_again() {
    capture_logs();
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    // Every save folds, and a compaction is due after every fold.
    let w = Cache::builder(Migrations::new(APP, 1))
        .file(&path)
        .ignore_env()
        .save_delay(Duration::from_secs(3600))
        .flush_timeout(Duration::from_secs(30))
        .refresh_interval(None)
        .compaction(0.0, 1)
        .open();
    for id in 0..20 {
        w.put(ns(), entry(1, id));
    }
    w.flush().expect("the table");
    damage_entry(&path, &key(1, 3));
    // A fold of another key; the compaction after it meets the damaged entry.
    w.put(ns(), entry(1, 20));
    w.flush().expect("folded");
    let said = |what: &str| {
        logs_about(&path.display().to_string())
            .iter()
            .any(|l| l.contains(what))
    };
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while !said("could not rewrite its cache file") {
        assert!(
            std::time::Instant::now() < until,
            "the compaction did not run: {:?}",
            logs_about(&path.display().to_string())
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    w.flush().expect("the rewrite");
    assert_eq!(read_back(&path, 21).0, (0..21).collect::<Vec<_>>());
    drop(w);
}
