//! The format's test vectors (`cache-format/tests/data/vectors`, its README says how another
//! implementation runs them): committed tables and journals, each with the entries a correct
//! reader gives (after the journal, the merge and the ranking) as JSON, and damaged files a
//! reader must refuse. This test checks that this build writes each file byte for byte as
//! committed (FORMAT.md's byte-exact writing and the lineage), that the library's reader
//! gives the committed JSON, that it reports the damaged ones, and that the independent Python
//! reader (`read_all.py`, written from FORMAT.md) agrees on all of it.
//! `TUNECACHE_BLESS_VECTORS=1` writes the files instead (only when the format changes, with a
//! version step: a vector is history).

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use cache_core::cache_format::table::table_bytes;
use cache_core::cache_format::{
    CacheData, Candidate, Entry, Fields, Fingerprint, JournalHeader, Key, Limits, Origin, Scope,
    Stats, Value, encode_journal_header, encode_record,
};

const APP: &str = "vectors";

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../cache-format/tests/data/vectors")
}

fn fields(pairs: &[(&str, Value)]) -> Fields {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

fn scope() -> Scope {
    Scope::new(fields(&[
        ("device", Value::from("vector-gpu")),
        ("sm", Value::Int(80)),
    ]))
}

fn ok(algo: &str, at: u64, median: f64, samples: u32) -> Candidate {
    let mut c = Candidate::measured(
        algo,
        fields(&[("tile", Value::Int(32))]),
        Stats {
            median_ns: median,
            min_ns: median - 1.0,
            spread_ns: 0.5,
            samples,
        },
    );
    c.measured_at = at;
    c
}

fn failed(algo: &str, at: u64, why: &str) -> Candidate {
    let mut c = Candidate::failed(algo, fields(&[("tile", Value::Int(32))]), why);
    c.measured_at = at;
    c
}

fn chosen(algo: &str, at: u64, by: &str) -> Candidate {
    let mut c = Candidate::chosen(algo, fields(&[("tile", Value::Int(32))]), by);
    c.measured_at = at;
    c
}

fn entry(probe: &str, recorded_at: u64, origin: Origin, cands: Vec<Candidate>) -> Entry {
    let key = Key::new(fields(&[("probe", Value::from(probe))]));
    Entry::new(key, Fingerprint::default(), origin, recorded_at, cands)
}

/// The merge and ranking probes (FORMAT.md, "Merging" and "Ranking"): each key's table
/// version and journal version, which a reader must merge as the rules say.
fn probes() -> (CacheData, CacheData) {
    let imported = |t: &str| Origin::Imported(t.to_owned());
    let mut table = CacheData::new();
    let mut journal = CacheData::new();
    let s = scope();
    let mut both = |probe: &str, a: Vec<Candidate>, b: Vec<Candidate>| {
        table.insert(&s, "probe", entry(probe, 50, imported("a"), a));
        journal.insert(&s, "probe", entry(probe, 50, imported("a"), b));
    };
    // 1. Different statuses at the same instant: failed over ok over chosen, figures unread.
    both(
        "failed-beats-ok",
        vec![ok("x", 100, 10.0, 9)],
        vec![failed("x", 100, "boom")],
    );
    both(
        "ok-beats-chosen",
        vec![chosen("x", 100, "vllm config")],
        vec![ok("x", 100, 10.0, 1)],
    );
    // 1. Two ok results at the same instant: more samples, then lower figures.
    both(
        "more-samples",
        vec![ok("x", 100, 10.0, 5)],
        vec![ok("x", 100, 20.0, 9)],
    );
    both(
        "lower-median",
        vec![ok("x", 100, 10.0, 5)],
        vec![ok("x", 100, 20.0, 5)],
    );
    // 1. A later measurement wins whatever its figures.
    both(
        "later-wins",
        vec![ok("x", 100, 10.0, 9)],
        vec![ok("x", 101, 50.0, 1)],
    );
    // 2. Text tie-breaks: the bytewise larger error and chosen_by.
    both(
        "larger-error",
        vec![failed("x", 100, "b: out of memory")],
        vec![failed("x", 100, "a: timeout")],
    );
    both(
        "larger-chosen-by",
        vec![chosen("x", 100, "sglang")],
        vec![chosen("x", 100, "vllm")],
    );
    // 3. An absent tuning_ns is below an explicit 0.
    let mut zero = ok("x", 100, 10.0, 5);
    zero.tuning_ns = Some(0);
    both(
        "tuning-zero-beats-absent",
        vec![ok("x", 100, 10.0, 5)],
        vec![zero],
    );
    // 3. An absent policy is below the empty map.
    let mut empty = ok("x", 100, 10.0, 5);
    empty.policy = Some(Fields::new());
    both(
        "empty-policy-beats-absent",
        vec![ok("x", 100, 10.0, 5)],
        vec![empty],
    );
    // Entry header: the later recorded_at; on a tie the larger origin kind, then text.
    table.insert(
        &s,
        "probe",
        entry(
            "origin-text",
            60,
            imported("aaa"),
            vec![ok("x", 100, 10.0, 5)],
        ),
    );
    journal.insert(
        &s,
        "probe",
        entry(
            "origin-text",
            60,
            imported("bbb"),
            vec![ok("y", 100, 12.0, 5)],
        ),
    );
    table.insert(
        &s,
        "probe",
        entry(
            "origin-kind",
            60,
            Origin::Remote("a".into()),
            vec![ok("x", 100, 10.0, 5)],
        ),
    );
    journal.insert(
        &s,
        "probe",
        entry(
            "origin-kind",
            60,
            Origin::Measured("z".into()),
            vec![ok("y", 100, 12.0, 5)],
        ),
    );
    // 4. Ranking: the lead policy is the latest ok candidate's (a chosen one later still plays
    // no part); on a tie of measured_at a known policy leads an unknown one, so the slower
    // result of the known policy ranks first.
    let mut known = ok("known", 200, 20.0, 5);
    known.policy = Some(fields(&[("timer", Value::from("wall"))]));
    let unknown = ok("unknown", 200, 10.0, 5);
    let late_choice = chosen("shipped", 300, "vllm config");
    table.insert(
        &s,
        "probe",
        entry("lead-policy", 70, imported("a"), vec![unknown, late_choice]),
    );
    journal.insert(
        &s,
        "probe",
        entry("lead-policy", 70, imported("a"), vec![known]),
    );
    // A key only in the table, one only in the journal, in another namespace.
    table.insert(
        &s,
        "other",
        entry("table-only", 80, imported("a"), vec![ok("x", 100, 10.0, 5)]),
    );
    journal.insert(
        &s,
        "other",
        entry(
            "journal-only",
            80,
            imported("a"),
            vec![ok("x", 100, 10.0, 5)],
        ),
    );
    (table, journal)
}

/// 130 entries: three leaves under an internal root (the end of a fresh build, level by
/// level: a last leaf of two records).
fn many() -> CacheData {
    let mut data = CacheData::new();
    for i in 0..130 {
        let key = Key::new(fields(&[
            ("m", Value::Int(i)),
            ("dtype", Value::from("f16")),
        ]));
        let e = Entry::new(
            key,
            Fingerprint::default(),
            Origin::Imported("vectors".into()),
            1_700_000_000_000,
            [ok("tiled", 1_700_000_000_000, 100.0 + i as f64, 5)],
        );
        data.insert(&scope(), "matmul", e);
    }
    data
}

struct Case {
    name: &'static str,
    table: Vec<u8>,
    journal: Option<Vec<u8>>,
    /// The class of damage a reader must report, and the words of this reader's report that
    /// say it (`None`: the file is sound).
    damage: Option<(&'static str, &'static str)>,
}

fn cases() -> Vec<Case> {
    let (table, journal) = probes();
    let probe_table = table_bytes(APP, 1, None, &table);
    let lineage =
        cache_core::cache_format::table::Table::open(probe_table.clone(), &Limits::default())
            .expect("opens")
            .lineage();
    let mut j = encode_journal_header(&JournalHeader {
        app: APP.to_owned(),
        schema: 1,
        base: lineage,
        nonce: 1,
    });
    let record = encode_record(&journal);
    // The probes' journal with its record's length damaged (its high byte flipped: the frame
    // runs far past the end), and with half a record more (an interrupted append): a reader
    // gives the probes' entries from both, and reports the first's damage.
    let mut reframed = j.clone();
    j.extend_from_slice(&record);
    reframed.extend_from_slice(&record);
    let length_at = reframed.len() - record.len() + 2;
    reframed[length_at] ^= 0x10;
    let mut torn = j.clone();
    torn.extend_from_slice(&record[..record.len() / 2]);
    let many = table_bytes(APP, 1, None, &many());
    let mut flipped = many.clone();
    // A bit in the middle of the first entry block (entries start right after the header).
    let at = 152 + 40 + 30;
    flipped[at] ^= 0x10;
    vec![
        Case {
            name: "probes",
            table: probe_table.clone(),
            journal: Some(j),
            damage: None,
        },
        Case {
            name: "journal-reframed",
            table: probe_table.clone(),
            journal: Some(reframed),
            damage: None,
        },
        Case {
            name: "journal-torn",
            table: probe_table,
            journal: Some(torn),
            damage: None,
        },
        Case {
            name: "many",
            table: many.clone(),
            journal: None,
            damage: None,
        },
        Case {
            name: "damaged-entry",
            table: flipped,
            journal: None,
            damage: Some(("checksum", "checksum mismatch")),
        },
        Case {
            name: "self-naming",
            table: test_support::craft::self_naming(many),
            journal: None,
            damage: Some(("node-named-twice", "named a second time")),
        },
    ]
}

/// What the library's reader gives for `path`: each entry as its JSON line (parsed), sorted
/// by namespace and key fingerprint; and the problems it met.
fn read(path: &Path) -> (Vec<serde_json::Value>, Vec<String>) {
    let found = cache_core::inspect(path, &Limits::default(), None).expect("inspect");
    let version = found
        .snapshot
        .header
        .as_ref()
        .map(|h| (h.app.clone(), h.schema));
    let mut out = Vec::new();
    let walked = found.for_each_entry(|scope, ns, entry| {
        let v = version.as_ref().map(|(a, s)| (a.as_str(), *s));
        let line = cache_core::cache_format::json::line(scope, ns, entry, v);
        out.push(serde_json::from_str::<serde_json::Value>(&line).expect("JSON"));
        ControlFlow::Continue(())
    });
    out.sort_by_key(|v| (v["namespace"].to_string(), v["fingerprint"].to_string()));
    let mut problems = found.problems.clone();
    problems.extend(walked);
    (out, problems)
}

/// `{"entries": [...]}` with one entry per line (or `{"damaged": CLASS}`).
fn compact(v: &serde_json::Value) -> String {
    match v["entries"].as_array() {
        Some(entries) => {
            let lines: Vec<String> = entries.iter().map(ToString::to_string).collect();
            let extra = match v.get("journal_damage") {
                Some(n) => format!(",\n\"journal_damage\": {n}"),
                None => String::new(),
            };
            format!("{{\"entries\": [\n{}\n]{extra}}}\n", lines.join(",\n"))
        }
        None => format!("{v}\n"),
    }
}

#[test]
fn the_format_vectors_are_written_and_read_as_committed() {
    let root = dir();
    let bless = std::env::var_os("TUNECACHE_BLESS_VECTORS").is_some();
    let work = test_support::temp_dir();
    for case in cases() {
        let table_at = root.join(format!("{}.tcache", case.name));
        let journal_at = root.join(format!("{}.tcache.journal", case.name));
        let expected_at = root.join(format!("{}.json", case.name));
        if bless {
            std::fs::write(&table_at, &case.table).expect("write");
            if let Some(j) = &case.journal {
                std::fs::write(&journal_at, j).expect("write");
            }
        }
        assert_eq!(
            std::fs::read(&table_at).expect("a committed vector"),
            case.table,
            "{}: this build no longer writes the committed bytes",
            case.name
        );
        if let Some(j) = &case.journal {
            assert_eq!(
                &std::fs::read(&journal_at).expect("committed"),
                j,
                "{}",
                case.name
            );
        }
        let copy = work.path().join(format!("{}.tcache", case.name));
        std::fs::write(&copy, &case.table).expect("write");
        if let Some(j) = &case.journal {
            std::fs::write(work.path().join(format!("{}.tcache.journal", case.name)), j)
                .expect("write");
        }
        let (entries, problems) = read(&copy);
        let got = match case.damage {
            None => {
                // Damage in a journal a reader reads past: said, and counted in the JSON.
                let journal_damage = problems
                    .iter()
                    .filter(|p| p.contains("journal record"))
                    .count();
                assert_eq!(
                    problems.len(),
                    journal_damage,
                    "{}: {problems:?}",
                    case.name
                );
                if journal_damage == 0 {
                    serde_json::json!({ "entries": entries })
                } else {
                    serde_json::json!({ "entries": entries, "journal_damage": journal_damage })
                }
            }
            Some((class, words)) => {
                assert!(
                    problems.iter().any(|p| p.contains(words)),
                    "{}: {problems:?}",
                    case.name
                );
                serde_json::json!({ "damaged": class })
            }
        };
        if bless {
            std::fs::write(&expected_at, compact(&got)).expect("write");
        }
        let want: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&expected_at).expect("committed"))
                .expect("JSON");
        assert_eq!(got, want, "{}: {problems:?}", case.name);
    }
    check_bundle_vector(&root, bless, work.path());
    // The independent reader, from FORMAT.md alone, agrees on every case.
    let script = root.join("run_vectors.py");
    let out = std::process::Command::new("python3")
        .arg(&script)
        .arg(&root)
        .output();
    let missing = match &out {
        Err(e) => Some(format!("python3 cannot run: {e}")),
        Ok(o) if String::from_utf8_lossy(&o.stderr).contains("No module named 'msgpack'") => {
            Some("the Python msgpack package is missing (pip install msgpack)".to_owned())
        }
        Ok(_) => None,
    };
    if let Some(why) = missing {
        test_support::skip::missing("the format vectors' Python reader", &why);
        return;
    }
    let o = out.expect("ran");
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The probes' table entries as a bundle (version 3, `created` fixed). Its bytes are not
/// compared (the manifest's `tool` names this build's version, which is free); what is: the
/// framing, both CRCs and the SHA-256 (the library's whole check), the manifest but `tool`, and
/// the inner table's entries.
fn check_bundle_vector(root: &Path, bless: bool, work: &Path) {
    let at = root.join("bundle.tcb");
    if bless {
        let mut w = cache_core::BundleWriter::create(
            &at,
            &cache_core::cache_migrate::Migrations::new(APP, 1),
            &Limits::default(),
        )
        .expect("create");
        let (table, _) = probes();
        for (scope, sd) in table.scopes() {
            for (ns, entries) in sd.namespaces() {
                let mut sorted: Vec<&Entry> = entries.values().collect();
                sorted.sort_by_key(|e| {
                    cache_core::cache_format::table::TKey::of(scope, ns, &e.fingerprint())
                });
                for e in sorted {
                    w.add(scope, ns, e).expect("add");
                }
            }
        }
        w.finish(Some(1_700_000_000), "vectors").expect("finish");
    }
    cache_core::check_bundle(&at, &Limits::default()).expect("the bundle vector checks whole");
    let bytes = std::fs::read(&at).expect("committed");
    // [ "TCBUNDLE", 3, bin32 manifest, uint32 crc, bin32 table, uint32 crc ]
    assert_eq!(&bytes[..11], b"\x96\xa8TCBUNDLE\x03");
    let len = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().expect("4")) as usize;
    let manifest_len = len(12);
    let manifest = &bytes[16..16 + manifest_len];
    let table_at = 16 + manifest_len + 5 + 5;
    let table = &bytes[table_at..table_at + len(table_at - 4)];
    let copy = work.join("bundle-inner.tcache");
    std::fs::write(&copy, table).expect("write");
    let (entries, problems) = read(&copy);
    assert!(problems.is_empty(), "{problems:?}");
    let mut manifest: serde_json::Value = serde_json::from_slice(manifest).expect("JSON");
    manifest.as_object_mut().expect("an object").remove("tool");
    let got = serde_json::json!({ "manifest": manifest, "entries": entries });
    let expected_at = root.join("bundle.json");
    if bless {
        let text = compact(&serde_json::json!({ "entries": entries }));
        let text = text.replacen(
            "{\"entries\"",
            &format!("{{\"manifest\": {manifest},\n\"entries\""),
            1,
        );
        std::fs::write(&expected_at, text).expect("write");
    }
    let want: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&expected_at).expect("committed"))
            .expect("JSON");
    assert_eq!(got, want);
}
