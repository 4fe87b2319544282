//! The I/O promise (ARCHITECTURE.md, "The I/O promise"), checked with the kernel's own count
//! of this thread's read and write system calls (`/proc/thread-self/io`): a hit on a decoded
//! entry makes none, the first use of an entry still kept in the snapshot makes exactly one
//! read (its own bytes), and a miss with no lower tier makes none.

use cache_core::{Cache, MemoryLookup, Store};

use crate::support::{builder, entry, key, ns, path_in, temp_dir};

/// This thread's read and write system calls so far, or `None` where the kernel does not
/// count them per thread.
fn calls() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/thread-self/io").ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
    };
    Some((field("syscr:")?, field("syscw:")?))
}

/// The read and write calls `f` made on this thread, less what reading the counters costs.
fn counted(f: impl FnOnce()) -> (u64, u64) {
    let a = calls().expect("counters");
    let b = calls().expect("counters");
    let cost = (b.0 - a.0, b.1 - a.1);
    f();
    let c = calls().expect("counters");
    (c.0 - b.0 - cost.0, c.1 - b.1 - cost.1)
}

/// A cache of 200 entries, saved and opened again, so its entries are kept in the file.
fn reopened(dir: &tempfile::TempDir) -> Cache {
    let path = path_in(dir, "io.tcache");
    let first = builder(&path).open();
    for id in 0..200 {
        first.put(ns(), entry(1, id));
    }
    first.close().expect("saved");
    builder(&path).open()
}

#[test]
fn a_hit_does_no_io_and_an_entry_kept_in_the_file_costs_one_read_once() {
    if calls().is_none() {
        test_support::skip::missing(
            "/proc/thread-self/io",
            "the kernel does not count I/O per thread",
        );
        return;
    }
    let dir = temp_dir();
    let cache = reopened(&dir);
    let fp = key(1, 7).fingerprint();
    assert!(
        matches!(cache.get_in_memory(ns(), &fp), MemoryLookup::NeedsIo),
        "kept in the file until used"
    );
    let (reads, writes) = counted(|| {
        assert!(cache.get(ns(), &fp).is_some());
    });
    assert_eq!(
        (reads, writes),
        (1, 0),
        "one pread of the entry's own bytes"
    );
    assert!(matches!(
        cache.get_in_memory(ns(), &fp),
        MemoryLookup::Hit(_)
    ));
    let (reads, writes) = counted(|| {
        for _ in 0..10_000 {
            assert!(cache.get(ns(), &fp).is_some());
            assert!(cache.lookup(ns(), &key(1, 7)).is_some());
        }
    });
    assert_eq!((reads, writes), (0, 0), "hits touch memory only");
    let absent = key(9, 9).fingerprint();
    assert!(matches!(
        cache.get_in_memory(ns(), &absent),
        MemoryLookup::Miss
    ));
    let (reads, writes) = counted(|| {
        for _ in 0..1000 {
            assert!(cache.get(ns(), &absent).is_none());
        }
    });
    assert_eq!(
        (reads, writes),
        (0, 0),
        "a miss with no tier to ask is memory only"
    );
}

#[test]
fn the_counters_see_a_read() {
    // The check above would pass vacuously if the counters missed reads: they do not.
    if calls().is_none() {
        test_support::skip::missing(
            "/proc/thread-self/io",
            "the kernel does not count I/O per thread",
        );
        return;
    }
    let dir = temp_dir();
    let path = path_in(&dir, "f");
    std::fs::write(&path, b"x").expect("write");
    let (reads, _) = counted(|| {
        let _ = std::fs::read(&path).expect("read");
    });
    assert!(reads >= 1, "{reads}");
}
