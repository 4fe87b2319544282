//! The key fingerprint test vectors of FORMAT.md (shared with check_vectors.py).

use cache_format::{Fields, Fingerprint, Key, Scope, Value, encode_fields, to_fields};
use serde::Serialize;

fn vectors() -> serde_json::Value {
    let text = include_str!("../data/fingerprint_vectors.json");
    serde_json::from_str(text).expect("vector file is valid JSON")
}

fn fields_from_json(v: &serde_json::Value) -> Fields {
    match serde_json::from_value::<Value>(v.clone()).expect("vector input is a canonical value") {
        Value::Map(f) => f,
        other => panic!("vector input is not a map: {other}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn key_vectors_match_from_json() {
    let v = vectors();
    let keys = v["keys"].as_array().expect("keys");
    assert!(keys.len() >= 6);
    for case in keys {
        let fields = fields_from_json(&case["input"]);
        let mut canonical = Vec::new();
        encode_fields(&fields, &mut canonical);
        assert_eq!(
            hex(&canonical),
            case["canonical"],
            "canonical bytes of {}",
            case["input"]
        );
        assert_eq!(
            Key::new(fields).fingerprint().to_hex(),
            case["fingerprint"],
            "fingerprint of {}",
            case["input"]
        );
    }
}

#[test]
fn scope_vectors_match() {
    let v = vectors();
    for case in v["scopes"].as_array().expect("scopes") {
        let scope = Scope::new(fields_from_json(&case["input"]));
        assert_eq!(scope.fingerprint().to_hex(), case["fingerprint"]);
    }
}

#[test]
fn candidate_set_vectors_match_and_ignore_order_and_duplicates() {
    let v = vectors();
    for case in v["candidate_sets"].as_array().expect("candidate_sets") {
        let candidates: Vec<(String, Fields)> = case["candidates"]
            .as_array()
            .expect("list")
            .iter()
            .map(|c| {
                (
                    c[0].as_str().expect("name").to_owned(),
                    fields_from_json(&c[1]),
                )
            })
            .collect();
        let salt = fields_from_json(&case["salt"]);
        let got =
            Fingerprint::of_candidate_set(candidates.iter().map(|(a, p)| (a.as_str(), p)), &salt);
        assert_eq!(got.to_hex(), case["checksum"]);
    }
}

#[derive(Serialize)]
struct MatmulKey {
    // Declared in a different order from the canonical (sorted) one on purpose.
    n: u32,
    m: u64,
    dtype: &'static str,
    k: i16,
    #[serde(skip_serializing_if = "Option::is_none")]
    split: Option<u8>,
}

#[test]
fn a_rust_struct_fingerprints_like_the_same_key_as_json() {
    let key = Key::from_serialize(&MatmulKey {
        n: 256,
        m: 128,
        dtype: "float16",
        k: 64,
        split: None,
    })
    .expect("struct is a valid key");
    assert_eq!(
        key.fingerprint().to_hex(),
        "0e1b3268bc863dcd8fc87916d051a86e"
    );
    let json: serde_json::Value =
        serde_json::json!({"dtype": "float16", "k": 64, "m": 128, "n": 256});
    assert_eq!(Key::new(fields_from_json(&json)), key);
}

#[test]
fn an_absent_optional_field_does_not_change_the_fingerprint_but_a_present_one_does() {
    let without = Key::from_serialize(&MatmulKey {
        n: 256,
        m: 128,
        dtype: "float16",
        k: 64,
        split: None,
    })
    .expect("key");
    let with = Key::from_serialize(&MatmulKey {
        n: 256,
        m: 128,
        dtype: "float16",
        k: 64,
        split: Some(2),
    })
    .expect("key");
    assert_ne!(without.fingerprint(), with.fingerprint());
}

#[test]
fn floats_null_and_non_string_map_keys_are_rejected_with_a_reason() {
    #[derive(Serialize)]
    struct WithFloat {
        alpha: f32,
    }
    let err = to_fields(&WithFloat { alpha: 0.5 }).expect_err("floats are refused");
    assert!(err.to_string().contains("floats are not allowed"), "{err}");

    let err = serde_json::from_str::<Value>(r#"{"a": 1.5}"#)
        .expect_err("floats are refused from JSON too");
    assert!(err.to_string().contains("floats are not allowed"), "{err}");
    let err = serde_json::from_str::<Value>(r#"{"a": null}"#).expect_err("null is refused");
    assert!(err.to_string().contains("null"), "{err}");

    let map: std::collections::BTreeMap<u32, u32> = [(1, 2)].into();
    assert!(to_fields(&map).is_err());
    assert!(
        to_fields(&5u32).is_err(),
        "a key must be a map of named fields"
    );
}

#[test]
fn enums_and_tuples_have_a_defined_shape() {
    #[derive(Serialize)]
    enum Layout {
        Nchw,
        Blocked { block: u32 },
    }
    #[derive(Serialize)]
    struct K {
        layout: Layout,
        other: Layout,
        pad: (u8, u8),
    }
    let key = Key::from_serialize(&K {
        layout: Layout::Nchw,
        other: Layout::Blocked { block: 8 },
        pad: (1, 2),
    })
    .expect("key");
    assert_eq!(
        key.to_string(),
        r#"{"layout":"Nchw","other":{"Blocked":{"block":8}},"pad":[1,2]}"#
    );
}

#[test]
fn fingerprints_parse_back_from_hex() {
    let fp = Key::new(Fields::new()).fingerprint();
    assert_eq!(fp.to_hex().parse::<Fingerprint>(), Ok(fp));
    assert!("xyz".parse::<Fingerprint>().is_err());
    assert!(
        "ae19aa9db9f97bdb96f0fef49a06a9bz"
            .parse::<Fingerprint>()
            .is_err()
    );
}

/// The vectors recomputed by an independent implementation: Python's hashlib and msgpack,
/// sharing no code with this crate. Outside CI a missing Python or msgpack is a loud skip;
/// in CI (`CI=true`) it is a failure.
#[test]
fn python_reproduces_the_vectors_from_the_spec() {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/check_vectors.py");
    let output = std::process::Command::new("python3").arg(&script).output();
    let missing = match &output {
        Err(e) => Some(format!("python3 cannot run: {e}")),
        Ok(o) if String::from_utf8_lossy(&o.stderr).contains("No module named 'msgpack'") => {
            Some("the Python msgpack package is missing (pip install msgpack)".to_owned())
        }
        Ok(_) => None,
    };
    if let Some(why) = missing {
        test_support::skip::missing("the cross-language fingerprint check", &why);
        return;
    }
    let o = output.expect("checked above");
    assert!(
        o.status.success(),
        "the Python implementation disagrees:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Issue 24, case 21: FORMAT.md says a bundle is one msgpack document with nothing after it;
/// an independent msgpack reader (Python's) reads it so: one array of six items.
#[test]
fn a_bundle_is_one_msgpack_document_to_an_independent_reader() {
    use cache_format::bundle::{encode_bundle, manifest_of, read_bundle};
    let data = cache_format::CacheData::new();
    let snapshot = cache_format::encode_snapshot("app", 1, &data);
    let manifest = manifest_of(&data, "app", 1, &snapshot, 0, "test");
    let bytes = encode_bundle(&manifest, &snapshot);
    read_bundle(&bytes, &cache_format::Limits::default()).expect("our reader");
    let dir = test_support::temp_dir();
    let path = dir.path().join("b.tcb");
    std::fs::write(&path, &bytes).expect("write");
    let code = "import msgpack, sys\n\
                doc = msgpack.unpackb(open(sys.argv[1], 'rb').read(), raw=False)\n\
                assert len(doc) == 6 and doc[0] == 'TCBUNDLE' and doc[1] == 2, doc[:2]\n";
    let output = std::process::Command::new("python3")
        .args(["-c", code])
        .arg(&path)
        .output();
    let missing = match &output {
        Err(e) => Some(format!("python3 cannot run: {e}")),
        Ok(o) if String::from_utf8_lossy(&o.stderr).contains("No module named 'msgpack'") => {
            Some("the Python msgpack package is missing (pip install msgpack)".to_owned())
        }
        Ok(_) => None,
    };
    if let Some(why) = missing {
        test_support::skip::missing("the bundle's cross-language check", &why);
        return;
    }
    let o = output.expect("checked above");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}
