//! `SnapshotBuilder` writes exactly `encode_snapshot`'s bytes, whatever order the entries come
//! in, and refuses a second entry of a key.

use cache_format::{CacheData, SnapshotBuilder, encode_snapshot};
use proptest::prelude::*;

use crate::strategies::cache_data;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn the_builder_writes_encode_snapshots_bytes_in_any_order(
        data in cache_data(),
        seed in any::<u64>(),
        schema in 1u32..5,
    ) {
        let mut items: Vec<_> = data.entries().collect();
        // A deterministic shuffle from the seed.
        let mut state = seed | 1;
        for i in (1..items.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            items.swap(i, (state % (i as u64 + 1)) as usize);
        }
        let mut builder = SnapshotBuilder::new();
        for (scope, ns, entry) in &items {
            prop_assert!(builder.insert_new(scope, ns, entry));
        }
        for (scope, ns, entry) in items.iter().take(2) {
            prop_assert!(!builder.insert_new(scope, ns, entry), "a key is taken once");
        }
        prop_assert_eq!(builder.len(), data.len() as u64);
        prop_assert_eq!(builder.finish("app", schema), encode_snapshot("app", schema, &data));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn merging_into_the_builder_is_merging_into_the_model(a in cache_data(), b in cache_data()) {
        // a's entries come twice (each is merged with itself, through a decode and an
        // encode), and any of b's keys a has too are merged, as CacheData::merge does.
        let mut builder = SnapshotBuilder::new();
        for (scope, ns, entry) in a.entries().chain(b.entries()).chain(a.entries()) {
            builder.merge(scope, ns, entry.clone()).expect("merges");
        }
        let mut model = a.clone();
        model.merge(b.clone());
        let mut visited = 0;
        builder
            .try_for_each(|scope, ns, entry| {
                visited += 1;
                assert_eq!(model.get(scope, ns, &entry.fingerprint()), Some(&entry));
                Ok::<(), cache_format::FormatError>(())
            })
            .expect("walks");
        prop_assert_eq!(visited, model.len());
        let bytes = encode_snapshot("app", 1, &model);
        let mut again = SnapshotBuilder::new();
        for (scope, ns, entry) in a.entries().chain(b.entries()) {
            again.merge(scope, ns, entry.clone()).expect("merges");
        }
        prop_assert_eq!(again.into_data().expect("decodes"), model);
        prop_assert_eq!(builder.finish("app", 1), bytes);
    }
}

#[test]
fn an_empty_builder_writes_an_empty_snapshot() {
    assert!(SnapshotBuilder::new().is_empty());
    assert_eq!(
        SnapshotBuilder::new().finish("app", 3),
        encode_snapshot("app", 3, &CacheData::new())
    );
}

/// A key given again and again, each time with one more candidate: every merge leaves the
/// entry's old bytes behind, and the builder must reclaim them rather than grow with the sum
/// of every version (quadratic in the number of lines: a 46 MB buffer for these 800).
#[test]
fn a_key_merged_over_and_over_keeps_the_buffer_near_what_it_holds() {
    use cache_format::{Candidate, Entry, Fields, Fingerprint, Key, Origin, Scope, Stats, Value};
    let key = Key::new(Fields::from([("m".to_owned(), Value::Int(1))]));
    let stats = Stats {
        median_ns: 10.0,
        min_ns: 9.0,
        spread_ns: 1.0,
        samples: 3,
    };
    let (builder, largest) = crate::alloc_guard::largest_allocation(|| {
        let mut builder = SnapshotBuilder::new();
        for i in 0..800 {
            let candidate =
                Candidate::measured(format!("algorithm_number_{i:05}"), Fields::new(), stats);
            let entry = Entry::new(
                key.clone(),
                Fingerprint::default(),
                Origin::Measured("t".into()),
                1,
                [candidate],
            );
            builder
                .merge(&Scope::default(), "ns", entry)
                .expect("merges");
        }
        builder
    });
    assert_eq!(builder.len(), 1);
    let data = builder.into_data().expect("decodes");
    let (_, _, entry) = data.entries().next().expect("one entry");
    assert_eq!(entry.candidates().len(), 800);
    assert!(largest < 8 << 20, "largest allocation {largest} bytes");
}
