//! The cross-language reader check of the table (format 4): `tests/data/read_table.py`, written
//! from FORMAT.md with Python's standard library and msgpack only, finds what this crate wrote:
//! through internal nodes, after a second commit (slot B), in a scope with fields; it says "no
//! entry" for an absent key, and "damaged" for a flipped bit on its path. Skipped (loudly)
//! without python3 and msgpack; in CI (`CI=true`) that is a failure.

use cache_format::table::{Change, Item, TKey, Table, encode_entry, table_bytes};
use cache_format::{
    CacheData, Candidate, Entry, Fields, Fingerprint, Key, Limits, Origin, Scope, Stats, Value,
};

use crate::table::apply;

fn entry(id: i64, algo: &str) -> Entry {
    let key = Key::new(Fields::from([
        ("id".to_owned(), Value::Int(id)),
        ("dtype".to_owned(), Value::from("f16")),
    ]));
    let stats = Stats {
        median_ns: 100.0 + id as f64,
        min_ns: 99.0,
        spread_ns: 1.0,
        samples: 5,
    };
    let mut c = Candidate::measured(
        algo,
        Fields::from([("tile".to_owned(), Value::Int(32))]),
        stats,
    );
    c.measured_at = 7;
    Entry::new(
        key,
        Fingerprint::default(),
        Origin::Imported("t".into()),
        7,
        [c],
    )
}

/// Runs the Python reader; `None` (after the loud skip) when Python or msgpack is missing.
fn python(file: &std::path::Path, scope: &str, ns: &str, key: &str) -> Option<(i32, String)> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/read_table.py");
    let out = std::process::Command::new("python3")
        .arg(&script)
        .arg(file)
        .args([scope, ns, key])
        .output();
    let missing = match &out {
        Err(e) => Some(format!("python3 cannot run: {e}")),
        Ok(o) if String::from_utf8_lossy(&o.stderr).contains("No module named 'msgpack'") => {
            Some("the Python msgpack package is missing (pip install msgpack)".to_owned())
        }
        Ok(_) => None,
    };
    if let Some(why) = missing {
        test_support::skip::missing("the table's cross-language reader check", &why);
        return None;
    }
    let o = out.expect("checked above");
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&o.stderr);
    Some((o.status.code().unwrap_or(-1), format!("{stdout}{stderr}")))
}

#[test]
fn python_reads_a_table_from_the_spec_alone() {
    let scope = Scope::new(Fields::from([
        ("device".to_owned(), Value::from("NVIDIA H100")),
        ("sm_count".to_owned(), Value::Int(132)),
    ]));
    let scope_json = r#"{"device": "NVIDIA H100", "sm_count": 132}"#;
    let mut data = CacheData::new();
    // 300 entries: five leaves under an internal root.
    for id in 0..300 {
        data.insert(&scope, "matmul", entry(id, "tiled"));
    }
    let mut file = table_bytes("app", 1, None, &data);
    // A second commit (slot B) replaces entry 150's winner.
    let newer = entry(150, "blocked");
    let key = TKey::of(&scope, "matmul", &newer.fingerprint());
    let bytes = encode_entry(&newer);
    assert!(apply(
        &mut file,
        &[Item {
            key,
            scope: &scope,
            ns: "matmul"
        }],
        |_, _| Change::Put(bytes.clone()),
    ));
    let t = Table::open(file.clone(), &Limits::default()).expect("opens");
    assert_eq!(t.commit().seq, 2);
    assert!(t.commit().height >= 1, "a tree with internal nodes");
    let dir = test_support::temp_dir();
    let path = dir.path().join("c.tcache");
    std::fs::write(&path, &file).expect("write");
    let key_json = |id: i64| format!(r#"{{"id": {id}, "dtype": "f16"}}"#);
    for (id, algo) in [(0, "tiled"), (150, "blocked"), (299, "tiled")] {
        let Some((code, out)) = python(&path, scope_json, "matmul", &key_json(id)) else {
            return;
        };
        assert_eq!(code, 0, "entry {id}: {out}");
        let got: serde_json::Value = serde_json::from_str(out.trim()).expect("JSON");
        let want = entry(id, algo);
        assert_eq!(got["fp"], want.fingerprint().to_hex(), "{got}");
        assert_eq!(got["candidates"][0]["algo"], algo, "{got}");
    }
    let absent = [
        (scope_json, "matmul", key_json(300)),
        (scope_json, "conv", key_json(1)),
        (
            r#"{"device": "NVIDIA A100", "sm_count": 108}"#,
            "matmul",
            key_json(1),
        ),
    ];
    for (scope, ns, key) in &absent {
        let (code, out) = python(&path, scope, ns, key).expect("ran before");
        assert_eq!(code, 4, "{scope} {ns} {key}: {out}");
    }
    // A flipped bit in entry 150's bytes: the reader says so instead of answering.
    let at = t.locate(&key).expect("reads").expect("present");
    file[at.offset as usize + 5] ^= 0x20;
    std::fs::write(&path, &file).expect("write");
    let (code, out) = python(&path, scope_json, "matmul", &key_json(150)).expect("ran before");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("damaged"), "{out}");
}

#[test]
fn python_refuses_a_node_that_names_itself() {
    // A root whose second record names the root itself, its CRC-32 made to match by four key
    // bytes: a reader that follows references alone loops for ever on a key routed there.
    let scope = Scope::default();
    let mut data = CacheData::new();
    for id in 0..300 {
        data.insert(&scope, "matmul", entry(id, "tiled"));
    }
    let file = test_support::craft::self_naming(table_bytes("app", 1, None, &data));
    let t = Table::open(file.clone(), &Limits::default()).expect("opens");
    // Every key that routes to the second record: the Rust reader refuses it by height.
    let dir = test_support::temp_dir();
    let path = dir.path().join("c.tcache");
    std::fs::write(&path, &file).expect("write");
    let mut tried = 0;
    for id in 0..300 {
        let e = entry(id, "tiled");
        let key = TKey::of(&scope, "matmul", &e.fingerprint());
        if t.locate(&key).is_ok() {
            continue;
        }
        tried += 1;
        let Some((code, out)) = python(
            &path,
            "{}",
            "matmul",
            &format!(r#"{{"id": {id}, "dtype": "f16"}}"#),
        ) else {
            return;
        };
        assert_eq!(code, 1, "{out}");
        assert!(out.contains("on its own path"), "{out}");
        break;
    }
    assert_eq!(tried, 1, "a key routed to the node that names itself");
}
