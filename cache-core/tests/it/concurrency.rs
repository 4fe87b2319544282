//! Concurrent writers, threads and processes: nothing recorded and flushed is lost.

use std::sync::Arc;

use cache_core::Store;

use crate::support::{
    builder, child_lines, entry, has, ids_on_disk, ns, path_in, spawn_child, temp_dir,
};

#[test]
fn sixteen_processes_recording_a_thousand_results_each_lose_none() {
    const WRITERS: u64 = 16;
    const EACH: u64 = 1000;
    let dir = temp_dir();
    let path = path_in(&dir, "shared.tcache");
    let mut children: Vec<_> = (0..WRITERS)
        .map(|w| {
            spawn_child(
                "writer",
                &path,
                &[w.to_string(), EACH.to_string(), "100".into()],
                &[],
            )
        })
        .collect();
    for (w, child) in children.iter_mut().enumerate() {
        let lines = child_lines(child);
        let status = child.wait().expect("wait for writer");
        assert!(status.success(), "writer {w} failed: {status}");
        assert!(
            lines.iter().any(|l| l == "done"),
            "writer {w} did not finish: {lines:?}"
        );
    }
    let cache = builder(&path).open();
    let mut missing = Vec::new();
    for w in 0..WRITERS {
        for i in 0..EACH {
            if !has(&cache, w, i) {
                missing.push((w, i));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "{} of 16000 results lost, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    assert_eq!(cache.len() as u64, WRITERS * EACH);
}

#[test]
fn threads_recording_and_reading_at_once_lose_nothing() {
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let cache = Arc::new(builder(&path).open());
    let handles: Vec<_> = (0..8u64)
        .map(|t| {
            let cache = Arc::clone(&cache);
            std::thread::spawn(move || {
                for i in 0..500 {
                    cache.put(ns(), entry(t, i));
                    assert!(has(&cache, t, i), "a thread reads its own write");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread");
    }
    cache.flush().expect("flush");
    drop(cache);
    let reopened = builder(&path).open();
    assert_eq!(reopened.len(), 8 * 500);
}

#[test]
fn two_caches_on_one_file_in_one_process_exclude_each_other() {
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let a = builder(&path).compaction(0.1, 1024).open();
    let b = builder(&path).compaction(0.1, 1024).open();
    for i in 0..300 {
        a.put(ns(), entry(1, i));
        b.put(ns(), entry(2, i));
        if i % 50 == 0 {
            a.flush().expect("flush a");
            b.flush().expect("flush b");
        }
    }
    a.flush().expect("flush a");
    b.flush().expect("flush b");
    drop((a, b));
    assert_eq!(ids_on_disk(&path, 1, 300).len(), 300);
    assert_eq!(ids_on_disk(&path, 2, 300).len(), 300);
}
