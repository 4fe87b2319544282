//! Fleet leases on a real S3 API server (moto), beyond the conformance suite every store runs
//! (conformance/cases.rs): a lease object's form, released included, and lease objects in
//! tunecache's form but not its values left alone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cache_core::Store as _;
use cache_remote::{
    FleetClaim, LeaseOp, LeaseReply, Read, Remote, RemoteBuilder as _, RemoteCache as _,
    RemoteOptions, S3Remote, Swap, Swapped, lease_key,
};
use test_support::s3_server::S3Server;

use crate::{entry, key, ns, registry, remote_key, scope};

const BUCKET: &str = "fleet-leases";

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(5)
}

fn other_holder(n: u64) -> Vec<u8> {
    format!("tclease1 {n:032x} pid=1 host=elsewhere").into_bytes()
}

fn remote(server: &S3Server) -> S3Remote {
    let env = server.env();
    S3Remote::open(&format!("s3://{BUCKET}/fleet"), |name| {
        env.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone())
    })
    .expect("a valid address")
}

fn cache(path: &std::path::Path, server: &S3Server, lease_ms: u64) -> cache_core::Cache {
    let options = RemoteOptions {
        budget: Duration::from_secs(2),
        lease_ttl: Some(Duration::from_millis(lease_ms)),
        ..RemoteOptions::default()
    };
    cache_core::Cache::builder(registry())
        .file(path)
        .ignore_env()
        .scope(scope())
        .save_delay(Duration::from_millis(20))
        .refresh_interval(None)
        .remote_with(Arc::new(remote(server)) as Arc<dyn Remote>, options)
        .open()
}

/// The bytes of the object at `key`, whatever they are.
fn raw(r: &S3Remote, key: &str) -> Option<Vec<u8>> {
    let read = Read {
        touch: None,
        limit: 1 << 20,
    };
    r.get_many(&[key.to_owned()], read, soon())
        .expect("read")
        .remove(0)
}

/// Replaces the object at `key` with `value`, whatever it held.
fn plant(r: &S3Remote, key: &str, value: &[u8]) {
    let now = raw(r, key);
    let swap = Swap {
        key,
        expected: now.as_deref(),
        value,
        fence: None,
    };
    assert_eq!(
        r.compare_and_set_many(&[swap], None, soon()),
        Ok(vec![Swapped::Set])
    );
}

/// What the lease operations do is the conformance suite's (conformance/cases.rs); what a
/// lease is in a bucket is FORMAT.md's: `tcs3lease1 <ms>\n` and the holder's value, and a
/// released one `tcs3lease1 released\n`.
#[test]
fn a_lease_object_has_the_form_format_md_gives() {
    let Some(server) = S3Server::start(BUCKET) else {
        return;
    };
    let r = remote(&server);
    let k = lease_key(&remote_key(1));
    let mine = other_holder(1);
    let ttl = Duration::from_secs(5);
    assert_eq!(
        r.lease(&k, LeaseOp::Acquire { value: &mine, ttl }, soon()),
        Ok(LeaseReply::Done)
    );
    let mut form = b"tcs3lease1 5000\n".to_vec();
    form.extend_from_slice(&mine);
    assert_eq!(raw(&r, &k), Some(form));
    assert_eq!(
        r.lease(&k, LeaseOp::Release { value: &mine }, soon()),
        Ok(LeaseReply::Done)
    );
    assert_eq!(raw(&r, &k), Some(b"tcs3lease1 released\n".to_vec()));
    assert_eq!(r.lease(&k, LeaseOp::Peek, soon()), Ok(LeaseReply::Absent));
}

#[test]
fn foreign_and_crafted_lease_objects_are_never_trusted_or_touched() {
    let Some(server) = S3Server::start(BUCKET) else {
        return;
    };
    let r = remote(&server);
    let dir = tempfile::tempdir().expect("temp dir");
    let c = cache(&dir.path().join("a.tcache"), &server, 10_000);
    let mut a_day = b"tcs3lease1 86400000\n".to_vec();
    a_day.extend_from_slice(&other_holder(8));
    // Values of any store are the conformance suite's (conformance/cases.rs); these are S3's.
    let cases: [(&str, Vec<u8>); 2] = [
        ("a lease that lasts a day", a_day),
        (
            "a lease whose value is not tunecache's",
            b"tcs3lease1 60000\nsomeone".to_vec(),
        ),
    ];
    for (id, (what, bytes)) in (20..).zip(cases) {
        let k = lease_key(&remote_key(id));
        plant(&r, &k, &bytes);
        let t = Instant::now();
        let claim =
            c.remote()
                .expect("remote")
                .claim(ns(), &key(id).fingerprint(), Duration::from_secs(5));
        assert!(matches!(claim, FleetClaim::Alone(_)), "{what}: {claim:?}");
        assert!(t.elapsed() < Duration::from_secs(1), "{what}: waited");
        assert_eq!(raw(&r, &k), Some(bytes), "{what}: left as it was");
    }
}

fn lead(c: &cache_core::Cache, id: u64) -> cache_remote::LeaseGuard {
    match c
        .remote()
        .expect("remote")
        .claim(ns(), &key(id).fingerprint(), Duration::from_secs(2))
    {
        FleetClaim::Lead(lease) => lease,
        other => panic!("key {id}: {other:?}"),
    }
}

fn on_server(reader: &cache_core::Cache, id: u64) -> Vec<String> {
    reader
        .get(ns(), &key(id).fingerprint())
        .map(|e| {
            e.candidates()
                .iter()
                .map(|c| c.id.algorithm.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// The rest of a lost lease is the conformance suite's (conformance/cases.rs): in a bucket, a
/// holder's own publication leaves its lease object released, in FORMAT.md's form.
#[test]
fn a_publication_leaves_its_lease_object_released() {
    let Some(server) = S3Server::start(BUCKET) else {
        return;
    };
    let r = remote(&server);
    let dir = tempfile::tempdir().expect("temp dir");
    let (c, reader) = (
        cache(&dir.path().join("a.tcache"), &server, 10_000),
        cache(&dir.path().join("r.tcache"), &server, 10_000),
    );
    let lease = lead(&c, 95);
    c.put(ns(), entry(95, "tiled", 20.0));
    lease.finish(Duration::from_secs(5)).expect("published");
    assert_eq!(
        raw(&r, &lease_key(&remote_key(95))),
        Some(b"tcs3lease1 released\n".to_vec())
    );
    assert_eq!(on_server(&reader, 95), ["tiled"]);
}
