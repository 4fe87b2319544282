//! Builders shared by the tests.

use cache_format::{
    CacheData, Candidate, Entry, Fields, Fingerprint, Key, Origin, Scope, Stats, Value,
};

pub(crate) fn key(m: i64) -> Key {
    Key::new(Fields::from([("m".to_owned(), Value::Int(m))]))
}

pub(crate) fn entry(m: i64, algos: &[&str]) -> Entry {
    let candidates = algos.iter().enumerate().map(|(i, a)| {
        let mut c = Candidate::measured(
            *a,
            Fields::new(),
            Stats {
                median_ns: 100.0 * (i + 1) as f64,
                min_ns: 90.0,
                spread_ns: 1.0,
                samples: 5,
            },
        );
        c.measured_at = 1;
        c
    });
    Entry::new(
        key(m),
        Fingerprint::default(),
        Origin::Measured("test".into()),
        1,
        candidates,
    )
}

pub(crate) fn data(entries: &[(&str, Entry)]) -> CacheData {
    let mut d = CacheData::new();
    for (ns, e) in entries {
        d.insert(&Scope::default(), ns, e.clone());
    }
    d
}
