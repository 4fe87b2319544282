//! `raw::walk_checked_payload`, the one walk a lazy open and `verify` make: whatever it accepts,
//! the scan and the census (`check_payload`) accept too, under any limits; and it accepts what
//! this crate writes exactly when `check_payload` does, so the fast path is the usual one.

use std::ops::ControlFlow;

use cache_format::raw::{walk_checked_payload, walk_payload};
use cache_format::{Limits, check_payload, encode_payload};
use proptest::prelude::*;

use crate::strategies::cache_data;

/// Limits small enough that the generated data meets each of them now and then.
fn small_limits() -> impl Strategy<Value = Limits> {
    (6u32..16, 0u64..4, 0u64..5, 0u64..5, 0u64..7).prop_map(
        |(max_depth, max_scopes, max_namespaces, max_candidates, max_fields)| Limits {
            max_depth,
            max_scopes,
            max_namespaces,
            max_candidates,
            max_fields,
            ..Limits::default()
        },
    )
}

/// Walks `payload` to the end; `Ok` with (namespace, bytes, whether the fast check passed)
/// per entry.
fn walk_all(payload: &[u8], limits: &Limits) -> Result<Vec<(String, Vec<u8>, bool)>, String> {
    let mut out = Vec::new();
    walk_checked_payload(payload, limits, |_, ns, bytes, facts| {
        out.push((ns.to_owned(), bytes.to_vec(), facts.is_some()));
        ControlFlow::Continue(())
    })
    .map_err(|e| e.to_string())?;
    Ok(out)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn it_accepts_a_written_payload_exactly_when_check_payload_does(
        data in cache_data(),
        limits in small_limits(),
        deep in any::<bool>(),
    ) {
        // With the default nesting only the caps decide, and then both must agree both ways;
        // with a small nesting limit the walk may refuse more (it counts empty containers).
        let limits = if deep { Limits { max_depth: 32, ..limits } } else { limits };
        let payload = encode_payload(&data);
        let walked = walk_all(&payload, &limits);
        let checked = check_payload(&payload, &limits);
        if walked.is_ok() {
            prop_assert!(checked.is_ok(), "walked, but check_payload says {:?}", checked.err());
        }
        if deep {
            prop_assert_eq!(walked.is_ok(), checked.is_ok(), "walk {:?}, check {:?}", walked, checked);
        }
        // Under the default limits it walks every entry, each through the fast check, and the
        // same entries as the general walk.
        let all = walk_all(&payload, &Limits::default()).expect("a written payload walks");
        let mut general = Vec::new();
        walk_payload(&payload, &Limits::default(), |_, ns, bytes| {
            general.push((ns.to_owned(), bytes.to_vec(), true));
            ControlFlow::Continue(())
        })
        .expect("walks");
        prop_assert_eq!(all, general);
    }

    #[test]
    fn whatever_it_accepts_check_payload_accepts(
        data in cache_data(),
        limits in small_limits(),
        deep in any::<bool>(),
        at in any::<usize>(),
        x in 1u8..=255,
        insert in prop::collection::vec(any::<u8>(), 0..4),
        cut in any::<bool>(),
    ) {
        let limits = if deep { Limits { max_depth: 32, ..limits } } else { limits };
        let mut payload = encode_payload(&data);
        let i = at % payload.len();
        if cut {
            payload.truncate(i);
        } else if insert.is_empty() {
            payload[i] ^= x;
        } else {
            payload.splice(i..i, insert.iter().copied());
        }
        if let Ok(entries) = walk_all(&payload, &limits) {
            let checked = check_payload(&payload, &limits);
            prop_assert!(
                checked.is_ok(),
                "walked {} entries, but check_payload says {:?}",
                entries.len(),
                checked.err()
            );
        }
    }
}

/// The nesting and cap rules at their edges, on one hand-made entry whose key nests: the walk
/// must refuse exactly where the scan or census starts to, or earlier, never later.
#[test]
fn the_depth_and_caps_are_enforced_at_their_edges() {
    use cache_format::{CacheData, Entry, Fields, Fingerprint, Key, Origin, Scope, Value};
    let mut data = CacheData::new();
    let nested = Value::List(vec![Value::List(vec![Value::Map(
        [("a".to_owned(), Value::Int(1))].into_iter().collect(),
    )])]);
    let key = Key::new(Fields::from([
        ("m".to_owned(), nested),
        ("n".to_owned(), Value::Int(2)),
    ]));
    data.insert(
        &Scope::default(),
        "ns",
        Entry::new(
            key,
            Fingerprint::default(),
            Origin::Measured("t".into()),
            1,
            [],
        ),
    );
    let payload = encode_payload(&data);
    let mut accepted_somewhere = false;
    for max_depth in 0..16 {
        for max_fields in 0..4 {
            let limits = Limits {
                max_depth,
                max_fields,
                ..Limits::default()
            };
            let walked = walk_all(&payload, &limits);
            let checked = check_payload(&payload, &limits);
            if walked.is_ok() {
                accepted_somewhere = true;
                assert!(
                    checked.is_ok(),
                    "depth {max_depth}, fields {max_fields}: {checked:?}"
                );
            }
            // Depth: payload 1, scopes 2, scope 3, namespaces 4, entries 5, entry 6, key 7,
            // list 8, list 9, map 10 (the only empty containers are the scope's fields and the
            // candidates, which the scan does not count): both agree from 10 on.
            if max_depth >= 10 {
                assert_eq!(
                    walked.is_ok(),
                    checked.is_ok(),
                    "depth {max_depth}, fields {max_fields}"
                );
            }
        }
    }
    assert!(accepted_somewhere);
}

/// The mutation property means something only if mutated payloads often still walk (a
/// changed timing, name, count or nesting that stays well formed): count them.
#[test]
fn mutated_payloads_often_still_walk_so_the_property_is_exercised() {
    let (mut walked, mut tried) = (0, 0);
    for (case, data) in crate::strategies::sample_data(400).enumerate() {
        let mut payload = encode_payload(&data);
        let i = (case * 7919) % payload.len();
        payload[i] ^= 1 + (case % 255) as u8;
        let limits = Limits {
            max_depth: 6 + (case % 10) as u32,
            max_fields: (case % 7) as u64,
            ..Limits::default()
        };
        tried += 1;
        if walk_all(&payload, &limits).is_ok() {
            walked += 1;
            assert!(check_payload(&payload, &limits).is_ok(), "case {case}");
        }
    }
    eprintln!("{walked} of {tried} mutated payloads walked");
    assert!(walked * 10 > tried, "{walked} of {tried}");
}
