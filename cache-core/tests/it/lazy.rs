//! A cache opens its table without reading its entries; each is read on first use (the nodes
//! on its key's path and the entry, each checked). What comes back is what a whole read
//! gives, a damaged entry is one miss with one warning, and a file changed under the open
//! cache costs misses, never a panic or a wrong entry.

use std::ops::ControlFlow;

use cache_core::Store;
use cache_core::cache_format::{Entry, Fingerprint, Limits};

use crate::support::{
    builder, capture_logs, entry, has, key, ns, path_in, temp_dir, warnings_about,
};

/// Writes `n` entries of writer 1 as a table (no journal).
fn table_of(path: &std::path::Path, n: u64) {
    let cache = builder(path).compaction(0.0, 0).open();
    for id in 0..n {
        cache.put(ns(), entry(1, id));
    }
    cache
        .flush()
        .expect("flush: a new table, or a fold (journal bound 0)");
    drop(cache);
    assert!(
        !crate::support::path_in_journal(path).exists(),
        "everything is in the table"
    );
}

/// Every entry of the file as a whole read (every block checked) gives it, by fingerprint.
fn decoded(path: &std::path::Path) -> Vec<(Fingerprint, Entry)> {
    let found = cache_core::inspect(path, &Limits::default(), None).expect("inspect");
    let mut out = Vec::new();
    let problems = found.for_each_entry(|_, _, e| {
        out.push((e.fingerprint(), e.clone()));
        ControlFlow::Continue(())
    });
    assert!(problems.is_empty(), "{problems:?}");
    out
}

#[test]
fn entries_read_back_on_first_use_are_the_whole_reads() {
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    table_of(&path, 500);
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
    // A put into a key the file holds and memory has not read: the put reads nothing; the
    // lookup joins both.
    let mut newer = entry(1, 400);
    newer.record(cache_core::cache_format::Candidate::failed(
        "naive",
        Default::default(),
        "does not fit",
    ));
    let fresh = builder(&path).open();
    fresh.put(ns(), newer);
    let merged = fresh.lookup(ns(), &key(1, 400)).expect("held");
    assert_eq!(merged.candidates().len(), 2, "{merged:?}");
    assert!(has(&fresh, 1, 400));
    fresh.close().expect("saved");
    // The file has both too.
    let again = builder(&path).open();
    let merged = again.lookup(ns(), &key(1, 400)).expect("on disk");
    assert_eq!(merged.candidates().len(), 2, "{merged:?}");
}

/// Issue 37: a single damaged entry in a large table is one miss with one warning naming the
/// file and the entry; every other entry is served, and `verify`'s check names it.
#[test]
fn a_damaged_entry_is_one_miss_with_one_warning_and_the_rest_is_served() {
    capture_logs();
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    table_of(&path, 3000);
    // Damage one entry's bytes in place (a flipped bit, as a failing disk leaves).
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .expect("open");
    let t = cache_core::cache_format::table::Table::open(
        std::fs::read(&path).expect("read"),
        &Limits::default(),
    )
    .expect("a table");
    let victim = key(1, 1234).fingerprint();
    let tkey = cache_core::cache_format::table::TKey::of(&Default::default(), ns().name(), &victim);
    let at = t.locate(&tkey).expect("reads").expect("present");
    use std::os::unix::fs::FileExt;
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, at.offset + 10).expect("read");
    byte[0] ^= 0x04;
    file.write_all_at(&byte, at.offset + 10).expect("write");
    drop(file);
    let cache = builder(&path).read_only(true).open();
    let mut missing = Vec::new();
    for id in 0..3000 {
        if !has(&cache, 1, id) {
            missing.push(id);
        }
    }
    assert_eq!(missing, [1234], "exactly the damaged entry is a miss");
    assert!(!has(&cache, 1, 1234), "asked again: still a miss");
    let warned = warnings_about(&path.display().to_string());
    let about: Vec<&String> = warned
        .iter()
        .filter(|w| w.contains(&victim.to_hex()))
        .collect();
    assert_eq!(about.len(), 1, "one warning naming the entry: {warned:?}");
    assert!(about[0].contains("cannot be read"), "{about:?}");
    let found = cache_core::inspect(&path, &Limits::default(), None).expect("inspect");
    let (entries, problems) = found.check_entries();
    assert_eq!(entries, 2999);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].contains(&victim.to_hex()), "{problems:?}");
    assert!(problems[0].contains(&path.display().to_string()));
    assert!(
        problems[1].contains("1 of the 3000 entries of namespace \"matmul\""),
        "what the damage cost: {problems:?}"
    );
}

#[test]
fn a_table_cut_short_in_place_makes_misses_with_a_warning() {
    capture_logs();
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    table_of(&path, 400);
    let cache = builder(&path).read_only(true).open();
    assert_eq!(cache.len(), 400);
    // A quarter of them used before: memory keeps them.
    for id in 0..100 {
        assert!(has(&cache, 1, id));
    }
    // Someone else shortens the file in place (tunecache never does: it appends, or renames):
    // the tree's upper nodes, written last, are gone with the end of the file.
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
    assert!(kept >= 100 && lost > 0, "kept {kept}, lost {lost}");
    let warned = warnings_about(&path.display().to_string());
    assert!(
        warned.iter().any(|w| w.contains("cannot be read")),
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
    table_of(&path, 300);
    let reader = builder(&path).read_only(true).open();
    // Another writer folds into the table and rewrites it (renamed over it) several times,
    // without the reader's entries; then a file of other entries is renamed over it.
    let writer = builder(&path).compaction(0.0, 0).open();
    for id in 0..3 {
        writer.put(ns(), entry(2, id));
        writer.flush().expect("a fold each time");
    }
    drop(writer);
    let other = path_in(&dir, "other.tcache");
    table_of(&other, 0);
    let elsewhere = builder(&other).open();
    elsewhere.put(ns(), entry(3, 1));
    elsewhere.close().expect("close");
    std::fs::rename(&other, &path).expect("rename over");
    // Until it reads the file again, the reader reads the table it opened.
    for id in 0..300 {
        assert!(has(&reader, 1, id), "entry {id}");
    }
}

/// A table grown in place by someone else (here by 1 TiB, sparse) after the cache opened it:
/// a walk reads up to its commit's end, never the new length (which it would try to read).
#[test]
fn a_table_grown_in_place_is_read_only_as_far_as_its_commit() {
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    table_of(&path, 300);
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
    // A fresh open of the grown file: the commit is where its slot says, whatever follows.
    let fresh = builder(&path).read_only(true).open();
    assert_eq!(fresh.len(), 300);
    eprintln!("300 entries read back in {:?}", started.elapsed());
    file.set_len(len).expect("shrink back");
}

/// A format 3 snapshot whose payload another writer encoded with its structs as arrays (by
/// position, which every reader accepts): it is read whole, and opens as a good file.
#[test]
fn a_format_3_payload_in_another_writers_struct_form_opens_whole() {
    use cache_core::cache_format::rmpv::{self, Value as Raw};
    use cache_core::cache_format::{CacheData, encode_snapshot, read_snapshot};
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let mut data = CacheData::new();
    for id in 0..50 {
        data.insert(&Default::default(), ns().name(), entry(1, id));
    }
    let bytes = encode_snapshot(crate::support::APP, 1, &data);
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
    let cache = builder(&path).refresh_interval(None).read_only(true).open();
    assert!(
        cache.health().quarantined.is_empty(),
        "{:?}",
        cache.health()
    );
    assert_eq!(cache.len(), 50);
    for (_, _, e) in data.entries() {
        assert_eq!(cache.get(ns(), &e.fingerprint()).as_deref(), Some(e));
    }
}
