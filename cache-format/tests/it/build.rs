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

#[test]
fn an_empty_builder_writes_an_empty_snapshot() {
    assert!(SnapshotBuilder::new().is_empty());
    assert_eq!(
        SnapshotBuilder::new().finish("app", 3),
        encode_snapshot("app", 3, &CacheData::new())
    );
}
