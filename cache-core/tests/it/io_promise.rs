//! The I/O promise (ARCHITECTURE.md, "The I/O promise"), checked with the kernel's own count
//! of this thread's read and write system calls (`/proc/thread-self/io`): a hit makes none,
//! the first use of a key reads the table's nodes on its path (internal nodes are kept) and
//! its entry, one `pread` each, a known miss with no lower tier makes none, and `put`,
//! `try_put` and `import` make none at all.

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
fn a_hit_does_no_io_and_a_first_use_reads_its_path_and_its_entry_once() {
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
        "in the file until used"
    );
    // 200 entries: a root over four leaves. The first lookup reads the root, the key's leaf
    // and its entry, each with one pread.
    let (reads, writes) = counted(|| {
        assert!(cache.get(ns(), &fp).is_some());
    });
    assert_eq!((reads, writes), (3, 0), "the root, the leaf, the entry");
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
    // Another key: the root is kept decoded, so its leaf and its entry.
    let (reads, _) = counted(|| {
        assert!(cache.get(ns(), &key(1, 150).fingerprint()).is_some());
    });
    assert_eq!(reads, 2, "the leaf and the entry");
    // A key the file lacks: its leaf once, then memory remembers it is absent.
    let absent = key(9, 9).fingerprint();
    assert!(matches!(
        cache.get_in_memory(ns(), &absent),
        MemoryLookup::NeedsIo
    ));
    let (reads, writes) = counted(|| {
        assert!(cache.get(ns(), &absent).is_none());
    });
    assert_eq!((reads, writes), (1, 0), "the leaf where it would be");
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
        "a known miss with no tier to ask is memory only"
    );
}

/// `put`, `try_put` and `import` never wait on file I/O (ARCHITECTURE.md, "The I/O promise"):
/// not for a key the file holds and memory does not (the file is not read to merge: the
/// journal record the saver writes is merged by every reader), not for a new one.
#[test]
fn put_try_put_and_import_make_no_system_call_on_the_callers_thread() {
    if calls().is_none() {
        test_support::skip::missing(
            "/proc/thread-self/io",
            "the kernel does not count I/O per thread",
        );
        return;
    }
    let dir = temp_dir();
    let cache = reopened(&dir);
    let (reads, writes) = counted(|| {
        // Keys the file holds (not yet read) and new ones.
        for id in 0..400 {
            cache.put(ns(), entry(2, id));
            let _ = cache.try_put(ns(), entry(1, id));
        }
        let mut data = cache_core::cache_format::CacheData::new();
        for id in 400..600 {
            data.insert(cache.scope(), ns().name(), entry(1, id));
        }
        let imported = cache.import(data);
        assert_eq!(imported.taken, 200);
    });
    assert_eq!(
        (reads, writes),
        (0, 0),
        "put, try_put and import stay in memory"
    );
    cache.flush().expect("flushed");
    // What was put merged with what the file had: key 7 has both measurements now.
    let e = cache.get(ns(), &key(1, 7).fingerprint()).expect("present");
    assert!(!e.candidates().is_empty());
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
