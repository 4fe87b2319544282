//! What saves leave in the file: the merge of everything every put recorded, whatever the
//! order of puts, saves and lookups across threads.

use std::collections::HashMap;
use std::sync::Arc;

use cache_core::cache_format::{Candidate, Entry, Fields, Fingerprint, Origin, Stats, Value};
use cache_core::{Cache, Store};

use crate::support::{builder, key, ns, path_in, temp_dir};

fn measured(tile: i64, median: f64, at: u64) -> Candidate {
    let mut c = Candidate::measured(
        "tiled",
        Fields::from([("tile".to_owned(), Value::Int(tile))]),
        Stats {
            median_ns: median,
            min_ns: median / 2.0,
            spread_ns: 1.0,
            samples: 5,
        },
    );
    c.measured_at = at;
    c
}

fn entry_of(id: u64, candidates: impl IntoIterator<Item = Candidate>, at: u64) -> Entry {
    Entry::new(
        key(1, id),
        Fingerprint::default(),
        Origin::Measured("deltas".into()),
        at,
        candidates,
    )
}

/// Puts from several threads, with saves and lookups between them: the file, read by a new
/// cache, holds the merge of every put, as a plain map merging the same entries does.
#[test]
fn the_file_agrees_with_a_model_under_concurrent_puts_gets_and_saves() {
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let cache = Arc::new(builder(&path).open());
    // In the past: a put clamps a time in the future to now, which the model would not.
    let base = cache_core::cache_format::now_millis() - 60_000;
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let cache = Arc::clone(&cache);
            std::thread::spawn(move || {
                let mut puts = Vec::new();
                let mut state = t.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                for i in 0..300u64 {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let id = state % 20;
                    let tile = ((state >> 8) % 12) as i64;
                    let at = base + i * 4 + t;
                    let e = entry_of(id, [measured(tile, (state >> 20) as f64 % 1e4, at)], at);
                    puts.push(e.clone());
                    cache.put(ns(), e);
                    if i % 37 == t {
                        cache.flush().expect("saved");
                    }
                    let _ = cache.lookup(ns(), &key(1, (state >> 5) % 20));
                }
                puts
            })
        })
        .collect();
    let mut model: HashMap<Fingerprint, Entry> = HashMap::new();
    for t in threads {
        for e in t.join().expect("thread") {
            model
                .entry(e.fingerprint())
                .and_modify(|m| m.merge(e.clone()))
                .or_insert(e);
        }
    }
    cache.flush().expect("saved");
    drop(cache);
    let reopened: Cache = builder(&path).open();
    assert_eq!(model.len(), 20);
    for (fp, want) in &model {
        let got = reopened.get(ns(), fp).expect("every key on disk");
        assert_eq!(got.candidates(), want.candidates(), "key {fp}");
        assert_eq!(got.recorded_at(), want.recorded_at(), "key {fp}");
    }
}
