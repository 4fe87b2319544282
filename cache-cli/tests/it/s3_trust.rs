//! Generations a fleet can trust (issue 50), against moto: a name squatted before a snapshot
//! is never pointed at; a fetched generation is verified before it is put in place; a prune
//! racing a snapshot never deletes what the pointer names; a generation whose table is a DAG
//! is refused in moments; signed generations are pinned only when a trust policy's threshold
//! of keys signed them, in date and not rolled back, and a policy rotates only when the old
//! keys signed the new one. A refused generation leaves the one a machine had in force.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use test_support::cli::{stderr, stdout};
use test_support::fake_http::Proxy;
use test_support::s3_server::S3Server;

use crate::s3::{BUCKET, lines_with, text, with_bucket};

/// Runs the CLI against `prefix` of the bucket, with `extra` environment.
fn run_on(
    server: &S3Server,
    prefix: &str,
    file: &Path,
    args: &[&str],
    extra: &[(&str, &str)],
) -> Output {
    with_bucket(server, &format!("s3://{BUCKET}/{prefix}"), file, args)
        .envs(extra.iter().copied())
        .output()
        .expect("run tunecache")
}

fn import(server: &S3Server, file: &Path, algo: &str, median: u32, n: u64) {
    let source = file.with_extension(format!("{algo}.jsonl"));
    std::fs::write(&source, lines_with(algo, median, n)).expect("lines");
    let out = run_on(
        server,
        "x",
        file,
        &["import", &source.to_string_lossy()],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(out)))
}

/// `generation snapshot` of `file` to `prefix`, with `args`; its report.
fn snapshot(server: &S3Server, prefix: &str, file: &Path, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--json", "generation", "snapshot"];
    all.extend_from_slice(args);
    let out = run_on(server, prefix, file, &all, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    json(&out)
}

/// The algorithm `get` serves for key 0 on `file` pinned to `current` of `prefix`.
fn pinned_best(
    server: &S3Server,
    prefix: &str,
    file: &Path,
    extra: &[(&str, &str)],
) -> (String, Output) {
    let mut env = vec![("TUNECACHE_GENERATION", "current")];
    env.extend_from_slice(extra);
    let out = run_on(
        server,
        prefix,
        file,
        &["--json", "get", "-n", "matmul", "-k", r#"{"m":0}"#],
        &env,
    );
    let algo = serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .ok()
        .and_then(|v| v["candidates"][0]["algo"].as_str().map(str::to_owned))
        .unwrap_or_default();
    (algo, out)
}

fn put_object(server: &S3Server, path: &str, body: &[u8]) {
    let status = server.request("PUT", &format!("/{BUCKET}/{path}"), body);
    assert_eq!(status, 200, "PUT {path}");
}

fn sha256_hex(bytes: &[u8], dir: &Path) -> String {
    let tmp = dir.join(".hash-me");
    std::fs::write(&tmp, bytes).expect("write");
    let id = cache_remote::generation_id(&tmp).expect("hash");
    std::fs::remove_file(&tmp).expect("remove");
    id
}

#[test]
fn a_squatted_name_is_never_pointed_at_and_a_damaged_generation_is_never_put_in_place() {
    let Some(server) = S3Server::start(BUCKET) else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let a = dir.path().join("a/c.tcache");
    std::fs::create_dir_all(a.parent().expect("folder")).expect("folder");
    import(&server, &a, "tiled", 100, 10);
    // The bytes of a snapshot are reproducible: its name is known before it is published.
    let id = snapshot(&server, "p1", &a, &[])["published"]
        .as_str()
        .expect("an id")
        .to_owned();
    put_object(&server, &format!("p2/generations/{id}.tcb"), b"planted");
    let report = snapshot(&server, "p2", &a, &[]);
    assert_eq!(report["squatted"], id.as_str(), "{report:#}");
    let published = report["published"].as_str().expect("an id");
    assert_ne!(published, id);
    let b = dir.path().join("b/c.tcache");
    let (algo, out) = pinned_best(&server, "p2", &b, &[]);
    assert_eq!(
        algo,
        "tiled",
        "the pointer names a sound generation: {}",
        text(&out)
    );
    // A generation whose bytes hash to its name but are no bundle, and a real one damaged
    // inside, hashing to theirs: refused, and nothing is put in place.
    let mut bundle = std::fs::read(dir.path().join("a/generations").join(format!("{id}.tcb")))
        .expect("the publisher keeps what it published");
    let mid = bundle.len() / 2;
    bundle[mid] ^= 0x40;
    for bytes in [b"hello world".to_vec(), bundle] {
        let name = sha256_hex(&bytes, dir.path());
        put_object(&server, &format!("p3/generations/{name}.tcb"), &bytes);
        let c = dir.path().join("c/c.tcache");
        let out = run_on(&server, "p3", &c, &["generation", "fetch", &name], &[]);
        assert_ne!(out.status.code(), Some(0), "{}", text(&out));
        assert!(stderr(&out).contains("damaged"), "{}", text(&out));
        let kept: Vec<_> = std::fs::read_dir(dir.path().join("c/generations"))
            .map(|d| d.flatten().map(|f| f.file_name()).collect())
            .unwrap_or_default();
        assert!(kept.is_empty(), "nothing left in place: {kept:?}");
    }
    // A malformed id is said as such.
    let out = run_on(
        &server,
        "p3",
        &a,
        &["generation", "fetch", "../../etc"],
        &[],
    );
    assert!(
        stderr(&out).contains("not a generation id"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_prune_racing_a_snapshot_never_deletes_what_the_pointer_names() {
    let Some(server) = S3Server::start(BUCKET) else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let a = dir.path().join("a.tcache");
    import(&server, &a, "tiled", 100, 5);
    let old_copy = dir.path().join("old.tcache");
    std::fs::copy(&a, &old_copy).expect("copy");
    let g1 = snapshot(&server, "p", &a, &[])["published"]
        .as_str()
        .expect("id")
        .to_owned();
    import(&server, &a, "blocked", 50, 5);
    let g2 = snapshot(&server, "p", &a, &[])["published"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_ne!(g1, g2);
    // The prune's listing is held by a proxy while a snapshot of the old contents (the same
    // bytes: the same name, G1) moves the pointer back to G1.
    let port: u16 = server
        .endpoint()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port");
    let proxy = Proxy::start(port, |r| {
        r.method == "GET" && r.target.contains("list-type=2")
    });
    let mut prune = with_bucket(
        &server,
        &format!("s3://{BUCKET}/p"),
        &a,
        &["--json", "generation", "prune", "--older-than-days", "0"],
    );
    prune.env("AWS_ENDPOINT_URL", proxy.url());
    let prune = prune
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("prune");
    let started = Instant::now();
    while proxy.held() == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the listing never came"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let again = snapshot(&server, "p", &old_copy, &[]);
    assert_eq!(
        again["published"],
        g1.as_str(),
        "the same contents, the same name"
    );
    proxy.gate.store(true, std::sync::atomic::Ordering::Relaxed);
    let out = prune.wait_with_output().expect("prune ends");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let pruned = json(&out)["pruned"].as_array().cloned().unwrap_or_default();
    assert!(
        pruned.iter().all(|p| p != g1.as_str()),
        "the current generation was deleted: {pruned:?}"
    );
    let b = dir.path().join("b.tcache");
    let (algo, o) = pinned_best(&server, "p", &b, &[]);
    assert_eq!(algo, "tiled", "current is G1, whole: {}", text(&o));
}

#[test]
fn a_generation_whose_table_is_a_dag_is_refused_in_moments() {
    use cache_core::cache_format::Limits;
    use cache_core::cache_format::bundle::{encode_bundle, read_bundle};
    let Some(server) = S3Server::start(BUCKET) else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let a = dir.path().join("a.tcache");
    import(&server, &a, "tiled", 100, 300);
    let bundle_path = dir.path().join("b.tcb");
    let out = run_on(
        &server,
        "x",
        &a,
        &["bundle", "create", "-o", &bundle_path.to_string_lossy()],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let bytes = std::fs::read(&bundle_path).expect("bundle");
    let bundle = read_bundle(&bytes, &Limits::default()).expect("a bundle");
    let dag = test_support::craft::dag(bundle.snapshot.to_vec(), 8);
    let mut manifest = bundle.manifest.clone();
    manifest.payload_sha256 = sha256_hex(&dag, dir.path());
    let hostile = encode_bundle(&manifest, &dag);
    let name = sha256_hex(&hostile, dir.path());
    put_object(&server, &format!("d/generations/{name}.tcb"), &hostile);
    put_object(
        &server,
        "d/generations/current",
        format!("{{\"generation\": \"{name}\", \"published_at\": 1}}").as_bytes(),
    );
    let started = Instant::now();
    let (algo, out) = pinned_best(&server, "d", &dir.path().join("c.tcache"), &[]);
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(algo, "", "nothing served from it: {}", text(&out));
    assert!(stderr(&out).contains("is not used"), "{}", text(&out));
}

/// Writes a key pair `name` in `dir`; the secret key's path and the public one's.
fn key(server: &S3Server, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let prefix = dir.join(name);
    let out = run_on(
        server,
        "x",
        &dir.join("k.tcache"),
        &["keys", "generate", "-o", &prefix.to_string_lossy()],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    (prefix.with_extension("key"), prefix.with_extension("pub"))
}

fn policy(server: &S3Server, dir: &Path, out_name: &str, args: &[String]) -> PathBuf {
    let path = dir.join(out_name);
    let mut all: Vec<String> = vec![
        "keys".into(),
        "policy".into(),
        "-o".into(),
        path.to_string_lossy().into(),
    ];
    all.extend(args.iter().cloned());
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    let out = run_on(server, "x", &dir.join("k.tcache"), &refs, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    path
}

#[test]
fn signed_generations_are_pinned_only_as_the_trust_policy_says() {
    let Some(server) = S3Server::start(BUCKET) else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let keys = dir.path().join("keys");
    std::fs::create_dir(&keys).expect("keys");
    let (k1, p1) = key(&server, &keys, "k1");
    let (k2, p2) = key(&server, &keys, "k2");
    let (k3, p3) = key(&server, &keys, "k3");
    let s = |p: &Path| p.to_string_lossy().into_owned();
    let trust = policy(
        &server,
        &keys,
        "trust.json",
        &[
            "--threshold".into(),
            "2".into(),
            "--key".into(),
            s(&p1),
            "--key".into(),
            s(&p2),
        ],
    );
    let trust_env = s(&trust);
    let env = [("TUNECACHE_TRUST", trust_env.as_str())];
    // The publisher's cache; each new generation has new contents (its own winner for key 0).
    let a = dir.path().join("a.tcache");
    let rank = dir.path().join("rank/c.tcache");
    std::fs::create_dir_all(rank.parent().expect("folder")).expect("folder");
    let publish = |algo: &str, median: u32, args: &[&str]| {
        import(&server, &a, algo, median, 3);
        snapshot(&server, "t", &a, args)
    };
    let (k1s, k2s, k3s) = (s(&k1), s(&k2), s(&k3));
    let good = publish("first", 900, &["--sign", &k1s, "--sign", &k2s]);
    assert_eq!(good["number"], 1, "{good:#}");
    let (algo, out) = pinned_best(&server, "t", &rank, &env);
    assert_eq!(
        algo,
        "first",
        "a generation two trusted keys signed is pinned: {}",
        text(&out)
    );
    // Each refused one leaves the one the rank had in force, with a message naming why.
    let refusals: [(&str, u32, Vec<&str>, &str); 4] = [
        ("unsigned", 800, vec![], "not signed"),
        (
            "stranger",
            700,
            vec!["--sign", &k3s],
            "no key of the policy",
        ),
        ("half", 600, vec!["--sign", &k1s], "1 of the 2 keys"),
        (
            "expired",
            500,
            vec!["--sign", &k1s, "--sign", &k2s, "--expires-days", "0"],
            "expired",
        ),
    ];
    for (algo, median, args, why) in refusals {
        publish(algo, median, &args);
        let (served, out) = pinned_best(&server, "t", &rank, &env);
        assert_eq!(served, "first", "{algo}: {}", text(&out));
        assert!(stderr(&out).contains(why), "{algo}: {}", text(&out));
    }
    // A second good one (number 2), then a rollback to number 1.
    let second = publish(
        "second",
        400,
        &["--sign", &k1s, "--sign", &k2s, "--number", "2"],
    );
    assert_eq!(second["number"], 2);
    assert_eq!(pinned_best(&server, "t", &rank, &env).0, "second");
    publish(
        "rolledback",
        300,
        &["--sign", &k1s, "--sign", &k2s, "--number", "1"],
    );
    let (served, out) = pinned_best(&server, "t", &rank, &env);
    assert_eq!(served, "second", "{}", text(&out));
    assert!(stderr(&out).contains("rollback"), "{}", text(&out));
    // A statement tampered with after signing: the second generation's signatures, its
    // statement made to name another (unsigned) generation. Refused.
    let second_id = second["published"].as_str().expect("id").to_owned();
    let tampered = publish("tampered", 250, &[]);
    let id = tampered["published"].as_str().expect("id");
    let sig = std::fs::read_to_string(dir.path().join(format!("generations/{second_id}.tcb.sig")))
        .expect("the publisher keeps the signature beside the generation");
    let forged = sig.replace(&second_id, id);
    assert_ne!(forged, sig, "the bundle's hash is in the statement's text");
    put_object(
        &server,
        &format!("t/generations/{id}.sig"),
        forged.as_bytes(),
    );
    let (served, out) = pinned_best(&server, "t", &rank, &env);
    assert_eq!(served, "second", "{}", text(&out));
    assert!(stderr(&out).contains("do not verify"), "{}", text(&out));
    // A policy rotated to k3 without the old keys' signatures is not taken.
    let rogue = policy(
        &server,
        &keys,
        "rogue.json",
        &["--version".into(), "2".into(), "--key".into(), s(&p3)],
    );
    let rogue_env = s(&rogue);
    publish("byk3", 200, &["--sign", &k3s, "--number", "4"]);
    let (served, out) = pinned_best(
        &server,
        "t",
        &rank,
        &[("TUNECACHE_TRUST", rogue_env.as_str())],
    );
    assert_eq!(served, "second", "{}", text(&out));
    assert!(stderr(&out).contains("is not taken"), "{}", text(&out));
    // Rotated with the old keys' signatures: taken, and k3's generation is pinned.
    let rotated = policy(
        &server,
        &keys,
        "rotated.json",
        &[
            "--version".into(),
            "2".into(),
            "--key".into(),
            s(&p3),
            "--sign".into(),
            k1s.clone(),
            "--sign".into(),
            k2s.clone(),
        ],
    );
    let rotated_env = s(&rotated);
    let (served, out) = pinned_best(
        &server,
        "t",
        &rank,
        &[("TUNECACHE_TRUST", rotated_env.as_str())],
    );
    assert_eq!(served, "byk3", "{}", text(&out));
    let _ = stdout(&out);
}
