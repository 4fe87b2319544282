//! `append_to_file`: one record appended under the lock without loading the cache; anything
//! that needs more is left to a `Cache`, with nothing written.

use cache_core::cache_format::{
    Candidate, Entry, Fields, Fingerprint, Limits, Scope, Stats, Value, read_journal_header,
    scan_records,
};
use cache_core::cache_migrate::{Migrations, Step};
use cache_core::{AppendOptions, Appended, Store, StoreError, append_to_file};

use crate::support::{APP, builder, entry, has, ids_on_disk, key, ns, path_in, registry, temp_dir};

fn records(path: &std::path::Path) -> usize {
    let Ok(bytes) = std::fs::read(path) else {
        return 0;
    };
    let limits = Limits::default();
    let (_, _, start) = read_journal_header(&bytes, &limits).expect("journal header");
    scan_records(&bytes, start, &limits).records.len()
}

fn append(path: &std::path::Path, ids: std::ops::Range<u64>) -> Result<Appended, StoreError> {
    let entries = ids.map(|i| (ns(), entry(7, i))).collect();
    append_to_file(
        path,
        &registry(1),
        &Scope::default(),
        entries,
        &AppendOptions::default(),
    )
}

#[test]
fn an_append_adds_one_record_and_merges_on_read() {
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    {
        let cache = builder(&path).open();
        for i in 0..50 {
            cache.put(ns(), entry(1, i));
        }
        cache.flush().expect("saved");
    }
    let snapshot = std::fs::read(&path).expect("snapshot");
    assert_eq!(append(&path, 0..3).expect("append"), Appended::Done);
    assert_eq!(append(&path, 3..4).expect("append"), Appended::Done);
    let journal = path_in(&dir, "c.tcache.journal");
    assert_eq!(records(&journal), 2, "one record per append");
    assert_eq!(
        std::fs::read(&path).expect("snapshot"),
        snapshot,
        "snapshot untouched"
    );
    assert_eq!(ids_on_disk(&path, 7, 4), [0, 1, 2, 3]);
    assert_eq!(ids_on_disk(&path, 1, 50).len(), 50);
}

/// A running cache in another "process" sees what was appended at its next refresh, and its
/// own later saves keep it.
#[test]
fn a_running_cache_reads_what_was_appended() {
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let cache = builder(&path).open();
    cache.put(ns(), entry(1, 1));
    cache.flush().expect("saved");
    assert_eq!(append(&path, 0..1).expect("append"), Appended::Done);
    cache.refresh().expect("refresh");
    assert!(has(&cache, 7, 0));
    cache.put(ns(), entry(1, 2));
    cache.flush().expect("saved");
    drop(cache);
    assert_eq!(ids_on_disk(&path, 7, 1), [0]);
    assert_eq!(ids_on_disk(&path, 1, 3), [1, 2]);
}

/// What needs more than an append is left alone, with the reason: no file, an older schema,
/// a torn or stale journal. Nothing is written.
#[test]
fn anything_but_a_plain_append_is_left_to_a_cache() {
    let dir = temp_dir();
    let missing = path_in(&dir, "missing.tcache");
    assert!(matches!(
        append(&missing, 0..1),
        Ok(Appended::NeedsCache { .. })
    ));
    assert!(!missing.exists() && !path_in(&dir, "missing.tcache.lock").exists());

    let path = path_in(&dir, "c.tcache");
    {
        let cache = builder(&path).open();
        cache.put(ns(), entry(1, 1));
        cache.flush().expect("snapshot");
        cache.put(ns(), entry(1, 2));
        cache.flush().expect("journal");
    }
    let journal = path_in(&dir, "c.tcache.journal");
    // An older file for this registry: migrating is a Cache's job.
    let newer = Migrations::new(APP, 2)
        .with(Step::declarative(1, 2, "nothing", vec![]))
        .expect("registry");
    let before = (std::fs::read(&path).ok(), std::fs::read(&journal).ok());
    let r = append_to_file(
        &path,
        &newer,
        &Scope::default(),
        vec![(ns(), entry(7, 0))],
        &AppendOptions::default(),
    );
    assert!(matches!(r, Ok(Appended::NeedsCache { .. })), "{r:?}");
    // A torn tail: repairing it is a Cache's job.
    let mut torn = std::fs::read(&journal).expect("journal");
    torn.extend_from_slice(&[0x92, 0xc6, 0, 0]);
    std::fs::write(&journal, &torn).expect("tear");
    let r = append(&path, 0..1);
    assert!(matches!(r, Ok(Appended::NeedsCache { .. })), "{r:?}");
    assert_eq!(
        std::fs::read(&journal).expect("journal"),
        torn,
        "left as it was"
    );
    assert_eq!(std::fs::read(&path).ok(), before.0);
    // The Cache path then repairs and records.
    let cache = builder(&path).open();
    cache.put(ns(), entry(7, 0));
    cache.flush().expect("saved");
    drop(cache);
    assert_eq!(append(&path, 1..2).expect("append"), Appended::Done);
    assert_eq!(ids_on_disk(&path, 7, 2), [0, 1]);
    assert_eq!(ids_on_disk(&path, 1, 3), [1, 2]);
}

/// An entry no reader could read is refused, naming the field, and nothing is written.
#[test]
fn an_append_refuses_what_no_reader_could_read() {
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    {
        let cache = builder(&path).open();
        cache.put(ns(), entry(1, 1));
        cache.flush().expect("saved");
    }
    let mut deep = Value::Int(1);
    for _ in 0..30 {
        deep = Value::List(vec![deep]);
    }
    let stats = Stats {
        median_ns: 1.0,
        min_ns: 1.0,
        spread_ns: 0.0,
        samples: 1,
    };
    let bad = Entry::new(
        key(7, 0),
        Fingerprint::default(),
        cache_core::measured_here(),
        1,
        [Candidate::measured(
            "tiled",
            Fields::from([("p".to_owned(), deep)]),
            stats,
        )],
    );
    let r = append_to_file(
        &path,
        &registry(1),
        &Scope::default(),
        vec![(ns(), entry(7, 1)), (ns(), bad)],
        &AppendOptions::default(),
    );
    match r {
        Err(StoreError::Refused { reason, .. }) => {
            assert!(reason.to_string().contains("\"p\""), "{reason}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(
        !path_in(&dir, "c.tcache.journal").exists(),
        "nothing written"
    );
}

/// Inspection walks the snapshot entry by entry with the journal merged in: a key the journal
/// updates appears once, merged; a key only the journal has is counted and listed; `find`
/// decodes only the key asked for.
#[test]
fn inspection_streams_the_snapshot_with_the_journal_merged_in() {
    use std::ops::ControlFlow;
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    {
        let cache = builder(&path).open();
        for i in 0..10 {
            cache.put(ns(), entry(1, i));
        }
        cache.flush().expect("snapshot");
    }
    // Key 3 gets a second candidate, key 20 is new: both in the journal.
    let mut update = entry(1, 3);
    let stats = Stats {
        median_ns: 1.0,
        min_ns: 1.0,
        spread_ns: 0.0,
        samples: 1,
    };
    update.merge(Entry::new(
        key(1, 3),
        Fingerprint::default(),
        cache_core::measured_here(),
        1,
        [Candidate::measured("other", Fields::new(), stats)],
    ));
    let r = append_to_file(
        &path,
        &registry(1),
        &Scope::default(),
        vec![(ns(), update), (ns(), entry(1, 20))],
        &AppendOptions::default(),
    );
    assert_eq!(r.expect("append"), Appended::Done);
    let found = cache_core::inspect(&path, &Limits::default(), None).expect("inspect");
    let (counts, broken) = found.counts();
    assert!(broken.is_none(), "{broken:?}");
    assert_eq!(counts[&Scope::default()]["matmul"], 11);
    let mut seen = Vec::new();
    let problems = found.for_each_entry(|_, _, e| {
        seen.push((e.fingerprint(), e.candidates().len()));
        ControlFlow::Continue(())
    });
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(seen.len(), 11);
    assert!(
        seen.contains(&(key(1, 3).fingerprint(), 2)),
        "merged: {seen:?}"
    );
    assert!(seen.contains(&(key(1, 20).fingerprint(), 1)));
    let hit = found.find("matmul", &key(1, 3).fingerprint());
    assert_eq!(hit.len(), 1);
    assert_eq!(hit[0].1.candidates().len(), 2);
    let (entries, problems) = found.check_entries();
    assert_eq!((entries, problems.len()), (11, 0), "{problems:?}");
    // Walking stops when asked to.
    let mut first = 0;
    found.for_each_entry(|_, _, _| {
        first += 1;
        ControlFlow::Break(())
    });
    assert_eq!(first, 1);
}

/// `merge_into_file` (what `tunecache import` uses): one read and one write under the lock;
/// a new file gets a snapshot, a small import into a larger cache one journal record, every
/// scope is kept, entries merge with what is stored, and a bad entry writes nothing.
#[test]
fn merging_into_a_file_reads_once_and_writes_once() {
    use cache_core::cache_format::CacheData;
    use cache_core::merge_into_file;
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let other = Scope::new(Fields::from([("device".to_owned(), Value::from("B"))]));
    let mut data = CacheData::new();
    for i in 0..5000 {
        data.insert(&Scope::default(), "matmul", entry(1, i));
    }
    data.insert(&other, "matmul", entry(2, 0));
    let options = AppendOptions::default();
    assert_eq!(
        merge_into_file(&path, &registry(1), data, &options).expect("merged"),
        5001
    );
    assert!(
        !path_in(&dir, "c.tcache.journal").exists(),
        "a new file is a snapshot"
    );
    // A small import into it: one journal record.
    let mut more = CacheData::new();
    more.insert(&Scope::default(), "matmul", entry(3, 0));
    more.insert(&Scope::default(), "matmul", entry(1, 7));
    merge_into_file(&path, &registry(1), more, &options).expect("merged");
    assert_eq!(records(&path_in(&dir, "c.tcache.journal")), 1);
    assert_eq!(ids_on_disk(&path, 1, 5000).len(), 5000);
    assert_eq!(ids_on_disk(&path, 3, 1), [0]);
    let found = cache_core::inspect(&path, &Limits::default(), None).expect("inspect");
    assert!(
        found
            .find("matmul", &key(2, 0).fingerprint())
            .iter()
            .any(|(s, _)| *s == other),
        "the other scope is kept"
    );
    // `holds` answers as `find` does, per scope, without reading entries: the table's index
    // and the journal's records.
    let (here, there) = (Scope::default().fingerprint(), other.fingerprint());
    assert!(found.holds(&there, "matmul", &key(2, 0).fingerprint()));
    assert!(!found.holds(&here, "matmul", &key(2, 0).fingerprint()));
    assert!(found.holds(&here, "matmul", &key(1, 4999).fingerprint()));
    assert!(
        found.holds(&here, "matmul", &key(3, 0).fingerprint()),
        "journal"
    );
    assert!(!found.holds(&there, "matmul", &key(3, 0).fingerprint()));
    assert!(!found.holds(&here, "conv", &key(1, 0).fingerprint()));
    // A bad entry: refused, nothing written.
    let before = std::fs::read(path_in(&dir, "c.tcache.journal")).expect("journal");
    let mut bad = CacheData::new();
    let mut nan = entry(4, 0);
    nan = Entry::new(
        nan.key().clone(),
        Fingerprint::default(),
        cache_core::measured_here(),
        1,
        [Candidate::measured(
            "x",
            Fields::new(),
            Stats {
                median_ns: f64::NAN,
                min_ns: 1.0,
                spread_ns: 0.0,
                samples: 1,
            },
        )],
    );
    bad.insert(&Scope::default(), "matmul", entry(4, 1));
    bad.insert(&Scope::default(), "matmul", nan);
    let r = merge_into_file(&path, &registry(1), bad, &options);
    assert!(matches!(r, Err(StoreError::Refused { .. })), "{r:?}");
    assert_eq!(
        std::fs::read(path_in(&dir, "c.tcache.journal")).expect("journal"),
        before
    );
}
