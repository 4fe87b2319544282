//! The format's vectors for signed generations and trust policies
//! (`cache-format/tests/data/vectors/trust`, its README says how another implementation runs
//! them): test keys, policies and signature files over the committed `bundle.tcb`, and
//! `cases.json`, what a correct verifier decides for each. This test checks that this build
//! writes every file byte for byte as committed (ed25519 signs deterministically), that the
//! library decides each case as committed, and that the independent Python verifier
//! (`read_trust.py`, written from FORMAT.md with the standard library only) agrees.
//! `TUNECACHE_BLESS_VECTORS=1` writes the files and the decisions instead.

use std::path::{Path, PathBuf};

use cache_core::cache_format::Limits;
use cache_remote::trust::{KeyPair, PublicKey, Signed, Statement, Trust, TrustError};
use ring::signature::KeyPair as _;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

/// The instant every case is decided at (Unix seconds).
const NOW: u64 = 1_800_000_000;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../cache-format/tests/data/vectors/trust")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A test key's secret file: its seed is SHA-256 of `tunecache test vector key <name>`.
fn secret_text(name: &str) -> String {
    let seed = Sha256::digest(format!("tunecache test vector key {name}").as_bytes());
    let pair = ring::signature::Ed25519KeyPair::from_seed_unchecked(&seed).expect("a seed");
    let public = pair.public_key().as_ref();
    let mut id = Sha256::new();
    id.update(b"tunecache/key/1\0");
    id.update(public);
    let file = json!({
        "kind": "tunecache-ed25519-secret",
        "key_id": hex(&id.finalize()[..8]),
        "public": hex(public),
        "seed": hex(&seed),
    });
    format!("{file}\n")
}

/// The files of this folder, as this build writes them: (name, text).
struct Files {
    texts: Vec<(String, String)>,
}

impl Files {
    fn put(&mut self, name: &str, text: String) {
        self.texts.push((name.to_owned(), text));
    }
}

fn key(root: &Path, name: &str) -> KeyPair {
    KeyPair::read(&root.join(format!("key-{name}.secret"))).expect("a committed key")
}

/// A statement's signature file with its text exactly `text`, signed by `by`.
fn signed_text(text: &str, by: &[&KeyPair]) -> String {
    let mut message = b"tunecache/statement/1\0".to_vec();
    message.extend_from_slice(text.as_bytes());
    let sigs: Vec<Value> = by
        .iter()
        .map(|k| json!({"key_id": k.public().key_id, "sig": hex(&k.sign(&message))}))
        .collect();
    let file = json!({"kind": "tunecache-signatures-1", "statement": text, "signatures": sigs});
    format!("{file}\n")
}

/// Every file but the keys, written from the keys and the committed bundle.
fn written(root: &Path, sha: &str, app: &str, scopes: &[String]) -> Files {
    let (a, b, c, d) = (
        key(root, "a"),
        key(root, "b"),
        key(root, "c"),
        key(root, "d"),
    );
    let public = |k: &KeyPair| -> PublicKey { k.public().clone() };
    let mut f = Files { texts: Vec::new() };
    let policy = |v, t, keys: Vec<PublicKey>, by: &[KeyPair]| -> String {
        Trust::write(v, t, keys, by).expect("a sound policy")
    };
    f.put(
        "policy-1.json",
        policy(1, 2, vec![public(&a), public(&b), public(&c)], &[]),
    );
    let two = |by: &[KeyPair]| policy(2, 1, vec![public(&c), public(&d)], by);
    f.put("policy-2.json", two(&[key(root, "a"), key(root, "b")]));
    f.put("policy-2-weak.json", two(&[key(root, "a")]));
    f.put(
        "policy-1-other.json",
        policy(1, 1, vec![public(&d)], &[key(root, "a"), key(root, "b")]),
    );
    // Policies no verifier may take (written by hand: the library refuses to write them).
    let body = |t: usize, keys: Vec<Value>| {
        let text = json!({"version": 3, "threshold": t, "keys": keys}).to_string();
        format!(
            "{}\n",
            json!({"kind": "tunecache-trust-1", "policy": text, "signatures": []})
        )
    };
    let k = |k: &KeyPair| json!({"key_id": k.public().key_id, "public": k.public().public});
    f.put("policy-threshold-0.json", body(0, vec![k(&a)]));
    f.put("policy-threshold-3.json", body(3, vec![k(&a), k(&b)]));
    f.put("policy-key-twice.json", body(1, vec![k(&a), k(&a)]));
    f.put(
        "policy-wrong-id.json",
        body(
            1,
            vec![json!({"key_id": d.public().key_id, "public": a.public().public})],
        ),
    );
    // The identity point: a key of small order, which verifies forged signatures.
    let mut identity = [0u8; 32];
    identity[0] = 1;
    let mut id = Sha256::new();
    id.update(b"tunecache/key/1\0");
    id.update(identity);
    f.put(
        "policy-small-order-key.json",
        body(
            1,
            vec![json!({"key_id": hex(&id.finalize()[..8]), "public": hex(&identity)})],
        ),
    );
    let statement = |sha: &str, app: &str, scopes: &[String], number, expires| {
        Statement::new(
            sha.to_owned(),
            app.to_owned(),
            1,
            scopes.to_vec(),
            number,
            1_700_000_000,
            expires,
        )
    };
    let good = statement(sha, app, scopes, 7, 1_900_000_000);
    let sign = |s: &Statement, by: &[&str]| {
        let keys: Vec<KeyPair> = by.iter().map(|n| key(root, n)).collect();
        Signed::sign(s, &keys).text()
    };
    f.put("signed-ab.sig", sign(&good, &["a", "b"]));
    f.put("signed-a.sig", sign(&good, &["a"]));
    f.put("signed-ad.sig", sign(&good, &["a", "d"]));
    let text = serde_json::to_string(&good).expect("encodes");
    f.put("signed-aa.sig", signed_text(&text, &[&a, &a]));
    // b's signature with its first byte changed.
    let flipped = sign(&good, &["a", "b"]);
    let b_sig = flipped
        .rsplit("\"sig\":\"")
        .next()
        .expect("a signature")
        .to_owned();
    let changed = format!(
        "{:02x}{}",
        u8::from_str_radix(&b_sig[..2], 16).expect("hex") ^ 1,
        &b_sig[2..]
    );
    f.put("signed-ab-flipped.sig", flipped.replace(&b_sig, &changed));
    // The statement kept as other text: spaced, its fields in another order.
    let spaced = format!(
        "{{ \"number\": 7,  \"kind\": \"tunecache-statement-1\", \"app\": {app:?}, \"schema\": 1, \
         \"bundle_sha256\": \"{sha}\", \"scopes\": {scopes}, \"created\": 1700000000, \
         \"expires\": 1900000000 }}",
        scopes = serde_json::to_string(scopes).expect("encodes")
    );
    f.put("spaced.sig", signed_text(&spaced, &[&a, &b]));
    let other_sha = hex(&Sha256::digest(b"another bundle"));
    f.put(
        "other-bundle.sig",
        sign(
            &statement(&other_sha, app, scopes, 7, 1_900_000_000),
            &["a", "b"],
        ),
    );
    f.put(
        "other-app.sig",
        sign(
            &statement(sha, "other", scopes, 7, 1_900_000_000),
            &["a", "b"],
        ),
    );
    f.put(
        "other-scopes.sig",
        sign(&statement(sha, app, &[], 7, 1_900_000_000), &["a", "b"]),
    );
    f.put(
        "expired.sig",
        sign(&statement(sha, app, scopes, 7, NOW), &["a", "b"]),
    );
    f.put(
        "number-3.sig",
        sign(&statement(sha, app, scopes, 3, 1_900_000_000), &["a", "b"]),
    );
    f.put(
        "not-signatures.sig",
        format!(
            "{}\n",
            json!({"kind": "tunecache-signatures-0", "statement": text, "signatures": []})
        ),
    );
    f
}

/// What a verifier decides: `{"trusted": number}` or `{"refused": class}`.
fn verify(root: &Path, case: &Value, sha: &str, app: &str, scopes: &[String]) -> Value {
    let trust = Trust::read(&root.join(case["policy"].as_str().expect("policy"))).expect("sound");
    let state = tempfile::tempdir().expect("dir");
    let highest = case["highest"].as_u64().unwrap_or(0);
    std::fs::write(
        state.path().join("trust-state.json"),
        json!({"accepted": null, "highest": {app: highest}}).to_string(),
    )
    .expect("write");
    let sig = case["signatures"]
        .as_str()
        .map(|s| std::fs::read(root.join(s)).expect("committed"));
    match trust.verify(sig.as_deref(), sha, (app, 1, scopes), NOW, state.path()) {
        Ok(n) => json!({ "trusted": n }),
        Err(TrustError::Refused(why)) => json!({ "refused": class(&why) }),
        Err(e) => panic!("{}: not a refusal: {e}", case["name"]),
    }
}

/// The class of a refusal, from the library's message.
fn class(why: &str) -> &'static str {
    let classes = [
        ("it is not signed", "not-signed"),
        ("not a signature file", "not-a-signature-file"),
        ("a signature file of kind", "not-a-signature-file"),
        ("signed it", "threshold"),
        ("its statement names the bundle", "other-bundle"),
        ("its statement names \"", "other-app"),
        ("other scopes", "other-scopes"),
        ("expired", "expired"),
        ("a rollback", "rollback"),
    ];
    classes
        .iter()
        .find(|(words, _)| why.contains(words))
        .map_or_else(|| panic!("an unknown refusal: {why}"), |(_, c)| *c)
}

/// Which policy is in force once `given` is offered to a machine that accepted `accepted`
/// (`{"in_force": file}`), or `{"bad-policy": true}` when `given` is not a policy at all.
fn in_force(root: &Path, case: &Value, files: &[&str]) -> Value {
    let state = tempfile::tempdir().expect("dir");
    let read = |name: &str| Trust::read(&root.join(name));
    if let Some(accepted) = case["accepted"].as_str() {
        read(accepted)
            .expect("sound")
            .in_force(state.path())
            .expect("taken");
    }
    let given = match read(case["given"].as_str().expect("given")) {
        Ok(t) => t,
        Err(TrustError::Policy(_)) => return json!({ "bad-policy": true }),
        Err(e) => panic!("{e}"),
    };
    given.in_force(state.path()).expect("a policy in force");
    let kept: Value = serde_json::from_slice(
        &std::fs::read(state.path().join("trust-state.json")).expect("state"),
    )
    .expect("JSON");
    let accepted: Value =
        serde_json::from_str(kept["accepted"].as_str().expect("text")).expect("JSON");
    let name = files
        .iter()
        .find(|f| {
            serde_json::from_slice::<Value>(&std::fs::read(root.join(f)).expect("file"))
                .is_ok_and(|v| v == accepted)
        })
        .expect("a committed policy");
    json!({ "in_force": name })
}

#[test]
fn the_trust_vectors_are_written_and_decided_as_committed() {
    let root = dir();
    let bless = std::env::var_os("TUNECACHE_BLESS_VECTORS").is_some();
    let bundle = root.join("../bundle.tcb");
    let sha = hex(&Sha256::digest(std::fs::read(&bundle).expect("committed")));
    let manifest = cache_core::check_bundle(&bundle, &Limits::default())
        .expect("read")
        .manifest
        .expect("a manifest");
    let scopes: Vec<String> = manifest
        .scopes
        .iter()
        .map(|s| s.fingerprint.clone())
        .collect();
    for name in ["a", "b", "c", "d"] {
        let at = root.join(format!("key-{name}.secret"));
        if bless {
            std::fs::write(&at, secret_text(name)).expect("write");
        }
        assert_eq!(
            std::fs::read_to_string(&at).expect("committed"),
            secret_text(name)
        );
    }
    let files = written(&root, &sha, &manifest.app, &scopes);
    for (name, text) in &files.texts {
        let at = root.join(name);
        if bless {
            std::fs::write(&at, text).expect("write");
        }
        assert_eq!(
            &std::fs::read_to_string(&at).expect("a committed vector"),
            text,
            "{name}: this build no longer writes the committed bytes"
        );
    }
    let cases_at = root.join("cases.json");
    let mut cases: Value =
        serde_json::from_str(&std::fs::read_to_string(&cases_at).expect("committed"))
            .expect("JSON");
    assert_eq!(cases["now"], NOW);
    let policies: Vec<&str> = files
        .texts
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| n.starts_with("policy-"))
        .collect();
    let mut differ = Vec::new();
    for case in cases["verify"].as_array_mut().expect("verify cases") {
        let got = verify(&root, case, &sha, &manifest.app, &scopes);
        if bless {
            case["want"] = got.clone();
        }
        if got != case["want"] {
            differ.push(format!(
                "{}: got {got}, want {}",
                case["name"], case["want"]
            ));
        }
    }
    for case in cases["policies"].as_array_mut().expect("policy cases") {
        let got = in_force(&root, case, &policies);
        if bless {
            case["want"] = got.clone();
        }
        if got != case["want"] {
            differ.push(format!(
                "{}: got {got}, want {}",
                case["name"], case["want"]
            ));
        }
    }
    if bless {
        let text = serde_json::to_string_pretty(&cases).expect("encodes");
        std::fs::write(&cases_at, text + "\n").expect("write");
    }
    assert!(differ.is_empty(), "{differ:#?}");
    // The independent verifier, from FORMAT.md alone, agrees on every case.
    let out = std::process::Command::new("python3")
        .arg(root.join("read_trust.py"))
        .arg(&root)
        .output();
    let o = match out {
        Ok(o) => o,
        Err(e) => {
            test_support::skip::missing("the trust vectors' Python verifier", &e.to_string());
            return;
        }
    };
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}
