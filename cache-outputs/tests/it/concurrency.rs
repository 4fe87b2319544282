//! One computation per key across threads and across processes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use cache_outputs::OutputCache;
use test_support::child;

use crate::{content, key, value};

#[test]
fn threads_asking_for_one_key_compute_it_once() {
    let dir = test_support::temp_dir();
    let cache = OutputCache::builder(dir.path()).open().expect("open");
    let computed = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for i in 0..10 {
                    let v = cache
                        .get_or_compute(&key(i), || -> Result<_, ()> {
                            computed.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(std::time::Duration::from_millis(10));
                            Ok(value(i, 4096))
                        })
                        .expect("value");
                    assert_eq!(v.bytes(), content(i, 4096).as_slice());
                }
            });
        }
    });
    assert_eq!(computed.load(Ordering::SeqCst), 10);
}

#[test]
fn eight_processes_asking_for_the_same_keys_compute_each_once() {
    let dir = test_support::temp_dir();
    let log = dir.path().join("computed.log");
    let store = dir.path().join("store");
    let log_s = log.to_str().expect("utf-8").to_owned();
    let mut children: Vec<_> = (0..8)
        .map(|_| child::spawn("computer", &store, &[&log_s, "24"], &[]))
        .collect();
    for c in &mut children {
        let said = child::lines(c);
        assert!(said.iter().any(|l| l == "done"), "{said:?}");
        assert!(c.wait().expect("exit").success());
    }
    let text = std::fs::read_to_string(&log).expect("log");
    let mut per_key: HashMap<&str, usize> = HashMap::new();
    for line in text.lines() {
        *per_key.entry(line).or_default() += 1;
    }
    assert_eq!(per_key.len(), 24, "every key computed: {per_key:?}");
    assert!(
        per_key.values().all(|n| *n == 1),
        "each key computed once: {per_key:?}"
    );
}
