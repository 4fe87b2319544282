//! The table (format 4): what is built reads back; copy-on-write updates agree with a plain
//! map across many batches and tree heights; each commit lists what it changed; damage costs
//! only what lies under it; and no bytes make a reader panic.

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use cache_format::table::{
    Change, Item, SLOT_A, SLOT_B, TKey, Table, TableBuilder, UpdateOutcome, check_table,
    namespace_hash, table_bytes,
};
use cache_format::{
    CacheData, Candidate, Entry, Fields, Fingerprint, Key, Limits, Origin, Scope, Stats, Value,
};
use proptest::prelude::*;

use crate::strategies::cache_data;

fn entry(id: i64, median: f64) -> Entry {
    let key = Key::new(Fields::from([("id".to_owned(), Value::Int(id))]));
    let stats = Stats {
        median_ns: median,
        min_ns: median,
        spread_ns: 0.0,
        samples: 3,
    };
    let mut c = Candidate::measured("tiled", Fields::new(), stats);
    c.measured_at = 1;
    Entry::new(
        key,
        Fingerprint::default(),
        Origin::measured_by("test-host", 1),
        1,
        [c],
    )
}

fn encoded(e: &Entry) -> Vec<u8> {
    let mut data = CacheData::new();
    data.insert(&Scope::default(), "mm", e.clone());
    // The entry's bytes as a table stores them: one built with it alone.
    let bytes = table_bytes("app", 1, None, &data);
    let t = Table::open(bytes, &Limits::default()).expect("valid");
    let key = tkey(&Scope::default(), "mm", e);
    t.get(&key).expect("readable").expect("present")
}

fn tkey(scope: &Scope, ns: &str, e: &Entry) -> TKey {
    TKey::new(&scope.fingerprint(), &namespace_hash(ns), &e.fingerprint())
}

/// Applies one batch to `file` as a writer would: the appended bytes, then the slot.
pub(crate) fn apply(
    file: &mut Vec<u8>,
    items: &[Item<'_>],
    mut decide: impl FnMut(usize, Option<&[u8]>) -> Change,
) -> bool {
    let t = Table::open(file.clone(), &Limits::default()).expect("opens");
    let mut appended = Vec::new();
    let outcome = t
        .update(
            items,
            &mut |i, old| Ok(decide(i, old.expect("readable"))),
            &mut |b| {
                appended.extend_from_slice(b);
                Ok(())
            },
        )
        .expect("updates");
    match outcome {
        UpdateOutcome::Unchanged => false,
        UpdateOutcome::Changed(u) => {
            assert_eq!(u.at + appended.len() as u64 - appended.len() as u64, u.at);
            assert_eq!(file.len() as u64, t.slot().end());
            file.extend_from_slice(&appended);
            file.extend_from_slice(&u.bytes);
            let at = u.slot_at as usize;
            file[at..at + 64].copy_from_slice(&u.slot);
            true
        }
    }
}

fn empty_table() -> Vec<u8> {
    table_bytes("app", 1, Some(7), &CacheData::new())
}

/// Every key of `model` reads back, the walk is the model in order, and the whole check
/// passes with the model's count.
fn agrees(file: &[u8], model: &BTreeMap<TKey, Entry>) {
    let t = Table::open(file.to_vec(), &Limits::default()).expect("opens");
    for (k, e) in model {
        let bytes = t.get(k).expect("readable").expect("present");
        assert_eq!(&t.decode_entry(k, "mm", &bytes).expect("decodes"), e);
    }
    let walked: Vec<TKey> = t
        .cursor(&TKey([0; 48]))
        .map(|r| r.expect("walks").0)
        .collect();
    assert_eq!(walked, model.keys().copied().collect::<Vec<_>>());
    let report = check_table(&t, |_, _, _| ControlFlow::Continue(()));
    assert_eq!(report.problems, Vec::<String>::new());
    assert_eq!(report.entries, model.len() as u64);
    assert_eq!(t.commit().entries, model.len() as u64);
    assert_eq!(t.directory().expect("dir").entries(), model.len() as u64);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A table built from any data reads back every entry, walks them in key order, passes
    /// the whole check, and the same data always gives the same bytes.
    #[test]
    fn a_built_table_reads_back_and_is_deterministic(data in cache_data()) {
        let bytes = table_bytes("app", 3, None, &data);
        prop_assert_eq!(&bytes, &table_bytes("app", 3, None, &data));
        let t = Table::open(bytes, &Limits::default()).expect("opens");
        prop_assert_eq!(t.commit().entries, data.len() as u64);
        let mut seen = 0;
        for (scope, ns, e) in data.entries() {
            let k = tkey(scope, ns, e);
            let bytes = t.get(&k).expect("readable").expect("present");
            prop_assert_eq!(&t.decode_entry(&k, ns, &bytes).expect("decodes"), e);
            seen += 1;
        }
        let mut walked = CacheData::new();
        let report = check_table(&t, |s, ns, e| {
            walked.insert(s, ns, e);
            ControlFlow::Continue(())
        });
        prop_assert!(report.problems.is_empty(), "{:?}", report.problems);
        prop_assert_eq!(report.entries, seen);
        prop_assert_eq!(walked, data);
    }

    /// Batches of puts, replacements and removals over a few hundred keys (trees of one and two
    /// levels) agree with a plain map after every batch, and each commit lists exactly the keys
    /// it changed.
    #[test]
    fn updates_agree_with_a_plain_map(
        batches in prop::collection::vec(
            prop::collection::btree_map(0i64..400, (0u8..3, 1u32..50), 1..150),
            1..6,
        ),
    ) {
        let mut file = empty_table();
        let mut model: BTreeMap<TKey, Entry> = BTreeMap::new();
        let scope = Scope::default();
        for batch in batches {
            let ops: Vec<(TKey, Entry, u8)> = {
                let mut v: Vec<_> = batch
                    .iter()
                    .map(|(id, (op, m))| {
                        let e = entry(*id, f64::from(*m));
                        (tkey(&scope, "mm", &e), e, *op)
                    })
                    .collect();
                v.sort_by_key(|(key, ..)| *key);
                v
            };
            let items: Vec<Item<'_>> = ops
                .iter()
                .map(|(k, _, _)| Item { key: *k, scope: &scope, ns: "mm" })
                .collect();
            let before = Table::open(file.clone(), &Limits::default()).expect("opens");
            let seq = before.commit().seq;
            let mut expected_changes = Vec::new();
            let changed = apply(&mut file, &items, |i, old| {
                let (k, e, op) = &ops[i];
                match (op, old) {
                    (0, _) => {
                        let new = encoded(e);
                        if old == Some(&new[..]) {
                            Change::Keep
                        } else {
                            expected_changes.push(*k);
                            model.insert(*k, e.clone());
                            Change::Put(new)
                        }
                    }
                    (1, Some(_)) => {
                        expected_changes.push(*k);
                        model.remove(k);
                        Change::Delete
                    }
                    _ => Change::Keep,
                }
            });
            prop_assert_eq!(changed, !expected_changes.is_empty());
            agrees(&file, &model);
            let after = Table::open(file.clone(), &Limits::default()).expect("opens");
            if changed {
                let listed = after.changes_since(seq, 100).expect("reads").expect("history");
                prop_assert_eq!(listed.into_iter().collect::<Vec<_>>(), expected_changes);
                prop_assert_eq!(after.lineage(), 7);
            }
        }
    }

    /// Flipped, cut and inserted bytes anywhere in a table never make opening, looking up,
    /// walking or checking panic.
    #[test]
    fn damaged_tables_never_panic(
        n in 0i64..300,
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in prop::option::of(any::<prop::sample::Index>()),
    ) {
        let mut data = CacheData::new();
        for i in 0..n {
            data.insert(&Scope::default(), "mm", entry(i, 5.0));
        }
        let mut bytes = table_bytes("app", 1, None, &data);
        for (at, b) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= b | 1;
        }
        if let Some(cut) = cut {
            bytes.truncate(cut.index(bytes.len()));
        }
        if let Ok(t) = Table::open(bytes, &Limits::default()) {
            for i in 0..n {
                let e = entry(i, 5.0);
                let k = tkey(&Scope::default(), "mm", &e);
                if let Ok(Some(b)) = t.get(&k) {
                    let _ = t.decode_entry(&k, "mm", &b);
                }
            }
            // A walk ends whatever the bytes say, and goes on past damage.
            for r in t.cursor(&TKey([0; 48])).take(1000) {
                let _ = r;
            }
            let _ = check_table(&t, |_, _, _| ControlFlow::Continue(()));
            let _ = t.changes_since(0, 10);
        }
    }
}

/// Twenty thousand entries (a tree of height 2), then batches that grow, replace and remove
/// across it: every key reads back after each, and a walk from the middle starts where asked.
#[test]
fn a_tall_tree_takes_batches_and_walks_from_any_key() {
    let scope = Scope::default();
    let mut data = CacheData::new();
    for i in 0..20_000 {
        data.insert(&scope, "mm", entry(i, 5.0));
    }
    let mut file = table_bytes("app", 1, None, &data);
    let mut model: BTreeMap<TKey, Entry> = data
        .entries()
        .map(|(s, ns, e)| (tkey(s, ns, e), e.clone()))
        .collect();
    let t = Table::open(file.clone(), &Limits::default()).expect("opens");
    assert_eq!(t.commit().height, 2);
    for round in 0..4i64 {
        let ops: Vec<(TKey, Entry)> = {
            let mut v: Vec<(TKey, Entry)> = (0..3000)
                .map(|j| {
                    let e = entry(round * 7919 + j * 13, 9.0 + round as f64);
                    (tkey(&scope, "mm", &e), e)
                })
                .collect();
            v.sort_by_key(|(key, ..)| *key);
            v.dedup_by(|a, b| a.0 == b.0);
            v
        };
        let items: Vec<Item<'_>> = ops
            .iter()
            .map(|(k, _)| Item {
                key: *k,
                scope: &scope,
                ns: "mm",
            })
            .collect();
        apply(&mut file, &items, |i, _| {
            let (k, e) = &ops[i];
            if i % 5 == 0 {
                model.remove(k);
                Change::Delete
            } else {
                model.insert(*k, e.clone());
                Change::Put(encoded(e))
            }
        });
        agrees(&file, &model);
    }
    let t = Table::open(file.clone(), &Limits::default()).expect("opens");
    let middle = *model.keys().nth(model.len() / 2).expect("a key");
    let from: Vec<TKey> = t
        .cursor(&middle)
        .take(5)
        .map(|r| r.expect("walks").0)
        .collect();
    let want: Vec<TKey> = model.range(middle..).take(5).map(|(k, _)| *k).collect();
    assert_eq!(from, want);
}

/// A damaged entry is that entry's error alone; a damaged current slot falls back to the
/// commit before it; a table cut before its commit is refused.
#[test]
fn damage_costs_only_what_lies_under_it() {
    let scope = Scope::default();
    let mut data = CacheData::new();
    for i in 0..500 {
        data.insert(&scope, "mm", entry(i, 5.0));
    }
    let clean = table_bytes("app", 1, None, &data);
    let t = Table::open(clean.clone(), &Limits::default()).expect("opens");
    let victim = entry(123, 5.0);
    let vk = tkey(&scope, "mm", &victim);
    let at = t.locate(&vk).expect("reads").expect("present");
    let mut damaged = clean.clone();
    damaged[at.offset as usize + 5] ^= 0x20;
    let t = Table::open(damaged, &Limits::default()).expect("opens");
    assert!(t.get(&vk).is_err(), "the damaged entry is an error");
    for i in [0, 122, 124, 499] {
        let e = entry(i, 5.0);
        assert!(t.get(&tkey(&scope, "mm", &e)).expect("fine").is_some());
    }
    let report = check_table(&t, |_, _, _| ControlFlow::Continue(()));
    assert_eq!(report.entries, 499);
    assert_eq!(report.problems.len(), 2, "{:?}", report.problems);
    assert!(report.problems[0].contains(&victim.fingerprint().to_hex()));
    assert!(report.problems[1].starts_with("1 of the 500 entries of namespace \"mm\""));

    // One more commit, then its slot damaged: the reader falls back to the first commit.
    let mut file = clean.clone();
    let e = entry(10_000, 1.0);
    let k = tkey(&scope, "mm", &e);
    apply(
        &mut file,
        &[Item {
            key: k,
            scope: &scope,
            ns: "mm",
        }],
        |_, _| Change::Put(encoded(&e)),
    );
    let t = Table::open(file.clone(), &Limits::default()).expect("opens");
    assert_eq!(t.commit().seq, 2);
    assert_eq!(t.slot_at(), SLOT_B);
    assert_eq!(t.recovered_slot(), None);
    // Its slot damaged, its commit block whole at the file's end: the commit is found by its
    // block (it was synced before its slot was written), not dropped.
    let mut torn = file.clone();
    torn[SLOT_B as usize + 9] ^= 1;
    let t = Table::open(torn.clone(), &Limits::default()).expect("recovers");
    assert_eq!((t.commit().seq, t.slot_at()), (2, SLOT_B));
    assert_eq!(t.recovered_slot(), Some(SLOT_B));
    assert!(t.get(&k).expect("reads").is_some());
    // The same damaged slot with the commit block cut short: the first commit serves.
    let cut = &torn[..torn.len() - 3];
    let t = Table::open(cut.to_vec(), &Limits::default()).expect("falls back");
    assert_eq!((t.commit().seq, t.slot_at()), (1, SLOT_A));
    assert!(t.get(&k).expect("reads").is_none());
    // A sound slot naming a commit cut short: the first commit serves, and the one passed
    // over is said (a slot is written only after its commit is synced: this is damage).
    let cut = &file[..file.len() - 3];
    let t = Table::open(cut.to_vec(), &Limits::default()).expect("falls back");
    assert_eq!(t.commit().seq, 1);
    let passed = t.passed_over().expect("the newer commit is said");
    assert_eq!((passed.seq, passed.slot_at), (2, SLOT_B));
    // So is one whose block fails its checksum.
    let mut flipped = file.clone();
    let last = flipped.len() - 10;
    flipped[last] ^= 0x10;
    let t = Table::open(flipped, &Limits::default()).expect("falls back");
    assert_eq!(t.commit().seq, 1);
    assert_eq!(t.passed_over().map(|p| p.seq), Some(2));
    assert!(
        Table::open(file.clone(), &Limits::default())
            .expect("opens")
            .passed_over()
            .is_none()
    );
    // An older slot damaged while the newest is sound: nothing to recover, the newest serves.
    let mut older = file.clone();
    older[SLOT_A as usize + 9] ^= 1;
    let t = Table::open(older, &Limits::default()).expect("opens");
    assert_eq!((t.commit().seq, t.recovered_slot()), (2, None));
    // Cut into the first table: refused.
    assert!(Table::open(clean[..clean.len() / 2].to_vec(), &Limits::default()).is_err());
}

/// A builder refuses keys out of order or filed under another scope or namespace.
#[test]
fn a_builder_refuses_keys_out_of_order() {
    let scope = Scope::default();
    let (a, b) = (entry(1, 1.0), entry(2, 1.0));
    let (ka, kb) = (tkey(&scope, "mm", &a), tkey(&scope, "mm", &b));
    let (lo, hi) = if ka < kb { (&a, &b) } else { (&b, &a) };
    let mut builder = TableBuilder::new("app", 1, None);
    builder.add_entry(&scope, "mm", hi).expect("first");
    assert!(builder.add_entry(&scope, "mm", lo).is_err());
    assert!(builder.add_entry(&scope, "mm", hi).is_err(), "a key twice");
    let other = Scope::new(Fields::from([("gpu".to_owned(), Value::Str("x".into()))]));
    let wrong = tkey(&other, "mm", &entry(5, 1.0));
    assert!(
        builder
            .add(wrong, &scope, "mm", &encoded(&entry(5, 1.0)))
            .is_err()
    );
}

/// A table of `n` entries of namespace "mm" in the default scope.
fn table_of(n: i64) -> Vec<u8> {
    let mut data = CacheData::new();
    for i in 0..n {
        data.insert(&Scope::default(), "mm", entry(i, 5.0));
    }
    table_bytes("app", 1, Some(7), &data)
}

#[test]
fn a_tree_whose_nodes_name_one_child_many_times_is_walked_once_per_node() {
    // Six levels of 128 records each naming the level below: a naive walk visits 128^6
    // leaves (4.4e12) in a file of a few kilobytes more than the table's.
    let bytes = test_support::craft::dag(table_of(300), 6);
    let t = Table::open(bytes, &Limits::default()).expect("opens");
    let started = std::time::Instant::now();
    let items: Vec<_> = t.cursor(&TKey([0; 48])).collect();
    let entries = items.iter().filter(|i| i.is_ok()).count();
    let lost: Vec<String> = items
        .iter()
        .filter_map(|i| i.as_ref().err().map(ToString::to_string))
        .collect();
    assert_eq!(entries, 64, "the first leaf, once");
    assert_eq!(
        lost.len(),
        6,
        "each node named twice is said once: {lost:#?}"
    );
    assert!(lost.iter().all(|l| l.contains("named a second time")));
    let report = check_table(&t, |_, _, _| ControlFlow::Continue(()));
    assert_eq!(report.entries, 64);
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.contains("236 of the 300 entries of namespace \"mm\"")),
        "{:#?}",
        report.problems
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
}

#[test]
fn a_damaged_node_costs_its_own_entries_and_the_walk_goes_on() {
    let bytes = table_of(1000);
    let t = Table::open(bytes.clone(), &Limits::default()).expect("opens");
    let all: Vec<TKey> = t
        .cursor(&TKey([0; 48]))
        .map(|r| r.expect("walks").0)
        .collect();
    // The leaf holding the 500th key: its record's key appears in the file once, in its leaf
    // (the 500th key is not the first of a leaf).
    let victim = all[500];
    let at = bytes
        .windows(48)
        .position(|w| w == victim.0)
        .expect("the key is in its leaf");
    let mut damaged = bytes;
    damaged[at + 3] ^= 0x10;
    let t = Table::open(damaged, &Limits::default()).expect("opens");
    let items: Vec<_> = t.cursor(&TKey([0; 48])).collect();
    let walked: Vec<TKey> = items
        .iter()
        .filter_map(|i| i.as_ref().ok().map(|k| k.0))
        .collect();
    let lost: Vec<&cache_format::table::Lost> =
        items.iter().filter_map(|i| i.as_ref().err()).collect();
    assert_eq!(lost.len(), 1);
    let (from, to) = (
        lost[0].from.expect("a lower key"),
        lost[0].to.expect("an upper key"),
    );
    assert!(from <= victim && victim < to);
    let under: Vec<TKey> = all
        .iter()
        .copied()
        .filter(|k| *k >= from && *k < to)
        .collect();
    assert_eq!(under.len(), 64, "a whole leaf");
    let rest: Vec<TKey> = all
        .iter()
        .copied()
        .filter(|k| *k < from || *k >= to)
        .collect();
    assert_eq!(
        walked, rest,
        "every entry outside the damaged leaf, in order"
    );
    // From the middle of the damage, a cursor starts at the first key after it.
    let from_victim: Vec<TKey> = t
        .cursor(&victim)
        .filter_map(Result::ok)
        .map(|k| k.0)
        .take(3)
        .collect();
    assert_eq!(
        from_victim,
        rest.iter()
            .copied()
            .filter(|k| *k >= to)
            .take(3)
            .collect::<Vec<_>>()
    );
}
