//! A cache opens its snapshot without decoding the entries of its own scope; each is read
//! back from the file on first use. What comes back is what a whole decode gives, and a file
//! changed under the open cache costs misses, never a panic or a wrong entry.

use cache_core::Store;
use cache_core::cache_format::{Entry, Fingerprint, Limits, raw::decode_snapshot, read_snapshot};

use crate::support::{
    builder, capture_logs, entry, has, key, ns, path_in, temp_dir, warnings_about,
};

/// Writes `n` entries of writer 1 as a snapshot (no journal).
fn snapshot_of(path: &std::path::Path, n: u64) {
    let cache = builder(path).compaction(0.0, 0).open();
    for id in 0..n {
        cache.put(ns(), entry(1, id));
    }
    cache.flush().expect("flush: a compaction (ratio 0)");
    drop(cache);
    assert!(
        !crate::support::path_in_journal(path).exists(),
        "everything is in the snapshot"
    );
}

/// Every entry of the file as a whole decode gives it, by fingerprint.
fn decoded(path: &std::path::Path) -> Vec<(Fingerprint, Entry)> {
    let bytes = std::fs::read(path).expect("read");
    let snap = read_snapshot(&bytes, &Limits::default()).expect("valid");
    decode_snapshot(&snap)
        .expect("decodes")
        .entries()
        .map(|(_, _, e)| (e.fingerprint(), e.clone()))
        .collect()
}

#[test]
fn entries_read_back_on_first_use_are_the_whole_decodes() {
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    snapshot_of(&path, 500);
    let want = decoded(&path);
    assert_eq!(want.len(), 500);
    let cache = builder(&path).open();
    assert_eq!(cache.len(), 500);
    // All of them at once (read without being kept), then one by one, twice.
    let mut all: Vec<(Fingerprint, Entry)> = cache
        .entries()
        .into_iter()
        .map(|(_, e)| (e.fingerprint(), Entry::clone(&e)))
        .collect();
    all.sort_by_key(|(fp, _)| *fp);
    let mut sorted = want.clone();
    sorted.sort_by_key(|(fp, _)| *fp);
    assert_eq!(all, sorted);
    for _ in 0..2 {
        for (fp, e) in &want {
            assert_eq!(cache.get(ns(), fp).as_deref(), Some(e));
        }
    }
    // A put merges into an entry still in the file.
    let mut newer = entry(1, 7);
    newer.record(cache_core::cache_format::Candidate::failed(
        "naive",
        Default::default(),
        "does not fit",
    ));
    cache.put(ns(), newer);
    let merged = cache.lookup(ns(), &key(1, 7)).expect("held");
    assert_eq!(merged.candidates().len(), 2, "{merged:?}");
    assert!(has(&cache, 1, 7));
}

#[test]
fn a_snapshot_cut_short_in_place_makes_misses_with_a_warning() {
    capture_logs();
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    snapshot_of(&path, 400);
    let cache = builder(&path).read_only(true).open();
    assert_eq!(cache.len(), 400);
    // Someone else shortens the file in place (tunecache never does: it renames).
    let len = std::fs::metadata(&path).expect("stat").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open for writing")
        .set_len(len / 2)
        .expect("truncate");
    let found: Vec<bool> = (0..400).map(|id| has(&cache, 1, id)).collect();
    let (kept, lost) = (
        found.iter().filter(|f| **f).count(),
        found.iter().filter(|f| !**f).count(),
    );
    assert!(kept > 0 && lost > 0, "kept {kept}, lost {lost}");
    let warned = warnings_about(&path.display().to_string());
    assert!(
        warned.iter().any(|w| w.contains("changed in place")),
        "{warned:?}"
    );
    // A miss is measured again: the new result is held.
    let missing = found.iter().position(|f| !*f).expect("one lost") as u64;
    cache.put(ns(), entry(1, missing));
    assert!(has(&cache, 1, missing));
}

#[test]
fn entries_stay_readable_after_another_writer_replaces_the_file() {
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    snapshot_of(&path, 300);
    let reader = builder(&path).read_only(true).open();
    // Another writer rewrites the snapshot (rename over it) several times, without the
    // reader's entries; then a file of other entries is renamed over it.
    let writer = builder(&path).compaction(0.0, 0).open();
    for id in 0..3 {
        writer.put(ns(), entry(2, id));
        writer.flush().expect("a compaction each time");
    }
    drop(writer);
    let other = path_in(&dir, "other.tcache");
    snapshot_of(&other, 0);
    let elsewhere = builder(&other).open();
    elsewhere.put(ns(), entry(3, 1));
    elsewhere.close().expect("close");
    std::fs::rename(&other, &path).expect("rename over");
    for id in 0..300 {
        assert!(has(&reader, 1, id), "entry {id}");
    }
}

/// A snapshot grown in place by someone else (here by 1 TiB, sparse) after the cache opened
/// it: reading many stored entries at once reads up to the last of them, not the file's new
/// length (which would try to allocate, and read, all of it).
#[test]
fn a_snapshot_grown_in_place_is_read_only_as_far_as_its_entries() {
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    snapshot_of(&path, 300);
    let want = decoded(&path);
    let cache = builder(&path).refresh_interval(None).open();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open");
    let len = file.metadata().expect("stat").len();
    file.set_len(len + (1 << 40)).expect("grow, sparse");
    let started = std::time::Instant::now();
    let mut all: Vec<Fingerprint> = cache
        .entries()
        .into_iter()
        .map(|(_, e)| e.fingerprint())
        .collect();
    all.sort();
    let mut expected: Vec<Fingerprint> = want.iter().map(|(fp, _)| *fp).collect();
    expected.sort();
    assert_eq!(all, expected, "every entry still reads back");
    eprintln!("300 entries read back in {:?}", started.elapsed());
    file.set_len(len).expect("shrink back");
}

/// A snapshot whose payload another writer encoded with its structs as arrays (by position,
/// which every reader accepts): the one-pass walk of open does not take that form, so the
/// file must be checked and decoded the general way, and open as a good file.
#[test]
fn a_payload_in_another_writers_struct_form_opens_whole() {
    use cache_core::cache_format::rmpv::{self, Value as Raw};
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    snapshot_of(&path, 50);
    let want = decoded(&path);
    let bytes = std::fs::read(&path).expect("read");
    let snap = read_snapshot(&bytes, &Limits::default()).expect("valid");
    let payload = snap.payload_bytes();
    let at = payload.as_ptr() as usize - bytes.as_ptr() as usize;
    let mut value = rmpv::decode::read_value(&mut &payload[..]).expect("msgpack");
    // {"scopes": [{"scope": .., "namespaces": ..}]} → [[[scope, namespaces]]]
    let positional = |map: Raw, order: &[&str]| -> Raw {
        let Raw::Map(fields) = map else {
            panic!("a map")
        };
        Raw::Array(
            order
                .iter()
                .map(|name| {
                    fields
                        .iter()
                        .find(|(k, _)| k.as_str() == Some(name))
                        .map(|(_, v)| v.clone())
                        .expect("the field")
                })
                .collect(),
        )
    };
    value = positional(value, &["scopes"]);
    if let Raw::Array(top) = &mut value
        && let Some(Raw::Array(scopes)) = top.first_mut()
    {
        for scope in scopes.iter_mut() {
            *scope = positional(scope.clone(), &["scope", "namespaces"]);
        }
    }
    let mut new_payload = Vec::new();
    rmpv::encode::write_value(&mut new_payload, &value).expect("encode");
    // The same envelope around it: the prefix up to the payload's `bin 32` header, then the
    // new payload framed with its length and CRC.
    let mut file = bytes[..at - 5].to_vec();
    file.push(0xc6);
    file.extend_from_slice(&(new_payload.len() as u32).to_be_bytes());
    file.extend_from_slice(&new_payload);
    file.push(0xce);
    file.extend_from_slice(&crc32fast::hash(&new_payload).to_be_bytes());
    std::fs::write(&path, &file).expect("write");
    let cache = builder(&path).refresh_interval(None).open();
    assert!(
        cache.health().quarantined.is_empty(),
        "{:?}",
        cache.health()
    );
    assert_eq!(cache.len(), 50);
    for (fp, e) in &want {
        assert_eq!(cache.get(ns(), fp).as_deref(), Some(e));
    }
}
