//! The cases every store runs (see the module above): reads, put-if, fenced writes, leases
//! (their operations, expiry, a race, a takeover by a cache, a holder that lost its lease),
//! values tunecache did not write, listing, and faults (a frozen store, an unreachable one).
//! Each case uses keys of its own (ids 100 apart).

use std::time::{Duration, Instant};

use cache_core::Store as _;
use cache_remote::{
    Fence, FinishError, FleetClaim, LeaseGuard, LeaseOp, LeaseReply, Read, Remote,
    RemoteCache as _, RemoteError, Swap, Swapped,
};

use super::{Store, keys};
use crate::{entry, key, ns};

pub(super) type Case = fn(&Store);

/// One call to a store by a deadline, its answer dropped.
type Call<'a> = dyn Fn(Instant) -> Result<(), RemoteError> + 'a;

/// Every case, in the order each store runs them.
pub(super) const CASES: &[(&str, Case)] = &[
    ("reads", reads_keep_order_absence_and_the_limit),
    ("put-if", a_swap_sets_only_over_what_it_expected),
    ("fences", a_fenced_swap_writes_only_under_its_lease),
    (
        "lease operations",
        a_lease_is_renewed_and_released_only_by_its_holder,
    ),
    ("lease expiry", a_lease_not_renewed_expires_and_is_free),
    (
        "lease race",
        of_eight_clients_racing_for_one_lease_one_takes_it,
    ),
    (
        "takeover",
        a_dead_holders_lease_is_taken_over_and_kept_by_a_cache,
    ),
    (
        "lost lease",
        a_holder_that_lost_its_lease_cannot_publish_over_the_key,
    ),
    (
        "foreign values",
        values_tunecache_did_not_write_are_not_trusted_or_touched,
    ),
    ("listing", listing_finds_the_matching_keys_and_no_others),
    ("frozen", a_frozen_store_answers_every_call_by_its_deadline),
    ("unreachable", an_unreachable_store_is_an_outage_at_once),
];

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(5)
}

fn holder(n: u64) -> Vec<u8> {
    format!("tclease1 {n:032x} pid=1 host=elsewhere").into_bytes()
}

fn read(limit: usize) -> Read {
    Read { touch: None, limit }
}

/// The bytes at `key`, whatever they are.
fn raw(r: &dyn Remote, key: &str) -> Option<Vec<u8>> {
    r.get_many(&[key.to_owned()], read(1 << 20), soon())
        .expect("read")
        .remove(0)
}

/// Replaces the value at `key` with `value`, whatever it held.
fn plant(r: &dyn Remote, key: &str, value: &[u8]) {
    let now = raw(r, key);
    let swap = Swap {
        key,
        expected: now.as_deref(),
        value,
        fence: None,
    };
    assert_eq!(
        r.compare_and_set_many(&[swap], None, soon()),
        Ok(vec![Swapped::Set]),
        "plant {key}"
    );
}

fn swap_one(r: &dyn Remote, swap: Swap<'_>) -> Swapped {
    let mut done = r
        .compare_and_set_many(&[swap], None, soon())
        .expect("answered");
    assert_eq!(done.len(), 1);
    done.remove(0)
}

fn acquire(r: &dyn Remote, lease: &str, value: &[u8], ttl: Duration) -> LeaseReply {
    r.lease(lease, LeaseOp::Acquire { value, ttl }, soon())
        .expect("answered")
}

fn peek(r: &dyn Remote, lease: &str) -> LeaseReply {
    r.lease(lease, LeaseOp::Peek, soon()).expect("answered")
}

fn reads_keep_order_absence_and_the_limit(store: &Store) {
    let r = store.client();
    let (absent, short, long) = (keys(100).0, keys(101).0, keys(102).0);
    plant(&*r, &short, b"short");
    plant(&*r, &long, &[7u8; 4096]);
    let got = r
        .get_many(&[long.clone(), absent, short.clone()], read(100), soon())
        .expect("read");
    assert_eq!(
        got,
        [Some(vec![7u8; 101]), None, Some(b"short".to_vec())],
        "in order, absent as None, a long value cut to the limit and one byte"
    );
    assert_eq!(r.get_many(&[], read(100), soon()), Ok(Vec::new()));
    for (limit, want) in [(5, &b"short"[..]), (4, b"short"), (2, b"sho")] {
        assert_eq!(
            r.get_many(std::slice::from_ref(&short), read(limit), soon()),
            Ok(vec![Some(want.to_vec())]),
            "limit {limit}"
        );
    }
    r.ping(soon()).expect("ping");
}

fn a_swap_sets_only_over_what_it_expected(store: &Store) {
    let r = store.client();
    let k = keys(200).0;
    let swap = |expected: Option<&[u8]>, value: &[u8]| {
        swap_one(
            &*r,
            Swap {
                key: &k,
                expected,
                value,
                fence: None,
            },
        )
    };
    assert_eq!(swap(None, b"one"), Swapped::Set);
    assert_eq!(swap(None, b"two"), Swapped::Changed, "expected absent");
    assert_eq!(swap(Some(b"other"), b"two"), Swapped::Changed);
    assert_eq!(swap(Some(b"on"), b"two"), Swapped::Changed, "a prefix");
    assert_eq!(swap(Some(b"one!"), b"two"), Swapped::Changed, "longer");
    assert_eq!(raw(&*r, &k), Some(b"one".to_vec()), "nothing set");
    assert_eq!(swap(Some(b"one"), b"two"), Swapped::Set);
    assert_eq!(raw(&*r, &k), Some(b"two".to_vec()));
    // A batch: each swap decided on its own, answered in order.
    let (x, y) = (keys(201).0, keys(202).0);
    let batch = [
        Swap {
            key: &x,
            expected: Some(b"nothing"),
            value: b"x",
            fence: None,
        },
        Swap {
            key: &y,
            expected: None,
            value: b"y",
            fence: None,
        },
    ];
    assert_eq!(
        r.compare_and_set_many(&batch, None, soon()),
        Ok(vec![Swapped::Changed, Swapped::Set])
    );
    assert_eq!((raw(&*r, &x), raw(&*r, &y)), (None, Some(b"y".to_vec())));
}

fn a_fenced_swap_writes_only_under_its_lease(store: &Store) {
    let r = store.client();
    let (k, l) = keys(300);
    let (mine, theirs) = (holder(1), holder(2));
    let ttl = Duration::from_secs(30);
    assert_eq!(acquire(&*r, &l, &mine, ttl), LeaseReply::Done);
    let fenced = |expected: Option<&[u8]>, value: &[u8], by: &[u8], unchanged, release| {
        swap_one(
            &*r,
            Swap {
                key: &k,
                expected,
                value,
                fence: Some(Fence {
                    lease: &l,
                    value: by,
                    unchanged,
                    release,
                }),
            },
        )
    };
    assert_eq!(fenced(None, b"mine", &mine, false, false), Swapped::Set);
    assert_eq!(
        fenced(Some(b"mine"), b"theirs", &theirs, true, false),
        Swapped::Fenced,
        "another holder's fence"
    );
    assert_eq!(raw(&*r, &k), Some(b"mine".to_vec()));
    assert_eq!(
        fenced(Some(b"stale"), b"again", &mine, false, true),
        Swapped::Changed,
        "the lease lets it, the value does not"
    );
    assert!(matches!(peek(&*r, &l), LeaseReply::Held { .. }), "kept");
    assert_eq!(
        fenced(Some(b"mine"), b"again", &mine, false, true),
        Swapped::Set
    );
    assert_eq!(peek(&*r, &l), LeaseReply::Absent, "released with the write");
    // The lease gone (as expiry does): only a swap over the entry as it was when the lease
    // was taken (`unchanged`) is let through.
    assert_eq!(
        fenced(Some(b"again"), b"late", &mine, false, false),
        Swapped::Fenced
    );
    assert_eq!(
        fenced(Some(b"again"), b"late", &mine, true, false),
        Swapped::Set
    );
    assert_eq!(raw(&*r, &k), Some(b"late".to_vec()));
    // Taken by another holder meanwhile: fenced whatever `unchanged` says.
    assert_eq!(acquire(&*r, &l, &theirs, ttl), LeaseReply::Done);
    assert_eq!(
        fenced(Some(b"late"), b"later", &mine, true, true),
        Swapped::Fenced
    );
    assert!(
        matches!(peek(&*r, &l), LeaseReply::Held { value, .. } if value == theirs),
        "their lease is left as it is"
    );
}

fn a_lease_is_renewed_and_released_only_by_its_holder(store: &Store) {
    let r = store.client();
    let l = keys(400).1;
    let (mine, theirs) = (holder(1), holder(2));
    let ttl = Duration::from_secs(10);
    assert_eq!(peek(&*r, &l), LeaseReply::Absent);
    assert_eq!(acquire(&*r, &l, &mine, ttl), LeaseReply::Done);
    assert_eq!(acquire(&*r, &l, &mine, ttl), LeaseReply::Done, "renewed");
    match acquire(&*r, &l, &theirs, ttl) {
        LeaseReply::Held {
            value,
            ttl: Some(left),
        } => {
            assert_eq!(value, mine);
            assert!(
                left <= ttl && left >= ttl - Duration::from_secs(3),
                "{left:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    for op in [
        LeaseOp::Renew {
            value: &theirs,
            ttl,
        },
        LeaseOp::Release { value: &theirs },
    ] {
        assert!(
            matches!(r.lease(&l, op, soon()), Ok(LeaseReply::Held { ref value, .. }) if *value == mine),
            "{op:?}"
        );
    }
    assert!(matches!(peek(&*r, &l), LeaseReply::Held { value, .. } if value == mine));
    let renew = |v: &[u8]| r.lease(&l, LeaseOp::Renew { value: v, ttl }, soon());
    let release = |v: &[u8]| r.lease(&l, LeaseOp::Release { value: v }, soon());
    assert_eq!(renew(&mine), Ok(LeaseReply::Done));
    assert_eq!(release(&mine), Ok(LeaseReply::Done));
    assert_eq!(peek(&*r, &l), LeaseReply::Absent);
    assert_eq!(renew(&mine), Ok(LeaseReply::Absent), "a released lease");
    assert_eq!(release(&mine), Ok(LeaseReply::Absent));
    assert_eq!(acquire(&*r, &l, &theirs, ttl), LeaseReply::Done, "free");
}

fn a_lease_not_renewed_expires_and_is_free(store: &Store) {
    let r = store.client();
    let (l, renewed) = (keys(500).1, keys(501).1);
    let ttl = Duration::from_secs(1);
    assert_eq!(acquire(&*r, &l, &holder(3), ttl), LeaseReply::Done);
    assert_eq!(acquire(&*r, &renewed, &holder(5), ttl), LeaseReply::Done);
    let t = Instant::now();
    let mut taken = false;
    while t.elapsed() < Duration::from_secs(8) {
        if t.elapsed() > Duration::from_millis(500) && t.elapsed() < Duration::from_millis(700) {
            let op = LeaseOp::Renew {
                value: &holder(5),
                ttl: Duration::from_secs(30),
            };
            assert_eq!(r.lease(&renewed, op, soon()), Ok(LeaseReply::Done));
        }
        if acquire(&*r, &l, &holder(4), Duration::from_secs(30)) == LeaseReply::Done {
            taken = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let took = t.elapsed();
    assert!(taken, "the lease never expired");
    // The stores' clocks differ in grain (S3 counts whole seconds): never before its time.
    assert!(took >= Duration::from_millis(900), "{took:?}");
    assert!(
        matches!(peek(&*r, &renewed), LeaseReply::Held { value, .. } if value == holder(5)),
        "a renewed lease outlives its first time to live"
    );
}

fn of_eight_clients_racing_for_one_lease_one_takes_it(store: &Store) {
    for round in 0..2u64 {
        let l = keys(600 + round).1;
        let done: Vec<bool> = std::thread::scope(|s| {
            let racers: Vec<_> = (0..8u64)
                .map(|i| {
                    let l = &l;
                    s.spawn(move || {
                        // One client each, as separate processes would have.
                        let r = store.client();
                        acquire(&*r, l, &holder(100 + i), Duration::from_secs(30))
                            == LeaseReply::Done
                    })
                })
                .collect();
            racers
                .into_iter()
                .map(|h| h.join().expect("racer"))
                .collect()
        });
        let won = done.iter().filter(|d| **d).count();
        assert_eq!(won, 1, "round {round}: {done:?}");
    }
}

fn a_dead_holders_lease_is_taken_over_and_kept_by_a_cache(store: &Store) {
    let r = store.client();
    let (id, l) = (700, keys(700).1);
    assert_eq!(
        acquire(&*r, &l, &holder(3), Duration::from_secs(1)),
        LeaseReply::Done
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let c = store.cache(&dir.path().join("a.tcache"), 1_000);
    let t = Instant::now();
    let claim =
        c.remote()
            .expect("remote")
            .claim(ns(), &key(id).fingerprint(), Duration::from_secs(10));
    let took = t.elapsed();
    let FleetClaim::Lead(lease) = claim else {
        panic!("not taken over: {claim:?}");
    };
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(6),
        "{took:?}"
    );
    let h = c.remote_health().expect("remote");
    assert_eq!((h.leases, h.takeovers), (1, 1), "{h:?}");
    // Held past several of its times to live: the renewer keeps it.
    std::thread::sleep(Duration::from_millis(3_000));
    assert!(!lease.lost());
    assert!(matches!(peek(&*r, &l), LeaseReply::Held { .. }));
    drop(lease);
    assert_eq!(peek(&*r, &l), LeaseReply::Absent, "released");
}

/// Takes the lease of key `id` in `c`, which must lead.
fn lead(c: &cache_core::Cache, id: u64) -> LeaseGuard {
    match c
        .remote()
        .expect("remote")
        .claim(ns(), &key(id).fingerprint(), Duration::from_secs(2))
    {
        FleetClaim::Lead(lease) => lease,
        other => panic!("key {id}: {other:?}"),
    }
}

/// The algorithms of the entry the store holds for key `id`, as `reader` reads it.
fn on_store(reader: &cache_core::Cache, id: u64) -> Vec<String> {
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

/// A holder frozen past its lease (simulated: the lease released under its holder, as expiry
/// does) measures a faster candidate than the process that took the key over: its publication
/// is refused, so the fleet keeps the result measured under the lease, and the late one stays
/// local.
fn a_holder_that_lost_its_lease_cannot_publish_over_the_key(store: &Store) {
    let r = store.client();
    let dir = tempfile::tempdir().expect("temp dir");
    let open = |name: &str| store.cache(&dir.path().join(name), 10_000);
    let (late, taker, reader) = (open("late.tcache"), open("taker.tcache"), open("r.tcache"));
    let expire = |id: u64| {
        let l = keys(id).1;
        let LeaseReply::Held { value, .. } = peek(&*r, &l) else {
            panic!("key {id}: no lease to expire");
        };
        let released = r.lease(&l, LeaseOp::Release { value: &value }, soon());
        assert_eq!(released, Ok(LeaseReply::Done));
    };
    let wait = Duration::from_secs(5);

    // Taken over and published by the new holder before the late one finishes.
    let late_lease = lead(&late, 800);
    expire(800);
    let taker_lease = lead(&taker, 800);
    taker.put(ns(), entry(800, "taker", 50.0));
    taker_lease.finish(wait).expect("published");
    late.put(ns(), entry(800, "late", 10.0));
    let refused = late_lease.finish(wait);
    assert!(
        matches!(refused, Err(FinishError::Lost { .. })),
        "{refused:?}"
    );
    assert_eq!(on_store(&reader, 800), ["taker"]);
    let kept = late.get(ns(), &key(800).fingerprint()).expect("kept here");
    assert!(kept.candidates().iter().any(|c| c.id.algorithm == "late"));
    let h = late.remote_health().expect("remote");
    assert_eq!(h.rejected.get("fenced"), Some(&1), "{h:?}");

    // Taken over and still being measured: the late holder writes nothing, and the new
    // holder's lease is left as it is.
    let late_lease = lead(&late, 801);
    expire(801);
    let taker_lease = lead(&taker, 801);
    let (k, l) = keys(801);
    let held = raw(&*r, &l);
    late.put(ns(), entry(801, "late", 10.0));
    assert!(late_lease.finish(wait).is_err());
    assert_eq!(raw(&*r, &k), None);
    assert_eq!(raw(&*r, &l), held);
    drop(taker_lease);

    // Someone else's value put at the lease key meanwhile: fenced, and left as it is.
    let late_lease = lead(&late, 802);
    let (k, l) = keys(802);
    expire(802);
    plant(&*r, &l, b"someone's");
    late.put(ns(), entry(802, "late", 10.0));
    assert!(late_lease.finish(wait).is_err());
    assert_eq!(raw(&*r, &k), None);
    assert_eq!(raw(&*r, &l), Some(b"someone's".to_vec()));

    // Expired, but nobody took the key: nothing was measured meanwhile, so it is published.
    let late_lease = lead(&late, 803);
    expire(803);
    late.put(ns(), entry(803, "late", 10.0));
    late_lease.finish(wait).expect("published");
    assert_eq!(on_store(&reader, 803), ["late"]);

    // A holder's own publication releases its lease.
    let lease = lead(&late, 804);
    late.put(ns(), entry(804, "tiled", 20.0));
    lease.finish(wait).expect("published");
    assert_eq!(peek(&*r, &keys(804).1), LeaseReply::Absent);
    assert_eq!(on_store(&reader, 804), ["tiled"]);
}

fn values_tunecache_did_not_write_are_not_trusted_or_touched(store: &Store) {
    let r = store.client();
    let dir = tempfile::tempdir().expect("temp dir");
    let c = store.cache(&dir.path().join("a.tcache"), 10_000);
    let cases: [(&str, Vec<u8>); 4] = [
        (
            "a value tunecache did not write",
            b"locked by cron".to_vec(),
        ),
        ("an empty value", Vec::new()),
        ("a forged lease that never expires", holder(9)),
        ("bytes that are not text", vec![0xff, 0x00, 0xfe]),
    ];
    for (id, (what, bytes)) in (900..).zip(cases) {
        let l = keys(id).1;
        plant(&*r, &l, &bytes);
        let t = Instant::now();
        let claim =
            c.remote()
                .expect("remote")
                .claim(ns(), &key(id).fingerprint(), Duration::from_secs(5));
        assert!(matches!(claim, FleetClaim::Alone(_)), "{what}: {claim:?}");
        assert!(t.elapsed() < Duration::from_secs(1), "{what}: waited");
        assert_eq!(raw(&*r, &l), Some(bytes), "{what}: left as it was");
    }
}

fn listing_finds_the_matching_keys_and_no_others(store: &Store) {
    let r = store.client();
    let ks: Vec<String> = (1000..1003).map(|id| keys(id).0).collect();
    for k in &ks {
        plant(&*r, k, b"v");
    }
    let look_alike = format!("{}x", ks[0]);
    plant(&*r, &look_alike, b"not one of them");
    // The keys differ only in their last part (the key's fingerprint).
    let cut = ks[0].rfind(':').expect("a key of parts") + 1;
    let prefix = &ks[0][..cut];
    let all = r.scan(&format!("{prefix}*"), soon()).expect("listed");
    for k in ks.iter().chain([&look_alike]) {
        assert!(all.contains(k), "{k} missing from {all:?}");
    }
    assert!(all.iter().all(|k| k.starts_with(prefix)), "{all:?}");
    assert_eq!(r.scan(&ks[1], soon()), Ok(vec![ks[1].clone()]), "no glob");
    let mut pair = r.scan(&format!("{prefix}*{}", &ks[2][cut + 2..]), soon());
    if let Ok(p) = &mut pair {
        p.sort();
    }
    assert_eq!(pair, Ok(vec![ks[2].clone()]), "a star inside");
    assert_eq!(r.scan("nothing-like-it*", soon()), Ok(Vec::new()));
}

fn a_frozen_store_answers_every_call_by_its_deadline(store: &Store) {
    let r = store.client();
    let (k, l) = keys(1100);
    r.ping(soon()).expect("connected before");
    let frozen = store.freeze();
    let budget = Duration::from_millis(300);
    let calls: [(&str, &Call<'_>); 5] = [
        ("get", &|d| {
            r.get_many(std::slice::from_ref(&k), read(10), d).map(drop)
        }),
        ("put-if", &|d| {
            let swap = Swap {
                key: &k,
                expected: None,
                value: b"v",
                fence: None,
            };
            r.compare_and_set_many(&[swap], None, d).map(drop)
        }),
        ("lease", &|d| r.lease(&l, LeaseOp::Peek, d).map(drop)),
        ("ping", &|d| r.ping(d)),
        ("listing", &|d| r.scan("*", d).map(drop)),
    ];
    for (what, call) in calls {
        let t = Instant::now();
        let got = call(t + budget);
        let took = t.elapsed();
        // Timed out, or (a client that dropped the stuck connection) could not connect
        // again: an outage either way, which the tier's breaker acts on.
        assert!(matches!(&got, Err(e) if e.is_outage()), "{what}: {got:?}");
        assert!(
            took < budget + Duration::from_millis(1_500),
            "{what}: {took:?}"
        );
    }
    drop(frozen);
    let back = test_support::wait_until(Duration::from_secs(10), || r.ping(soon()).is_ok());
    assert!(back, "answers again once thawed");
}

fn an_unreachable_store_is_an_outage_at_once(store: &Store) {
    let u = store.unreachable();
    let (k, l) = keys(1200);
    let t = Instant::now();
    let answers = [
        u.get_many(std::slice::from_ref(&k), read(10), soon())
            .map(drop),
        u.lease(&l, LeaseOp::Peek, soon()).map(drop),
        u.ping(soon()),
    ];
    for got in answers {
        assert!(
            matches!(&got, Err(e) if e.is_outage()),
            "{}: {got:?}",
            u.describe()
        );
    }
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}
