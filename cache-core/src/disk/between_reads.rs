//! Tests of the read that a fold lands in the middle of: a hook run between the read of the
//! cache file and the read of the journal (tests only), so a writer's fold is placed exactly
//! there, and the reader must still see every result acknowledged before it began. The same
//! hook runs between a journal append's write and its sync, where another writer's bytes are
//! placed to check that the append does not take them as its own.

use std::cell::RefCell;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cache_format::{Candidate, Entry, Fields, Fingerprint, Key, Limits, Origin, Scope, Stats};
use cache_migrate::Migrations;

use super::{Disk, DiskOptions, Paths};
use crate::namespace::Namespace;
use crate::store::Store;

type Hook = Box<dyn FnOnce()>;

thread_local! {
    static HOOK: RefCell<Option<Hook>> = RefCell::new(None);
}

/// Runs the hook set for this thread, once.
pub(super) fn run() {
    if let Some(hook) = HOOK.with(|h| h.borrow_mut().take()) {
        hook();
    }
}

fn set(hook: impl FnOnce() + 'static) {
    HOOK.with(|h| *h.borrow_mut() = Some(Box::new(hook)));
}

fn registry() -> Migrations {
    Migrations::new("between", 1)
}

fn entry(id: i64) -> Entry {
    let key = Key::new(Fields::from([("id".to_owned(), id.into())]));
    let stats = Stats {
        median_ns: 100.0,
        min_ns: 90.0,
        spread_ns: 1.0,
        samples: 3,
    };
    Entry::new(
        key,
        Fingerprint::default(),
        Origin::Measured("t".into()),
        cache_format::now_millis(),
        [Candidate::measured("x", Fields::new(), stats)],
    )
}

/// A cache at `path` that folds at every save (`fold`) or never does.
fn cache(path: &Path, fold: bool) -> crate::Cache {
    crate::Cache::builder(registry())
        .file(path)
        .ignore_env()
        .save_delay(Duration::from_millis(5))
        .refresh_interval(None)
        .compaction(1e9, if fold { 1 } else { 1 << 30 })
        .open()
}

fn found(disk: &mut Disk, id: i64) -> bool {
    let view = disk.view(super::Changed::All { faithful: true });
    let e = entry(id);
    let ns = "mm";
    super::table::lookup(&view, &Scope::default(), ns, &e.fingerprint())
        .0
        .is_some()
}

#[test]
fn a_fold_between_the_two_reads_loses_no_acknowledged_result() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("c.tcache");
    let mm = Namespace::new("mm").expect("name");
    // A table holding entry 1, and a journal holding entry 2 (acknowledged by its flush).
    let writer = cache(&path, false);
    writer.put(mm, entry(1));
    writer.flush().expect("saved");
    writer.put(mm, entry(2));
    writer.flush().expect("saved");
    drop(writer);
    assert!(dir.path().join("c.tcache.journal").exists());
    // The reader reads the table's commit; then, before it reads the journal, a writer folds
    // the journal (entry 2, and its own entry 3) into a new commit and removes the journal.
    let folder = path.clone();
    set(move || {
        let w = cache(&folder, true);
        w.put(mm, entry(3));
        w.flush().expect("folded");
    });
    let mut reader = Disk::new(
        Paths::new(path.clone()),
        Arc::new(registry()),
        DiskOptions::new(Limits::default()),
    );
    reader.read_updates(false).expect("read");
    assert!(
        !dir.path().join("c.tcache.journal").exists(),
        "the fold ran between"
    );
    for id in [1, 2, 3] {
        assert!(found(&mut reader, id), "entry {id}");
    }
}

#[test]
fn a_reader_reads_again_only_while_the_file_moves_and_not_for_ever() {
    use super::read_again;
    assert!(read_again(false, 0, true));
    assert!(!read_again(false, 0, false), "nothing moved");
    assert!(!read_again(true, 0, true), "under the lock nothing moves");
    assert!(!read_again(false, 16, true), "bounded");
}

/// Found by a hostile review: a byte of this process's earlier record flipped while its next
/// append was being synced was taken as part of its own write (the journal's identity after
/// the sync was recorded as checked), so the loss was never noticed.
#[test]
fn a_byte_written_over_while_an_append_syncs_is_checked_at_the_next_read() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("c.tcache");
    let mm = Namespace::new("mm").expect("name");
    let writer = cache(&path, false);
    writer.put(mm, entry(1));
    writer.flush().expect("the table");
    drop(writer);
    let mut disk = Disk::new(
        Paths::new(path.clone()),
        Arc::new(registry()),
        DiskOptions::new(Limits::default()),
    );
    disk.read_updates(true).expect("read");
    let one = |id| {
        let mut data = cache_format::CacheData::new();
        data.insert(&Scope::default(), "mm", entry(id));
        data
    };
    disk.write(&one(2), false).expect("appended");
    let journal = dir.path().join("c.tcache.journal");
    let len = std::fs::metadata(&journal).expect("journal").len();
    set(move || {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&journal)
            .expect("open");
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, len - 10).expect("read");
        f.write_all_at(&[b[0] ^ 0x5a], len - 10).expect("write");
    });
    disk.write(&one(3), false).expect("appended");
    let inc = disk.read_updates(true).expect("read");
    assert!(inc.replaced, "what this process wrote is written again");
}
