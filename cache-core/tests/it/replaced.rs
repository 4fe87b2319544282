//! A cache file replaced under a running process (issue 49, case 13): renamed in, copied in
//! place, at an older, equal or newer schema, of an older format, damaged; with and without a
//! journal beside it. The process applies the same gate, migration and keep-aside rules as an
//! open, and what it acknowledged before is merged back into whatever file it then writes.

use std::path::Path;
use std::time::Duration;

use cache_core::cache_migrate::Migrations;
use cache_core::{Cache, Store};

use crate::support::{APP, capture_logs, entry, key, ns, path_in, temp_dir};
use crate::versions::{file_with, rename_step, table_with};

/// The current schema of the running process; schema 1 migrates to it (tiled → blocked).
fn registry() -> Migrations {
    Migrations::new(APP, 2)
        .with(rename_step())
        .expect("registry")
}

fn open(path: &Path, fold: bool) -> Cache {
    Cache::builder(registry())
        .file(path)
        .ignore_env()
        .save_delay(Duration::from_millis(10))
        .flush_timeout(Duration::from_secs(30))
        .refresh_interval(None)
        // Without a fold, results stay in the journal beside the file.
        .compaction(1e9, if fold { 1 } else { 1 << 30 })
        .open()
}

/// As [`open`], but saving only when flushed (or closed): what a flush wrote is all there is.
fn open_saving_on_flush(path: &Path, fold: bool) -> Cache {
    crate::support::saving_on_flush(registry(), path, fold)
}

/// Whether `cache` holds `entry(writer, id)` (its winner's time is the id's).
fn holds(cache: &Cache, writer: u64, id: u64) -> bool {
    cache.lookup(ns(), &key(writer, id)).is_some_and(|e| {
        e.best()
            .is_some_and(|c| c.stats().is_some_and(|s| s.median_ns == 1000.0 + id as f64))
    })
}

#[derive(Debug, Clone, Copy)]
enum How {
    /// Written beside and renamed over the file (a new inode).
    Renamed,
    /// Written over the file's bytes (`cp`: the same inode).
    CopiedInPlace,
}

fn replace(path: &Path, bytes: &[u8], how: How) {
    match how {
        How::Renamed => {
            let tmp = path.with_extension("incoming");
            std::fs::write(&tmp, bytes).expect("write");
            std::fs::rename(&tmp, path).expect("rename");
        }
        How::CopiedInPlace => std::fs::write(path, bytes).expect("write in place"),
    }
}

/// Runs a process that acknowledges entries 0..3 of writer 1, has the file replaced by
/// `bytes`, then records entry 3 and flushes; returns the flush's outcome.
fn run(path: &Path, bytes: &[u8], how: How, fold: bool) -> Result<(), cache_core::StoreError> {
    let cache = open(path, fold);
    for id in 0..3 {
        cache.put(ns(), entry(1, id));
        cache.flush().expect("acknowledged");
    }
    replace(path, bytes, how);
    cache.put(ns(), entry(1, 3));
    let flushed = cache.flush();
    drop(cache);
    flushed
}

/// What a new process reads: which of writer 1's four and the replacement's ten it holds.
fn after(path: &Path) -> (Vec<u64>, usize) {
    let cache = open(path, false);
    let mine = (0..4).filter(|id| holds(&cache, 1, *id)).collect();
    let theirs = (0..10)
        .filter(|id| cache.lookup(ns(), &key(5, *id)).is_some())
        .count();
    (mine, theirs)
}

const HOWS: [How; 2] = [How::Renamed, How::CopiedInPlace];

#[test]
fn a_replacement_at_the_same_or_an_older_schema_keeps_what_the_process_acknowledged() {
    capture_logs();
    let cases: [(&str, Vec<u8>); 4] = [
        ("a table at the same schema", table_with(APP, 2, 0..10)),
        ("a table at an older schema", table_with(APP, 1, 0..10)),
        (
            "a snapshot (format 3) at the same schema",
            file_with(APP, 2, 0..10),
        ),
        (
            "a snapshot (format 3) at an older schema",
            file_with(APP, 1, 0..10),
        ),
    ];
    for (what, bytes) in &cases {
        for how in HOWS {
            for fold in [false, true] {
                let dir = temp_dir();
                let path = path_in(&dir, "c.tcache");
                let why = format!("{what}, {how:?}, fold at every save: {fold}");
                run(&path, bytes, how, fold).unwrap_or_else(|e| panic!("{why}: {e}"));
                assert_eq!(after(&path), (vec![0, 1, 2, 3], 10), "{why}");
                // An older schema was migrated: nothing at schema 1 is served as current.
                let cache = open(&path, false);
                let e = cache.lookup(ns(), &key(5, 0)).expect("theirs");
                let want = if what.contains("older") {
                    "blocked"
                } else {
                    "tiled"
                };
                assert_eq!(
                    e.best().map(|c| c.id.algorithm.as_str()),
                    Some(want),
                    "{why}: migrated only from the older schema"
                );
            }
        }
    }
}

#[test]
fn a_replacement_at_a_newer_schema_or_not_tunecaches_is_left_alone_and_says_why() {
    capture_logs();
    let newer = table_with(APP, 9, 0..10);
    let garbage = b"hello, world: not a cache".to_vec();
    for (newer, how) in [newer, garbage]
        .iter()
        .flat_map(|bytes| HOWS.iter().map(move |how| (bytes.clone(), *how)))
    {
        let dir = temp_dir();
        let path = path_in(&dir, "c.tcache");
        let flushed = run(&path, &newer, how, false);
        assert!(
            flushed.is_err(),
            "{how:?}: the result cannot be saved there"
        );
        assert_eq!(
            std::fs::read(&path).expect("read"),
            newer,
            "{how:?}: untouched"
        );
    }
}

#[test]
fn a_damaged_replacement_is_kept_aside_before_anything_is_written() {
    capture_logs();
    let mut damaged = table_with(APP, 2, 0..10);
    let at = damaged.len() / 2;
    damaged[148] ^= 0xff; // the header's first byte: the table does not open
    // Cut short within the marker: tunecache's, unusable.
    let cut = table_with(APP, 2, 0..10)[..9].to_vec();
    let _ = at;
    for bytes in [damaged, cut] {
        for how in HOWS {
            let dir = temp_dir();
            let path = path_in(&dir, "c.tcache");
            run(&path, &bytes, how, false).expect("saved");
            let kept: Vec<_> = std::fs::read_dir(dir.path())
                .expect("dir")
                .flatten()
                .filter(|f| {
                    f.file_name()
                        .to_string_lossy()
                        .starts_with("c.tcache.unusable-")
                })
                .collect();
            let names: Vec<_> = kept.iter().map(|f| f.file_name()).collect();
            assert_eq!(kept.len(), 1, "{how:?}: one copy kept aside: {names:?}");
            assert_eq!(
                std::fs::read(kept[0].path()).expect("read"),
                bytes,
                "{how:?}"
            );
            assert_eq!(after(&path), (vec![0, 1, 2, 3], 0), "{how:?}");
        }
    }
}

/// Found by a hostile review: the first flush after the file was replaced returned before this
/// process's earlier results were written again (they were, one save delay later or at close),
/// so a process killed right after that flush lost them. The save that finds the file
/// replaced now writes them, and the flush waits for it.
#[test]
fn the_flush_after_a_replacement_returns_with_the_earlier_results_written_again() {
    capture_logs();
    for how in HOWS {
        for fold in [false, true] {
            let dir = temp_dir();
            let path = path_in(&dir, "c.tcache");
            // No save but the flushes' until the end: what the flush wrote is all there is.
            let cache = open_saving_on_flush(&path, fold);
            for id in 0..3 {
                cache.put(ns(), entry(1, id));
                cache.flush().expect("acknowledged");
            }
            replace(&path, &table_with(APP, 2, 0..10), how);
            cache.put(ns(), entry(1, 3));
            cache.flush().expect("flushed");
            // What another process reads now, before this one saves again or closes.
            assert_eq!(
                after(&path),
                (vec![0, 1, 2, 3], 10),
                "{how:?}, fold at every save: {fold}"
            );
            drop(cache);
        }
    }
}

/// The save that found the file replaced wrote this process's results into it; the view it
/// published then still said "replaced", and every one of them was written once more at the
/// next save. Nothing is left to write after that save.
#[test]
fn the_save_that_wrote_the_results_again_leaves_nothing_to_write() {
    capture_logs();
    for how in HOWS {
        let dir = temp_dir();
        let path = path_in(&dir, "c.tcache");
        let cache = open_saving_on_flush(&path, false);
        for id in 0..3 {
            cache.put(ns(), entry(1, id));
            cache.flush().expect("acknowledged");
        }
        replace(&path, &table_with(APP, 2, 0..10), how);
        cache.put(ns(), entry(1, 3));
        cache.flush().expect("flushed");
        assert_eq!(cache.health().pending, 0, "{how:?}: nothing queued");
        drop(cache);
    }
}

/// Found by a hostile review: an older copy of the table written over the file in place, and
/// then another process's fold gave it a commit under the same number as the one this process
/// had read. The number alone made it look like the same table; the commit's place in the
/// chain tells them apart, so the process writes what it recorded again.
#[test]
fn an_older_copy_written_in_place_and_folded_into_since_is_a_replacement() {
    capture_logs();
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let cache = open(&path, true);
    cache.put(ns(), entry(1, 0));
    cache.flush().expect("the table's first commit");
    let older = std::fs::read(&path).expect("a copy");
    cache.put(ns(), entry(1, 1));
    cache.flush().expect("folded: the second commit");
    replace(&path, &older, How::CopiedInPlace);
    {
        let other = open(&path, true);
        other.put(ns(), entry(5, 0));
        other.flush().expect("folded: another second commit");
    }
    cache.put(ns(), entry(1, 2));
    cache.flush().expect("flushed");
    let reader = open(&path, false);
    let mine: Vec<u64> = (0..3).filter(|id| holds(&reader, 1, *id)).collect();
    assert_eq!(mine, [0, 1, 2]);
    assert!(
        reader.lookup(ns(), &key(5, 0)).is_some(),
        "the other's result stays"
    );
    drop(cache);
}
