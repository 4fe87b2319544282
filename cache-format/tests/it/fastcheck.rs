//! `raw::entry_decodes`, the check `verify` makes without building entries: it accepts what
//! this crate writes, and whatever it accepts the decoder accepts too.

use std::ops::ControlFlow;

use cache_format::raw::{decode_entry, entry_decodes, entry_facts, walk_payload};
use cache_format::{Fingerprint, KEY_TAG, Limits, encode_payload};
use proptest::prelude::*;

use crate::strategies::cache_data;

/// Every entry of a payload: (namespace, bytes).
fn entries(payload: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    walk_payload(payload, &Limits::default(), |_, ns, bytes| {
        out.push((ns.to_owned(), bytes.to_vec()));
        ControlFlow::Continue(())
    })
    .expect("a written payload walks");
    out
}

/// Where the key sits in an entry written by this crate: after `fixmap 6`, `"fp"`, `bin 8` of
/// 16 and `"key"`.
const KEY_AT: usize = 1 + 3 + 2 + 16 + 4;

/// Restores the stored fingerprint to the hash of the key's bytes, when the entry still has
/// the written layout, so a mutation of the key is not caught by the fingerprint alone.
fn rehash(bytes: &mut [u8]) {
    if bytes.len() <= KEY_AT || bytes[..6] != [0x86, 0xa2, b'f', b'p', 0xc4, 16] {
        return;
    }
    let mut rest = &bytes[KEY_AT..];
    let before = rest.len();
    if cache_format::rmpv::decode::read_value(&mut rest).is_err() {
        return;
    }
    let len = before - rest.len();
    let fp = Fingerprint::digest(KEY_TAG, &bytes[KEY_AT..KEY_AT + len]);
    bytes[6..22].copy_from_slice(&fp.0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn what_this_crate_writes_passes(data in cache_data()) {
        for (ns, bytes) in entries(&encode_payload(&data)) {
            let decoded = decode_entry(&bytes, &ns).expect("decodes");
            prop_assert_eq!(entry_decodes(&bytes), Some(decoded.fingerprint()));
            // The latest timestamp is the one a reader clamping the future would look at.
            let latest = decoded
                .candidates()
                .iter()
                .map(|c| c.measured_at)
                .fold(decoded.recorded_at(), u64::max);
            let facts = entry_facts(&bytes).expect("passes");
            prop_assert_eq!(facts.latest, latest);
        }
    }

    #[test]
    fn whatever_passes_decodes(data in cache_data(), at in any::<usize>(), x in 1u8..=255, insert in prop::collection::vec(any::<u8>(), 0..4), rehashed in any::<bool>()) {
        for (ns, bytes) in entries(&encode_payload(&data)) {
            let mut m = bytes.clone();
            let i = at % m.len();
            if insert.is_empty() {
                m[i] ^= x;
            } else {
                m.splice(i..i, insert.iter().copied());
            }
            if rehashed {
                rehash(&mut m);
            }
            if let Some(fp) = entry_decodes(&m) {
                let decoded = decode_entry(&m, &ns);
                prop_assert!(decoded.is_ok(), "passed the check but the decoder says {:?}", decoded.err());
                let decoded = decoded.expect("checked");
                prop_assert_eq!(decoded.fingerprint(), fp);
                let latest = decoded
                    .candidates()
                    .iter()
                    .map(|c| c.measured_at)
                    .fold(decoded.recorded_at(), u64::max);
                prop_assert_eq!(entry_facts(&m).map(|f| f.latest), Some(latest));
            }
        }
    }
}

#[test]
fn a_non_canonical_key_with_a_matching_hash_is_left_to_the_decoder() {
    use cache_format::{CacheData, Entry, Fields, Key, Origin, Scope, Value};
    let mut data = CacheData::new();
    let key = Key::new(Fields::from([("m".to_owned(), Value::Int(5))]));
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
    let (_, bytes) = entries(&encode_payload(&data)).remove(0);
    assert!(entry_decodes(&bytes).is_some());
    // {"m": 5} with 5 as uint 8 (0xcc 0x05) instead of a fixint, and the fingerprint of those
    // bytes: the decoder refuses it (it hashes the canonical form), so the check must not pass it.
    let mut m = bytes.clone();
    let at = KEY_AT + 3; // fixmap 1, "m", then the value
    assert_eq!(m[at], 0x05);
    m.splice(at..=at, [0xcc, 0x05]);
    rehash(&mut m);
    assert!(entry_decodes(&m).is_none());
    assert!(decode_entry(&m, "ns").is_err());
}

/// The mutation property means something only if mutated entries often still pass the check
/// (a changed timing, name or timestamp, a re-hashed key): count them.
#[test]
fn mutated_entries_often_still_pass_so_the_property_is_exercised() {
    let (mut passed, mut tried) = (0, 0);
    for (case, data) in crate::strategies::sample_data(200).enumerate() {
        for (ns, bytes) in entries(&encode_payload(&data)) {
            let mut m = bytes.clone();
            let i = (case * 7919 + tried * 31) % m.len();
            m[i] ^= 1 + (case % 255) as u8;
            rehash(&mut m);
            tried += 1;
            if entry_decodes(&m).is_some() {
                passed += 1;
                assert!(decode_entry(&m, &ns).is_ok());
            }
        }
    }
    eprintln!("{passed} of {tried} mutated entries passed the check");
    assert!(tried > 100 && passed * 10 > tried, "{passed} of {tried}");
}
