//! The artifact store: content addressing, atomic writes, damage detection, LRU eviction.

use std::time::Duration;

use cache_core::ArtifactStore;
use cache_core::cache_format::{Fields, Value};

fn inputs(kernel: &str, tile: i64) -> Fields {
    Fields::from([
        ("source".to_owned(), Value::from("ab12")),
        (
            "options".to_owned(),
            Value::from(vec!["-DTILE=16", "--gpu-architecture=compute_90"]),
        ),
        ("kernel".to_owned(), Value::from(kernel)),
        ("tile".to_owned(), Value::Int(tile)),
    ])
}

#[test]
fn blobs_come_back_under_their_key_and_keys_cover_every_input() {
    let dir = tempfile::tempdir().expect("dir");
    let store = ArtifactStore::open(dir.path(), 1 << 20).expect("open");
    let a = ArtifactStore::key(&inputs("matmul", 16));
    let b = ArtifactStore::key(&inputs("matmul", 32));
    assert_ne!(a, b, "a different config is a different key");
    assert_ne!(a, ArtifactStore::key(&inputs("reduce", 16)));
    assert_eq!(store.get(&a).expect("get"), None);
    store.put(&a, b".version 8.0\n.target sm_90").expect("put");
    assert_eq!(
        store.get(&a).expect("get").as_deref(),
        Some(&b".version 8.0\n.target sm_90"[..])
    );
    assert_eq!(store.get(&b).expect("get"), None);
}

#[test]
fn a_damaged_blob_is_a_miss_and_is_removed() {
    let dir = tempfile::tempdir().expect("dir");
    let store = ArtifactStore::open(dir.path(), 1 << 20).expect("open");
    let key = ArtifactStore::key(&inputs("matmul", 8));
    store.put(&key, &[7u8; 100]).expect("put");
    let hex = key.to_hex();
    let file = dir.path().join(&hex[..2]).join(format!("{hex}.art"));
    let mut bytes = std::fs::read(&file).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&file, bytes).expect("damage");
    assert_eq!(store.get(&key).expect("get"), None);
    assert!(!file.exists(), "the damaged blob was removed");
}

#[test]
fn the_least_recently_used_blobs_are_evicted_past_the_limit() {
    let dir = tempfile::tempdir().expect("dir");
    // Room for three 1000-byte blobs (plus headers).
    let store = ArtifactStore::open(dir.path(), 3 * 1100).expect("open");
    let keys: Vec<_> = (0..4)
        .map(|i| ArtifactStore::key(&inputs("k", i)))
        .collect();
    for k in &keys[..3] {
        store.put(k, &[1u8; 1000]).expect("put");
        std::thread::sleep(Duration::from_millis(20)); // distinct modification times
    }
    // Use the oldest: it becomes the most recent.
    assert!(store.get(&keys[0]).expect("get").is_some());
    std::thread::sleep(Duration::from_millis(20));
    store.put(&keys[3], &[1u8; 1000]).expect("put");
    assert!(
        store.get(&keys[0]).expect("get").is_some(),
        "recently used: kept"
    );
    assert!(
        store.get(&keys[1]).expect("get").is_none(),
        "least recently used: evicted"
    );
    assert!(store.get(&keys[2]).expect("get").is_some());
    assert!(store.get(&keys[3]).expect("get").is_some());
    assert!(store.size().expect("size") <= 3 * 1100);
}

#[test]
fn concurrent_writers_of_one_key_leave_one_valid_blob() {
    let dir = tempfile::tempdir().expect("dir");
    let key = ArtifactStore::key(&inputs("matmul", 64));
    let payload = vec![42u8; 64 << 10];
    std::thread::scope(|s| {
        for _ in 0..8 {
            let (dir, payload) = (dir.path(), &payload);
            s.spawn(move || {
                let store = ArtifactStore::open(dir, 1 << 30).expect("open");
                for _ in 0..20 {
                    store.put(&key, payload).expect("put");
                    assert_eq!(store.get(&key).expect("get").as_deref(), Some(&payload[..]));
                }
            });
        }
    });
    let leftovers: Vec<_> = walk(dir.path())
        .into_iter()
        .filter(|p| !p.ends_with(".art"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("list").flatten() {
        if e.path().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path().display().to_string());
        }
    }
    out
}
