//! Any mutation of a valid file gives an error (or, rarely, another valid file), never a panic
//! and never a large allocation: truncation, flipped bytes, inserted bytes, huge length
//! prefixes, with and without the checksums recomputed to match (an attacker can do that).

use cache_format::{
    CacheData, JournalHeader, Limits, encode_journal_header, encode_record, encode_snapshot, raw,
    read_journal_header, read_snapshot, scan_records,
};
use proptest::prelude::*;

use crate::alloc_guard::largest_allocation;
use crate::strategies::cache_data;

#[derive(Debug, Clone)]
enum Mutation {
    Truncate(usize),
    Flip(usize, u8),
    Insert(usize, Vec<u8>),
    HugePrefix(usize, usize),
}

/// Length prefixes and headers that announce far more than the data holds.
const HUGE: [&[u8]; 6] = [
    &[0xdd, 0xff, 0xff, 0xff, 0xff],
    &[0xdf, 0x7f, 0xff, 0xff, 0xff],
    &[0xdb, 0xff, 0xff, 0xff, 0xf0],
    &[0xc6, 0xff, 0xff, 0xff, 0xff],
    &[0xc9, 0x7f, 0xff, 0xff, 0xff, 0x01],
    &[
        0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91,
        0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91,
        0x91, 0x91, 0x91, 0x91, 0x91,
    ],
];

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), 1u8..=255).prop_map(|(i, x)| Mutation::Flip(i, x)),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        (any::<usize>(), 0..HUGE.len()).prop_map(|(i, h)| Mutation::HugePrefix(i, h)),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    if bytes.is_empty() {
        return;
    }
    match m {
        Mutation::Truncate(i) => bytes.truncate(i % bytes.len()),
        Mutation::Flip(i, x) => {
            let n = bytes.len();
            bytes[i % n] ^= x;
        }
        Mutation::Insert(i, b) => {
            let at = i % (bytes.len() + 1);
            bytes.splice(at..at, b.iter().copied());
        }
        Mutation::HugePrefix(i, h) => {
            let prefix = HUGE[*h];
            let at = i % bytes.len();
            let end = (at + prefix.len()).min(bytes.len());
            bytes.splice(at..end, prefix.iter().copied());
        }
    }
}

/// Wraps arbitrary payload bytes in a snapshot envelope with correct checksums.
fn rewrap(header: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0x96, 0xa9];
    out.extend_from_slice(b"tunecache");
    out.push(0x01);
    for part in [header, payload] {
        out.push(0xc6);
        out.extend_from_slice(&(part.len() as u32).to_be_bytes());
        out.extend_from_slice(part);
        out.push(0xce);
        out.extend_from_slice(&crc32fast::hash(part).to_be_bytes());
    }
    out
}

/// Reads a snapshot fully; returns whether it was accepted. Also walks it entry by entry as
/// the streaming readers do (after the framing check alone): never a panic, and a payload the
/// whole decoder accepts walks without error.
fn try_read(bytes: &[u8]) -> bool {
    let walked = cache_format::read_snapshot_framing(bytes, &Limits::default()).map(|snap| {
        raw::walk_payload(snap.payload_bytes(), &Limits::default(), |_, ns, entry| {
            let _ = raw::decode_entry(entry, ns);
            let _ = raw::entry_fingerprint(entry);
            std::ops::ControlFlow::Continue(())
        })
    });
    let accepted = try_read_whole(bytes);
    if accepted {
        assert!(matches!(walked, Ok(Ok(()))), "{walked:?}");
    }
    accepted
}

fn try_read_whole(bytes: &[u8]) -> bool {
    match read_snapshot(bytes, &Limits::default()) {
        Ok(snap) => {
            let typed = raw::decode_payload(snap.payload_bytes(), &Limits::default()).is_ok();
            let _ = raw::payload_value(snap.payload_bytes(), &Limits::default());
            typed
        }
        Err(err) => {
            // Every error renders to a message (no panic in Display either).
            assert!(!err.to_string().is_empty());
            false
        }
    }
}

fn bound(len: usize) -> usize {
    // Decoding may copy the input a few times; it must never ask for more than that.
    8 * len + (256 << 10)
}

fn split_snapshot(bytes: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let snap = read_snapshot(bytes, &Limits::default()).expect("valid");
    // The header bin follows [0x96, 0xa9 "tunecache", 0x01, 0xc6, len: u32].
    assert_eq!(bytes[12], 0xc6);
    let hlen = u32::from_be_bytes(bytes[13..17].try_into().expect("4 bytes")) as usize;
    (bytes[17..17 + hlen].to_vec(), snap.payload_bytes().to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn mutated_snapshots_never_panic_or_allocate_hugely(data in cache_data(), muts in prop::collection::vec(mutation(), 1..4)) {
        let mut bytes = encode_snapshot("app", 7, &data);
        for m in &muts {
            apply(&mut bytes, m);
        }
        let (_, largest) = largest_allocation(|| try_read(&bytes));
        prop_assert!(largest <= bound(bytes.len()), "allocated {largest} bytes for a {}-byte file", bytes.len());
    }

    #[test]
    fn mutated_payloads_with_valid_checksums_never_panic_or_allocate_hugely(data in cache_data(), muts in prop::collection::vec(mutation(), 1..4)) {
        let (header, mut payload) = split_snapshot(&encode_snapshot("app", 7, &data));
        for m in &muts {
            apply(&mut payload, m);
        }
        let bytes = rewrap(&header, &payload);
        let (_, largest) = largest_allocation(|| try_read(&bytes));
        prop_assert!(largest <= bound(bytes.len()), "allocated {largest} bytes for a {}-byte file", bytes.len());
    }

    #[test]
    fn mutated_headers_with_valid_checksums_never_panic(data in cache_data(), muts in prop::collection::vec(mutation(), 1..4)) {
        let (mut header, payload) = split_snapshot(&encode_snapshot("app", 7, &data));
        for m in &muts {
            apply(&mut header, m);
        }
        let bytes = rewrap(&header, &payload);
        let (_, largest) = largest_allocation(|| try_read(&bytes));
        prop_assert!(largest <= bound(bytes.len()));
    }

    #[test]
    fn mutated_journals_never_panic_and_keep_every_record_before_the_damage(
        records in prop::collection::vec(cache_data(), 1..4),
        muts in prop::collection::vec(mutation(), 1..3),
    ) {
        let mut bytes = encode_journal_header(&JournalHeader { app: "app".into(), schema: 1, base: 9, nonce: 0 });
        let mut ends = Vec::new();
        for r in &records {
            bytes.extend_from_slice(&encode_record(r));
            ends.push(bytes.len());
        }
        let original = bytes.clone();
        for m in &muts {
            apply(&mut bytes, m);
        }
        let first_diff = original.iter().zip(&bytes).position(|(a, b)| a != b).unwrap_or(original.len().min(bytes.len()));
        let ((), largest) = largest_allocation(|| {
            if let Ok((_, _, start)) = read_journal_header(&bytes, &Limits::default()) {
                let scan = scan_records(&bytes, start, &Limits::default());
                for r in &scan.records {
                    let _ = raw::decode_payload(&bytes[r.clone()], &Limits::default());
                }
                // Records that ended before the first changed byte are all still found.
                let intact = ends.iter().filter(|&&e| e <= first_diff).count();
                assert!(scan.records.len() >= intact, "lost intact records: {} < {intact}", scan.records.len());
                assert!(scan.end <= bytes.len());
            }
        });
        prop_assert!(largest <= bound(bytes.len()));
    }
}

#[test]
fn a_truncated_file_names_what_is_missing() {
    let mut data = CacheData::new();
    let key = cache_format::Key::new(cache_format::Fields::from([("m".to_owned(), 1.into())]));
    data.insert(
        &cache_format::Scope::default(),
        "ns",
        cache_format::Entry::new(
            key,
            Default::default(),
            cache_format::Origin::Measured("x".into()),
            0,
            [],
        ),
    );
    let bytes = encode_snapshot("app", 1, &data);
    let err = read_snapshot(&bytes[..bytes.len() - 3], &Limits::default()).expect_err("truncated");
    assert!(err.to_string().contains("truncated"), "{err}");
}

#[test]
fn a_newer_format_is_reported_as_newer_not_as_corrupt() {
    let mut bytes = encode_snapshot("app", 1, &CacheData::new());
    bytes[11] = 0x09; // the format version (positive fixint after the marker)
    let err = read_snapshot(&bytes, &Limits::default()).expect_err("newer");
    assert_eq!(
        err,
        cache_format::FormatError::NewerFormat {
            found: 9,
            supported: cache_format::FORMAT_VERSION
        }
    );
}

#[test]
fn a_foreign_file_is_not_mistaken_for_a_cache() {
    for bytes in [
        &b"{\"json\": true}"[..],
        &[0x93, 0x01, 0x02, 0x03][..],
        b"",
        &[0x92, 0xa3, b'a', b'b', b'c', 0x01][..],
    ] {
        let err = read_snapshot(bytes, &Limits::default()).expect_err("not ours");
        assert!(
            matches!(err, cache_format::FormatError::NotTunecache { .. }),
            "{err}"
        );
    }
}

#[test]
fn a_file_over_the_size_limit_is_refused_before_decoding() {
    let bytes = encode_snapshot("app", 1, &CacheData::new());
    let limits = Limits {
        max_file_bytes: 10,
        ..Limits::default()
    };
    assert!(matches!(
        read_snapshot(&bytes, &limits),
        Err(cache_format::FormatError::TooLarge { .. })
    ));
}

fn candidate(i: u64) -> cache_format::Candidate {
    let stats = cache_format::Stats {
        median_ns: 1.0,
        min_ns: 1.0,
        spread_ns: 0.0,
        samples: 1,
    };
    cache_format::Candidate::measured(format!("c{i}"), cache_format::Fields::new(), stats)
}

fn entry_with(fields: usize, candidates: u64) -> cache_format::Entry {
    let key: cache_format::Fields = (0..fields)
        .map(|i| (format!("f{i}"), cache_format::Value::Int(i as i64)))
        .collect();
    cache_format::Entry::new(
        cache_format::Key::new(key),
        cache_format::Fingerprint::default(),
        cache_format::Origin::Imported("t".into()),
        1,
        (0..candidates).map(candidate),
    )
}

fn too_many(
    result: Result<impl std::fmt::Debug, cache_format::FormatError>,
) -> (&'static str, u64) {
    match result {
        Err(cache_format::FormatError::TooMany { what, count, .. }) => (what, count),
        other => panic!("expected TooMany, got {other:?}"),
    }
}

/// A file whose shape would cost far more memory than its bytes (many scopes, namespaces,
/// candidates or fields) is refused before anything is decoded, with the cap it broke.
#[test]
fn shapes_over_the_caps_are_refused_before_decoding() {
    use cache_format::{Fields, Scope, Value};
    let limits = Limits {
        max_scopes: 3,
        max_namespaces: 4,
        max_candidates: 5,
        max_fields: 6,
        ..Limits::default()
    };
    let scope = |i: i64| Scope::new(Fields::from([("d".to_owned(), Value::Int(i))]));
    let mut scopes = CacheData::new();
    for i in 0..4 {
        scopes.insert(&scope(i), "ns", entry_with(1, 1));
    }
    let mut namespaces = CacheData::new();
    for (s, n) in [(0, "a"), (0, "b"), (1, "c"), (1, "d"), (2, "e")] {
        namespaces.insert(&scope(s), n, entry_with(1, 1));
    }
    let mut candidates = CacheData::new();
    candidates.insert(&scope(0), "ns", entry_with(1, 6));
    let mut fields = CacheData::new();
    fields.insert(&scope(0), "ns", entry_with(7, 1));
    let cases = [
        (scopes, ("scopes", 4)),
        (namespaces, ("namespaces", 5)),
        (candidates, ("candidates of an entry", 6)),
        (fields, ("fields of a key", 7)),
    ];
    for (data, expected) in cases {
        let bytes = encode_snapshot("app", 1, &data);
        assert_eq!(too_many(read_snapshot(&bytes, &limits)), expected);
        let payload = cache_format::encode_payload(&data);
        assert_eq!(
            too_many(cache_format::raw::decode_payload(&payload, &limits)),
            expected
        );
        assert_eq!(
            too_many(cache_format::raw::payload_value(&payload, &limits)),
            expected
        );
        let record = encode_record(&data);
        let scan = scan_records(&record, 0, &Limits::default());
        let range = scan.records.first().expect("a record").clone();
        assert_eq!(
            too_many(cache_format::raw::decode_payload(&record[range], &limits)),
            expected
        );
        assert!(
            read_snapshot(&bytes, &Limits::default()).is_ok(),
            "within the default caps"
        );
    }
}

/// The decoder also accepts structs written as arrays; the census counts those too, so the
/// caps cannot be sidestepped by a positional encoding or unusual keys.
#[test]
fn the_caps_hold_for_positional_structs_and_unusual_keys() {
    use cache_format::rmpv::Value as V;
    let limits = Limits {
        max_candidates: 2,
        ..Limits::default()
    };
    let cand = |i: i64| {
        V::Array(vec![
            V::from(format!("c{i}")),
            V::Map(vec![]),
            V::from(1),
            V::from("ok"),
        ])
    };
    let entry = V::Array(vec![
        V::Binary(vec![0; 16]),
        V::Map(vec![]),
        V::Binary(vec![0; 16]),
        V::from(1),
        V::Map(vec![]),
        V::Array((0..3).map(cand).collect()),
    ]);
    let payload = V::Map(vec![
        (V::from(7), V::from("a non-string key")),
        (
            V::from("a long key ".repeat(30)),
            V::from("skipped with its value"),
        ),
        (
            V::from("scopes"),
            V::Array(vec![V::Array(vec![
                V::Map(vec![]),
                V::Map(vec![(V::from("ns"), V::Array(vec![entry]))]),
            ])]),
        ),
    ]);
    let mut bytes = Vec::new();
    cache_format::rmpv::encode::write_value(&mut bytes, &payload).expect("encode");
    assert_eq!(
        too_many(cache_format::raw::decode_payload(&bytes, &limits)),
        ("candidates of an entry", 3)
    );
}

/// What an import accepts must be readable: JSON lines over the caps are refused, naming the
/// line and the cap, so `tunecache import` cannot write a record every reader refuses.
#[test]
fn json_lines_over_the_caps_are_refused_with_the_line() {
    use cache_format::json::{ImportOrigin, parse_lines};
    let limits = Limits::default();
    let candidates: Vec<String> = (0..=limits.max_candidates)
        .map(|i| format!(r#"{{"algo":"c{i}","median_ns":1}}"#))
        .collect();
    let too_many_candidates = format!(
        r#"{{"scope":{{}},"namespace":"ns","key":{{"m":1}},"candidates":[{}]}}"#,
        candidates.join(",")
    );
    let fields: Vec<String> = (0..=limits.max_fields)
        .map(|i| format!(r#""f{i}":1"#))
        .collect();
    let too_many_fields = format!(
        r#"{{"scope":{{}},"namespace":"ns","key":{{{}}},"candidates":[]}}"#,
        fields.join(",")
    );
    let ok =
        r#"{"scope":{},"namespace":"ns","key":{"m":2},"candidates":[{"algo":"a","median_ns":1}]}"#;
    for (bad, what) in [
        (too_many_candidates, "candidates"),
        (too_many_fields, "fields of the key"),
    ] {
        let text = format!("{ok}\n{bad}\n");
        let err =
            parse_lines(&text, "in.jsonl", ImportOrigin::MarkImported).expect_err("over the cap");
        assert_eq!(err.line, 2, "{err}");
        assert!(err.to_string().contains(what), "{err}");
    }
    let scopes: Vec<String> = (0..=limits.max_scopes)
        .map(|i| {
            format!(r#"{{"scope":{{"d":{i}}},"namespace":"ns","key":{{"m":1}},"candidates":[]}}"#)
        })
        .collect();
    let err = parse_lines(&scopes.join("\n"), "in.jsonl", ImportOrigin::MarkImported)
        .expect_err("too many scopes");
    assert_eq!(err.line as u64, limits.max_scopes + 1, "{err}");
}

/// The depth helpers of `Limits` say exactly how deep a param, key field or scope field may
/// nest and still be read back: writers (and migration defaults) check with them, so they must
/// agree with the reader's nesting bound.
#[test]
fn the_depth_helpers_agree_with_the_reader() {
    use cache_format::{Fields, Scope, Value, check_payload, encode_payload};
    fn nested(depth: u32) -> Value {
        let mut v = Value::Int(1);
        for i in 0..depth {
            v = if i % 2 == 0 {
                Value::List(vec![v])
            } else {
                Value::Map(Fields::from([("x".to_owned(), v)]))
            };
        }
        assert_eq!(v.depth(), depth);
        v
    }
    let field = |v: Value| Fields::from([("f".to_owned(), v)]);
    let limits = Limits::default();
    let encode = |place: &str, v: Value| {
        let mut e = entry_with(1, 1);
        let mut scope = Scope::default();
        match place {
            "param" => {
                let stats = cache_format::Stats {
                    median_ns: 1.0,
                    min_ns: 1.0,
                    spread_ns: 0.0,
                    samples: 1,
                };
                e = cache_format::Entry::new(
                    e.key().clone(),
                    cache_format::Fingerprint::default(),
                    cache_format::Origin::Imported("t".into()),
                    1,
                    [cache_format::Candidate::measured("c", field(v), stats)],
                );
            }
            "key" => {
                e = cache_format::Entry::new(
                    cache_format::Key::new(field(v)),
                    cache_format::Fingerprint::default(),
                    cache_format::Origin::Imported("t".into()),
                    1,
                    [candidate(0)],
                );
            }
            _ => scope = Scope::new(field(v)),
        }
        let mut data = CacheData::new();
        data.insert(&scope, "ns", e);
        check_payload(&encode_payload(&data), &limits)
    };
    for (place, max) in [
        ("param", limits.max_param_depth()),
        ("key", limits.max_key_field_depth()),
        ("scope", limits.max_scope_field_depth()),
    ] {
        assert!(encode(place, nested(max)).is_ok(), "{place} at {max}");
        assert!(
            encode(place, nested(max + 1)).is_err(),
            "{place} at {}",
            max + 1
        );
    }
}

/// A payload nested far deeper than the bound, behind valid checksums: the walk refuses it
/// with an error (no stack overflow, no panic), as the whole-payload scan does.
#[test]
fn a_deeply_nested_entry_is_refused_by_the_walk() {
    let data = {
        let mut d = CacheData::new();
        d.insert(&cache_format::Scope::default(), "ns", entry_with(1, 1));
        d
    };
    let bytes = encode_snapshot("app", 1, &data);
    let (header, payload) = split_snapshot(&bytes);
    // Replace the payload with scopes → one scope → namespaces → an "entry" nested 100,000
    // arrays deep.
    let mut deep = Vec::new();
    deep.push(0x81);
    rmp::encode::write_str(&mut deep, "scopes").expect("vec");
    deep.push(0x91);
    deep.push(0x82);
    rmp::encode::write_str(&mut deep, "scope").expect("vec");
    deep.push(0x80);
    rmp::encode::write_str(&mut deep, "namespaces").expect("vec");
    deep.push(0x81);
    rmp::encode::write_str(&mut deep, "ns").expect("vec");
    deep.push(0x91);
    deep.extend(std::iter::repeat_n(0x91, 100_000));
    deep.push(0x01);
    let _ = payload;
    let file = rewrap(&header, &deep);
    let snap = cache_format::read_snapshot_framing(&file, &Limits::default()).expect("framing");
    let walked = raw::walk_payload(snap.payload_bytes(), &Limits::default(), |_, _, _| {
        panic!("no entry may be handed out")
    });
    assert!(walked.is_err());
    assert!(read_snapshot(&file, &Limits::default()).is_err());
}

/// A measurement policy that is not a map of canonical values is refused with its line, like
/// any other bad field; one that is comes back through an export unchanged.
#[test]
fn json_lines_with_a_bad_policy_are_refused_and_a_good_one_round_trips() {
    use cache_format::json::{ImportOrigin, parse_lines, record};
    let line = |policy: &str| {
        format!(
            r#"{{"scope":{{}},"namespace":"ns","key":{{"m":1}},"candidates":[{{"algo":"a","median_ns":1,"policy":{policy}}}]}}"#
        )
    };
    for bad in [r#""wall""#, r#"{"timer":1.5}"#, r#"{"timer":null}"#, "[1]"] {
        let err = parse_lines(&line(bad), "in.jsonl", ImportOrigin::Keep).expect_err(bad);
        assert_eq!(err.line, 1, "{err}");
    }
    let good = line(r#"{"timer":"cuda-events","samples":9,"interleaved":true}"#);
    let data = parse_lines(&good, "in.jsonl", ImportOrigin::Keep).expect("a good policy");
    let (scope, ns, entry) = data.entries().next().expect("one entry");
    let policy = entry.candidates()[0].policy.clone().expect("recorded");
    assert_eq!(policy.get("samples"), Some(&cache_format::Value::Int(9)));
    let back = serde_json::to_value(record(scope, ns, entry)).expect("json");
    assert_eq!(
        back["candidates"][0]["policy"],
        serde_json::json!({"interleaved": true, "samples": 9, "timer": "cuda-events"})
    );
    // And through the file format, byte for byte.
    let bytes = cache_format::encode_snapshot("app", 1, &data);
    let snap = cache_format::read_snapshot(&bytes, &Limits::default()).expect("reads");
    let again = cache_format::raw::decode_snapshot(&snap).expect("decodes");
    assert_eq!(again, data);
}
