//! Recording, reading back, scopes, the journal, compaction.

use std::time::Duration;

use cache_core::{Mode, Namespace, Store};

use crate::support::{
    builder, entry, has, ids_on_disk, key, ns, path_in, scope, temp_dir, wait_until,
};

#[test]
fn results_survive_a_reopen() {
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let cache = builder(&path).open();
    assert_eq!(cache.health().mode, Mode::Persistent);
    for i in 0..100 {
        cache.put(ns(), entry(1, i));
    }
    cache.flush().expect("flush");
    drop(cache);
    assert_eq!(ids_on_disk(&path, 1, 100).len(), 100);
}

#[test]
fn a_result_becomes_durable_without_an_explicit_flush() {
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let cache = builder(&path).save_delay(Duration::from_millis(250)).open();
    cache.put(ns(), entry(1, 7));
    // No flush: the background saver must write it on its own.
    assert!(wait_until(Duration::from_secs(20), || ids_on_disk(
        &path, 1, 8
    ) == [7]));
    drop(cache);
}

#[test]
fn a_hit_returns_the_recorded_ranking_and_a_miss_is_none() {
    let dir = temp_dir();
    let cache = builder(&path_in(&dir, "c.tcache")).open();
    assert!(cache.lookup(ns(), &key(1, 1)).is_none());
    cache.put(ns(), entry(1, 1));
    let hit = cache.get(ns(), &key(1, 1).fingerprint()).expect("hit");
    assert_eq!(hit.best().map(|c| c.id.algorithm.as_str()), Some("tiled"));
    let other = Namespace::new("conv_fwd").expect("valid");
    assert!(
        cache.lookup(other, &key(1, 1)).is_none(),
        "namespaces are separate"
    );
}

/// A result recorded again for the same candidate replaces the earlier one when measured
/// later; of two measured in the same millisecond the lower median stays, whichever came last
/// (the merge rule: the file is the merge of every put, whatever their order); one measured
/// before the result held loses the merge, and that is said.
#[test]
fn a_result_recorded_again_replaces_the_earlier_one_by_the_merge_rule() {
    crate::support::capture_logs();
    let dir = temp_dir();
    let cache = builder(&path_in(&dir, "c.tcache")).open();
    let at = |median: f64, measured_at: u64| {
        let (k, set, origin, recorded_at, mut candidates) = entry(1, 1).into_parts();
        for c in &mut candidates {
            c.measured_at = measured_at;
            if let cache_core::cache_format::Outcome::Measured(s) = &mut c.outcome {
                s.median_ns = median;
            }
        }
        cache_core::cache_format::Entry::new(k, set, origin, recorded_at, candidates)
    };
    let median = |cache: &cache_core::Cache| {
        let hit = cache.lookup(ns(), &key(1, 1)).expect("hit");
        hit.best().and_then(|c| c.stats()).map(|s| s.median_ns)
    };
    for (m, t, want) in [
        (1000.0, 1_000, 1000.0),
        (2000.0, 1_001, 2000.0),
        (1500.0, 1_001, 1500.0),
    ] {
        cache.put(ns(), at(m, t));
        assert_eq!(median(&cache), Some(want));
    }
    cache.put(ns(), at(1800.0, 1_001));
    assert_eq!(
        median(&cache),
        Some(1500.0),
        "the same millisecond: the lower median"
    );
    assert!(crate::support::warnings_about("was not kept").is_empty());
    cache.put(ns(), at(500.0, 1_000));
    assert_eq!(median(&cache), Some(1500.0));
    assert!(!crate::support::warnings_about("was not kept").is_empty());
}

#[test]
fn scopes_are_separate_and_all_survive_compaction() {
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let h100 = builder(&path)
        .scope(scope("H100"))
        .compaction(0.0, 0)
        .open();
    h100.put(ns(), entry(1, 1));
    h100.flush().expect("flush");
    drop(h100);
    let a100 = builder(&path)
        .scope(scope("A100"))
        .compaction(0.0, 0)
        .open();
    assert!(!has(&a100, 1, 1), "another scope's result is not used");
    a100.put(ns(), entry(1, 2));
    a100.flush().expect("flush (a compaction: ratio 0)");
    drop(a100);
    let h100 = builder(&path).scope(scope("H100")).open();
    assert!(
        has(&h100, 1, 1) && !has(&h100, 1, 2),
        "the H100 entry survived the A100 compaction"
    );
}

#[test]
fn recording_into_a_large_cache_appends_instead_of_rewriting() {
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let journal = path_in(&dir, "c.tcache.journal");
    let cache = builder(&path).compaction(0.0, 0).open();
    for i in 0..2000 {
        cache.put(ns(), entry(1, i));
    }
    cache.flush().expect("flush");
    drop(cache);
    let snapshot_before = std::fs::read(&path).expect("snapshot");
    assert!(!journal.exists(), "the first save wrote a snapshot");

    let cache = builder(&path).open();
    cache.put(ns(), entry(1, 5000));
    cache.flush().expect("flush");
    assert_eq!(
        std::fs::read(&path).expect("snapshot"),
        snapshot_before,
        "the snapshot was not rewritten"
    );
    let journal_len = std::fs::metadata(&journal).expect("journal").len();
    assert!(
        journal_len < 1024,
        "one small record appended ({journal_len} bytes), not the cache"
    );
    drop(cache);
    assert_eq!(ids_on_disk(&path, 1, 5001).len(), 2001);
}

#[test]
fn a_growing_journal_is_compacted_into_the_snapshot() {
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let journal = path_in(&dir, "c.tcache.journal");
    let cache = builder(&path).compaction(0.5, 4096).open();
    let mut compacted = false;
    for round in 0..40 {
        for i in 0..20 {
            cache.put(ns(), entry(1, round * 20 + i));
        }
        cache.flush().expect("flush");
        if round > 0 && !journal.exists() {
            compacted = true;
        }
    }
    assert!(
        compacted,
        "the journal was folded into the snapshot at least once"
    );
    drop(cache);
    assert_eq!(ids_on_disk(&path, 1, 800).len(), 800);
}

#[test]
fn another_process_results_arrive_by_refresh() {
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let reader = builder(&path)
        .refresh_interval(Some(Duration::from_millis(50)))
        .open();
    let writer = builder(&path).open();
    writer.put(ns(), entry(3, 3));
    writer.flush().expect("flush");
    assert!(wait_until(Duration::from_secs(10), || has(&reader, 3, 3)));
}

#[test]
fn bad_namespace_names_are_refused() {
    assert!(Namespace::new("").is_err());
    assert!(Namespace::new(&"x".repeat(513)).is_err());
    assert!(
        Namespace::new(&"x".repeat(512)).is_ok(),
        "real kernel names fit"
    );
    assert!(Namespace::new("a\nb").is_err());
    assert_eq!(
        Namespace::new("conv_fwd").expect("ok"),
        Namespace::new("conv_fwd").expect("ok")
    );
}

#[test]
fn refresh_reads_other_processes_results_at_once() {
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let reader = builder(&path).open(); // no periodic refresh in tests
    let writer = builder(&path).open();
    writer.put(ns(), entry(4, 4));
    writer.flush().expect("flush");
    assert!(!has(&reader, 4, 4));
    reader.refresh().expect("refresh");
    assert!(has(&reader, 4, 4));
}

#[test]
fn entries_of_other_scopes_are_available_for_warm_starts() {
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let old_driver = builder(&path).scope(scope("H100 driver 550")).open();
    old_driver.put(ns(), entry(1, 1));
    old_driver.flush().expect("flush");
    drop(old_driver);
    let new_driver = builder(&path).scope(scope("H100 driver 560")).open();
    assert!(!has(&new_driver, 1, 1), "not a hit in the new scope");
    let prior = new_driver.lookup_other_scopes(ns(), &key(1, 1).fingerprint());
    assert_eq!(prior.len(), 1);
    assert_eq!(prior[0].0, scope("H100 driver 550"));
}

/// A cache opened through a symbolic link and the same cache opened through its target are one
/// cache: one lock, one journal, no acknowledged result lost to a compaction made through the
/// other path, and the link is still a link afterwards.
#[test]
fn a_symlinked_cache_and_its_target_are_one_cache_and_the_link_survives() {
    let dir = temp_dir();
    let target = path_in(&dir, "real.tcache");
    let link = path_in(&dir, "link.tcache");
    std::os::unix::fs::symlink("real.tcache", &link).expect("symlink");
    // Every save through the target compacts; saves through the link append.
    let via_target = builder(&target).compaction(0.0, 0).open();
    let via_link = builder(&link).open();
    for round in 0..3 {
        via_link.put(ns(), entry(1, round));
        via_link.flush().expect("saved through the link");
        via_target.put(ns(), entry(2, round));
        via_target.flush().expect("saved through the target");
    }
    drop(via_link);
    drop(via_target);
    assert!(
        std::fs::symlink_metadata(&link)
            .expect("link")
            .file_type()
            .is_symlink(),
        "the link was replaced by a file"
    );
    for sibling in ["link.tcache.journal", "link.tcache.lock"] {
        assert!(
            !path_in(&dir, sibling).exists(),
            "{sibling} was created beside the link"
        );
    }
    for path in [&link, &target] {
        assert_eq!(
            ids_on_disk(path, 1, 3),
            [0, 1, 2],
            "through {}",
            path.display()
        );
        assert_eq!(
            ids_on_disk(path, 2, 3),
            [0, 1, 2],
            "through {}",
            path.display()
        );
    }
}

/// A result stamped in the future (by a machine whose clock is wrong) cannot pin an entry for
/// good: timestamps are set to the present when they come in, so the next measurement of the
/// same candidate replaces it, through a file or a put; one warning says so.
#[test]
fn a_timestamp_from_the_future_cannot_pin_a_result() {
    use cache_core::cache_format::{
        CacheData, Candidate, Entry, Fields, Fingerprint, Origin, Scope, Stats, Value,
        encode_snapshot, now_millis,
    };
    crate::support::capture_logs();
    let candidate = |median: f64, at: u64| {
        let stats = Stats {
            median_ns: median,
            min_ns: median,
            spread_ns: 0.0,
            samples: 5,
        };
        let mut c = Candidate::measured(
            "tiled",
            Fields::from([("tile".to_owned(), Value::Int(8))]),
            stats,
        );
        c.measured_at = at;
        c
    };
    let future = now_millis() + 10 * 365 * 24 * 3600 * 1000;
    let dir = temp_dir();
    for through_file in [true, false] {
        let path = path_in(&dir, &format!("future-{through_file}.tcache"));
        let k = key(7, through_file as u64);
        let stale = Entry::new(
            k.clone(),
            Fingerprint::default(),
            Origin::Imported("skewed".into()),
            future,
            [candidate(9000.0, future)],
        );
        let cache = if through_file {
            let mut data = CacheData::new();
            data.insert(&Scope::default(), "matmul", stale);
            std::fs::write(&path, encode_snapshot(crate::support::APP, 1, &data)).expect("write");
            builder(&path).open()
        } else {
            let cache = builder(&path).open();
            cache.put(ns(), stale);
            cache
        };
        let fresh = Entry::new(
            k.clone(),
            Fingerprint::default(),
            cache_core::measured_here(),
            now_millis() + 120_000,
            [candidate(10.0, now_millis() + 120_000)],
        );
        cache.put(ns(), fresh);
        let best = cache
            .lookup(ns(), &k)
            .and_then(|e| e.best().and_then(|c| c.stats().map(|s| s.median_ns)));
        assert_eq!(
            best,
            Some(10.0),
            "through_file={through_file}: the later measurement is kept"
        );
        cache.flush().expect("saved");
    }
    let warned = crate::support::warnings_about("in the future (a wrong clock");
    assert!(!warned.is_empty(), "a warning says so");
}

/// A cache file replaced under a running process (an old copy restored, another tool's
/// rename): the process writes back the acknowledged results it holds that the new file lacks.
#[test]
fn results_acknowledged_before_a_file_was_replaced_are_written_back() {
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let cache = builder(&path).open();
    for i in 0..5 {
        cache.put(ns(), entry(1, i));
    }
    cache.flush().expect("saved");
    let old_copy = path_in(&dir, "old.tcache");
    std::fs::copy(&path, &old_copy).expect("copy");
    for i in 5..10 {
        cache.put(ns(), entry(1, i));
    }
    cache.flush().expect("saved");
    // Someone restores the old copy: a new file at the path, without results 5..10 (and
    // without the journal that held them).
    std::fs::rename(&old_copy, &path).expect("restore the old copy");
    let _ = std::fs::remove_file(path_in(&dir, "c.tcache.journal"));
    cache.put(ns(), entry(1, 10));
    cache.flush().expect("saved");
    cache.flush().expect("and the write-back saved too");
    assert_eq!(ids_on_disk(&path, 1, 11), (0..11).collect::<Vec<_>>());
}

#[test]
fn a_compaction_applies_the_retention_limits() {
    use cache_core::cache_format::{Candidate, Entry, Fingerprint, Stats, now_millis};
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let now = now_millis();
    let aged = |id: u64, at: u64| {
        let stats = Stats {
            median_ns: 10.0,
            min_ns: 9.0,
            spread_ns: 1.0,
            samples: 3,
        };
        let mut c = Candidate::measured("tiled", Default::default(), stats);
        c.measured_at = at;
        Entry::new(
            key(1, id),
            Fingerprint::default(),
            cache_core::measured_here(),
            at,
            [c],
        )
    };
    // By age: every save compacts (ratio 0); entries older than a day go.
    let cache = builder(&path)
        .compaction(0.0, 0)
        .retention(None, Some(Duration::from_secs(86_400)))
        .open();
    for id in 0..10 {
        cache.put(ns(), aged(id, if id < 4 { 1_000 } else { now - id }));
    }
    cache.flush().expect("flush");
    drop(cache);
    let reopened = builder(&path).open();
    let present: Vec<u64> = (0..10)
        .filter(|i| reopened.lookup(ns(), &key(1, *i)).is_some())
        .collect();
    assert_eq!(present, (4..10).collect::<Vec<_>>());
    drop(reopened);
    // By size: the most recently recorded are kept, the file under the limit.
    let path = path_in(&dir, "s.tcache");
    let cache = builder(&path).compaction(0.0, 0).open();
    for id in 0..200 {
        cache.put(ns(), aged(id, now - 10_000 + id));
    }
    cache.flush().expect("flush");
    drop(cache);
    let full = std::fs::metadata(&path).expect("file").len();
    let limit = full / 2;
    let cache = builder(&path)
        .compaction(0.0, 0)
        .retention(Some(limit), None)
        .open();
    cache.put(ns(), aged(500, now));
    cache.flush().expect("flush");
    drop(cache);
    assert!(std::fs::metadata(&path).expect("file").len() <= limit);
    let reopened = builder(&path).open();
    assert!(
        reopened.lookup(ns(), &key(1, 500)).is_some(),
        "the newest stays"
    );
    assert!(reopened.lookup(ns(), &key(1, 199)).is_some());
    assert!(
        reopened.lookup(ns(), &key(1, 0)).is_none(),
        "the oldest went"
    );
}
