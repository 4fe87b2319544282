//! Versions: a newer or foreign file is never written; a file with no migration path is kept
//! aside and never merged back in, on load or on save; a migrated file is rewritten with a
//! backup of the original.

use cache_core::cache_format::rmpv::Value as Raw;
use cache_core::cache_format::{CacheData, Scope, encode_snapshot};
use cache_core::cache_migrate::{Change, Migrations, PayloadView, Step, field_mut};
use cache_core::{Cache, Mode, Store, StoreError};

use crate::support::{
    APP, builder, capture_logs, entry, has, ns, path_in, temp_dir, warnings_about,
};

fn file_with(app: &str, schema: u32, ids: std::ops::Range<u64>) -> Vec<u8> {
    let mut data = CacheData::new();
    for i in ids {
        data.insert(&Scope::default(), "matmul", entry(5, i));
    }
    encode_snapshot(app, schema, &data)
}

fn assert_left_untouched(bytes: Vec<u8>, why: &str) {
    capture_logs();
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    std::fs::write(&path, &bytes).expect("write file");
    let cache = builder(&path).open();
    cache.put(ns(), entry(1, 1));
    let flushed = cache.flush();
    assert!(
        matches!(flushed, Err(StoreError::NotPersistent { .. })),
        "{why}: flush must say it is not persistent: {flushed:?}"
    );
    assert_eq!(cache.health().mode, Mode::Memory, "{why}");
    assert!(has(&cache, 1, 1), "{why}: results still work in memory");
    drop(cache);
    assert_eq!(
        std::fs::read(&path).expect("file"),
        bytes,
        "{why}: the file changed"
    );
    assert!(
        !path_in(&dir, "c.tcache.journal").exists(),
        "{why}: a journal was written beside it"
    );
    let warned = warnings_about(&path.display().to_string());
    assert_eq!(
        warned.len(),
        1,
        "{why}: exactly one warning naming the file: {warned:?}"
    );
    assert!(warned[0].contains("untouched"), "{}", warned[0]);
}

#[test]
fn a_newer_schema_file_is_left_byte_for_byte_unchanged() {
    assert_left_untouched(file_with(APP, 99, 0..10), "newer schema");
}

#[test]
fn a_newer_format_file_is_left_byte_for_byte_unchanged() {
    let mut bytes = file_with(APP, 1, 0..10);
    assert_eq!(bytes[11], 0x01, "format version byte");
    bytes[11] = 0x02;
    assert_left_untouched(bytes, "newer format");
}

#[test]
fn another_applications_file_is_left_byte_for_byte_unchanged() {
    assert_left_untouched(file_with("someone-else", 1, 0..10), "foreign application");
}

#[test]
fn a_file_with_no_migration_path_is_kept_aside_and_not_merged_back_on_save() {
    capture_logs();
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let stale = file_with(APP, 0, 0..10); // schema 0; the registry is at 1 with no step 0→1
    std::fs::write(&path, &stale).expect("write");
    let cache = builder(&path).open();
    assert!(!has(&cache, 5, 0), "stale entries are not loaded");
    cache.put(ns(), entry(1, 1));
    cache.flush().expect("flush");
    let moved = cache.health().quarantined;
    assert_eq!(moved.len(), 1, "{moved:?}");
    assert_eq!(
        std::fs::read(&moved[0]).expect("kept aside"),
        stale,
        "kept byte for byte"
    );
    drop(cache);
    let reopened = builder(&path).open();
    assert!(has(&reopened, 1, 1));
    assert!(
        (0..10).all(|i| !has(&reopened, 5, i)),
        "stale entries came back"
    );
    let warned = warnings_about(&moved[0].display().to_string());
    assert_eq!(
        warned.len(),
        1,
        "one warning naming where the file went: {warned:?}"
    );
}

#[test]
fn merge_on_save_applies_the_version_gate_too() {
    // The WarpConvNet bug: the read inside merge-on-save skipped the version check and
    // resurrected stale entries. Here a stale file appears *after* the cache was opened.
    capture_logs();
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let cache = builder(&path).open();
    cache.put(ns(), entry(1, 1));
    cache.flush().expect("first save");
    std::fs::write(&path, file_with(APP, 0, 0..10)).expect("replace with a stale file");
    cache.put(ns(), entry(1, 2));
    cache.flush().expect("second save");
    drop(cache);
    let reopened = builder(&path).open();
    assert!(has(&reopened, 1, 2));
    assert!(
        (0..10).all(|i| !has(&reopened, 5, i)),
        "the save merged stale entries back in"
    );
}

fn rename_step() -> Step {
    Step::coded(1, 2, "rename tiled→blocked", |view: &mut PayloadView| {
        let mut n = 0;
        for (_, e) in view.entries_mut() {
            if let Some(Raw::Array(cands)) = field_mut(e, "candidates") {
                for c in cands {
                    if let Some(algo) = field_mut(c, "algo")
                        && algo.as_str() == Some("tiled")
                    {
                        *algo = Raw::from("blocked");
                        n += 1;
                    }
                }
            }
        }
        Ok(vec![Change::new("renamed", "tiled→blocked", n)])
    })
}

#[test]
fn an_older_file_is_migrated_rewritten_and_backed_up() {
    capture_logs();
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let old = file_with(APP, 1, 0..10);
    std::fs::write(&path, &old).expect("write");
    let registry = Migrations::new(APP, 2)
        .with(rename_step())
        .expect("registry");
    let cache = Cache::builder(registry.clone())
        .file(&path)
        .ignore_env()
        .refresh_interval(None)
        .save_delay(std::time::Duration::from_millis(10))
        .open();
    let e = cache
        .lookup(ns(), &crate::support::key(5, 3))
        .expect("migrated entry");
    assert_eq!(e.best().map(|c| c.id.algorithm.as_str()), Some("blocked"));
    let report = cache.health().migration.expect("a migration report");
    assert_eq!(
        report.steps[0].to_string(),
        "v1→v2 renamed 10 entries (tiled→blocked)"
    );
    cache.flush().expect("the migrated file is written");
    drop(cache);
    let rewritten = std::fs::read(&path).expect("file");
    let snap =
        cache_core::cache_format::read_snapshot(&rewritten, &Default::default()).expect("valid");
    assert_eq!(snap.header.schema, 2, "rewritten at the current schema");
    let backups: Vec<_> = std::fs::read_dir(dir.path())
        .expect("dir")
        .flatten()
        .filter(|f| f.file_name().to_string_lossy().contains(".tcache.bak."))
        .collect();
    assert_eq!(backups.len(), 1, "one backup of the pre-migration file");
    assert_eq!(std::fs::read(backups[0].path()).expect("backup"), old);
    assert!(
        crate::support::logs_about("renamed 10 entries (tiled→blocked)")
            .iter()
            .any(|l| l.contains("INFO")),
        "the migration is logged at info level"
    );
}

/// The typed errors an embedding program sees: it can tell another application's file, a
/// newer schema, a missing step and a newer format apart without parsing a message.
#[test]
fn a_refused_file_s_error_carries_its_typed_cause() {
    use cache_core::cache_format::{FormatError, Limits};
    use cache_core::cache_migrate::MigrateError;
    use cache_core::{MigrateOptions, migrate_file};
    let options = MigrateOptions {
        backup: false,
        dry_run: true,
        lock_timeout: std::time::Duration::from_secs(1),
        limits: Limits::default(),
    };
    let dir = temp_dir();
    let registry = Migrations::new(APP, 3)
        .with(Step::declarative(2, 3, "nothing", vec![]))
        .expect("valid registry");
    let cases: [(&str, Vec<u8>); 4] = [
        ("foreign", file_with("someone-else", 1, 0..3)),
        ("newer", file_with(APP, 9, 0..3)),
        ("no-path", file_with(APP, 1, 0..3)),
        ("newer-format", {
            let mut b = file_with(APP, 3, 0..3);
            b[11] = 0x02;
            b
        }),
    ];
    for (name, bytes) in cases {
        let path = path_in(&dir, &format!("{name}.tcache"));
        std::fs::write(&path, &bytes).expect("write");
        let err = migrate_file(&path, &registry, &options).expect_err(name);
        match (name, &err) {
            (
                "foreign",
                StoreError::Migrate {
                    source: MigrateError::Foreign { found, .. },
                    ..
                },
            ) => {
                assert_eq!(found, "someone-else");
            }
            (
                "newer",
                StoreError::Migrate {
                    source:
                        MigrateError::NewerSchema {
                            found: 9,
                            current: 3,
                        },
                    ..
                },
            ) => {}
            (
                "no-path",
                StoreError::Migrate {
                    source:
                        MigrateError::NoPath {
                            from: 1,
                            missing: 1,
                            ..
                        },
                    ..
                },
            ) => {}
            (
                "newer-format",
                StoreError::Format {
                    source: FormatError::NewerFormat { found: 2, .. },
                    ..
                },
            ) => {}
            _ => panic!("{name}: unexpected error {err:?}"),
        }
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
        assert_eq!(
            std::fs::read(&path).expect("read"),
            bytes,
            "{name}: untouched"
        );
    }
}

/// Inspection shows a file as stored and says what a load would do with it.
#[test]
fn inspection_names_the_gate_a_load_would_apply() {
    use cache_core::cache_format::Limits;
    use cache_core::{GateVerdict, inspect};
    let dir = temp_dir();
    let registry = Migrations::new(APP, 2)
        .with(rename_step())
        .expect("valid registry");
    let verdict = |name: &str, bytes: Vec<u8>, registry: Option<&Migrations>| {
        let path = path_in(&dir, &format!("{name}.tcache"));
        std::fs::write(&path, bytes).expect("write");
        let found = inspect(&path, &Limits::default(), registry).expect("inspect");
        assert_eq!(found.data().len(), 3, "{name}: shown as stored");
        found.gate.expect("a header was read")
    };
    let older = verdict("older", file_with(APP, 1, 0..3), Some(&registry));
    assert_eq!(older, GateVerdict::Migrates { from: 1, to: 2 });
    assert_eq!(
        older.to_string(),
        "as stored, schema 1; this build migrates it to 2"
    );
    assert_eq!(
        verdict("current", file_with(APP, 2, 0..3), Some(&registry)),
        GateVerdict::Current { schema: 2 }
    );
    assert!(matches!(
        verdict("newer", file_with(APP, 5, 0..3), Some(&registry)),
        GateVerdict::Refused { schema: 5, .. }
    ));
    assert!(
        matches!(
            verdict("unknown", file_with("other", 1, 0..3), Some(&registry)),
            GateVerdict::Unknown { .. }
        ),
        "a registry of another application names no gate"
    );
    assert!(matches!(
        verdict("none", file_with(APP, 1, 0..3), None),
        GateVerdict::Unknown { schema: 1, .. }
    ));
}

/// Issue 8, case 12: a `migrate --backup` that fails (here: the disk fills while the new
/// snapshot is written) leaves no `.bak` copy behind, so retries do not pile copies up; the
/// original is untouched.
#[test]
fn a_failed_migration_leaves_no_backup_behind() {
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let old = file_with(APP, 1, 0..2000);
    std::fs::write(&path, &old).expect("write");
    for attempt in 0..2 {
        let mut child = crate::support::spawn_child("migrate-fsize", &path, &["4096".into()], &[]);
        let lines = crate::support::child_lines(&mut child);
        assert!(child.wait().expect("wait").success(), "{lines:?}");
        assert!(
            lines.iter().any(|l| l.starts_with("migrate-failed")),
            "attempt {attempt}: the write hit the limit: {lines:?}"
        );
    }
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .expect("dir")
        .flatten()
        .map(|f| f.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["c.tcache", "c.tcache.lock"],
        "no backup or temporary file is left"
    );
    assert_eq!(
        std::fs::read(&path).expect("file"),
        old,
        "the original is untouched"
    );
}

/// Issue 8, case 8: inspection can show the entries as this build reads them: an older file is
/// migrated in memory by the registry (renamed algorithm), the gate says so, and the file is
/// not touched. Without the step's registry, it stays as stored.
#[test]
fn inspection_shows_an_older_file_as_this_build_reads_it() {
    use cache_core::cache_format::Limits;
    use cache_core::{GateVerdict, inspect};
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let old = file_with(APP, 1, 0..10);
    std::fs::write(&path, &old).expect("write");
    let registry = Migrations::new(APP, 2)
        .with(rename_step())
        .expect("registry");
    let limits = Limits::default();
    let algorithms = |found: &cache_core::Inspection| -> Vec<String> {
        let data = found.data();
        let mut names: Vec<String> = data
            .entries()
            .filter_map(|(_, _, e)| e.best().map(|c| c.id.algorithm.clone()))
            .collect();
        names.dedup();
        names
    };
    let mut found = inspect(&path, &limits, Some(&registry)).expect("inspect");
    assert_eq!(found.gate, Some(GateVerdict::Migrates { from: 1, to: 2 }));
    assert_eq!(algorithms(&found), ["tiled"], "as stored");
    let report = found
        .migrate_in_memory(&registry, &limits)
        .expect("migrates")
        .expect("a report");
    assert!(
        report.to_string().contains("renamed 10 entries"),
        "{report}"
    );
    assert_eq!(algorithms(&found), ["blocked"], "as this build reads it");
    assert_eq!(
        std::fs::read(&path).expect("file"),
        old,
        "the file is unchanged"
    );
    let mut current = inspect(&path, &limits, Some(&Migrations::new(APP, 1))).expect("inspect");
    assert!(
        current
            .migrate_in_memory(&registry, &limits)
            .expect("ok")
            .is_none()
    );
    assert_eq!(algorithms(&current), ["tiled"]);
}

/// A real migration reads (and migrates) the file once, under the lock; a journal record with
/// damage is still kept aside before the journal is replaced, and the good records are kept.
#[test]
fn a_migration_keeps_damage_aside_and_the_good_records() {
    use cache_core::cache_migrate::Op;
    // A coded step (the usual read) and a declarative one (the streamed path, which must leave
    // a damaged journal to the usual read).
    let declarative = Step::declarative(
        1,
        2,
        "rename",
        vec![Op::RenameAlgorithm {
            from: "tiled".into(),
            to: "blocked".into(),
            namespace: None,
        }],
    );
    for step in [rename_step(), declarative] {
        migration_keeps_damage_aside(step);
    }
}

fn migration_keeps_damage_aside(step: Step) {
    use cache_core::cache_format::{
        JournalHeader, Limits, encode_journal_header, encode_record, read_snapshot,
    };
    use cache_core::{MigrateOptions, MigrateOutcome, migrate_file};
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let snapshot = file_with(APP, 1, 0..5);
    let generation = read_snapshot(&snapshot, &Limits::default())
        .expect("valid")
        .header
        .generation;
    std::fs::write(&path, &snapshot).expect("write");
    let mut journal = encode_journal_header(&JournalHeader {
        app: APP.into(),
        schema: 1,
        base: generation,
    });
    let record = |ids: std::ops::Range<u64>| {
        let mut data = CacheData::new();
        for i in ids {
            data.insert(&Scope::default(), "matmul", entry(5, i));
        }
        encode_record(&data)
    };
    let mut bad = record(10..11);
    let n = bad.len();
    bad[n - 10] ^= 0xff; // inside the payload: its checksum fails
    journal.extend_from_slice(&bad);
    journal.extend_from_slice(&record(20..21));
    std::fs::write(path_in(&dir, "c.tcache.journal"), &journal).expect("journal");
    let registry = Migrations::new(APP, 2).with(step).expect("registry");
    let outcome = migrate_file(&path, &registry, &MigrateOptions::default()).expect("migrates");
    assert!(
        matches!(
            outcome,
            MigrateOutcome::Migrated {
                written: true,
                entries: 6,
                ..
            }
        ),
        "{outcome:?}"
    );
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .expect("dir")
        .flatten()
        .map(|f| f.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().any(|n| n.contains(".journal.damaged-")),
        "the damage is kept aside: {names:?}"
    );
    let cache = Cache::builder(registry)
        .file(&path)
        .ignore_env()
        .refresh_interval(None)
        .open();
    assert!(cache.lookup(ns(), &crate::support::key(5, 20)).is_some());
    assert_eq!(cache.len(), 6);
}

/// An offline migration with declarative steps goes entry by entry from the old bytes to the
/// new (never holding the model), the journal's records merged in: it must write exactly what
/// the library writes after migrating the same file on load, report the same, keep the
/// backups asked for, and a dry run must say the same and write nothing.
#[test]
fn an_offline_migration_writes_what_the_library_writes() {
    use cache_core::cache_format::{Fields, Value};
    use cache_core::cache_migrate::Op;
    use cache_core::{MigrateOptions, MigrateOutcome, migrate_file};
    let registry = Migrations::new(APP, 3)
        .with(Step::declarative(
            1,
            2,
            "rename",
            vec![
                Op::RenameAlgorithm {
                    from: "tiled".into(),
                    to: "blocked".into(),
                    namespace: None,
                },
                Op::RenameKeyField {
                    from: "id".into(),
                    to: "ident".into(),
                    namespace: None,
                },
            ],
        ))
        .and_then(|r| {
            r.with(Step::declarative(
                2,
                3,
                "defaults",
                vec![Op::SetParamDefault {
                    name: "split".into(),
                    value: Value::Int(1),
                    algorithm: None,
                    namespace: None,
                }],
            ))
        })
        .expect("registry");
    let mut data = CacheData::new();
    for i in 0..300 {
        data.insert(&Scope::default(), "matmul", entry(5, i));
        let scope = Scope::new(Fields::from([("device".to_owned(), Value::from("x"))]));
        data.insert(&scope, "conv", entry(6, i));
    }
    let old = encode_snapshot(APP, 1, &data);
    for with_journal in [false, true] {
        let dir = temp_dir();
        // What the library writes after migrating on load.
        let by_library = path_in(&dir, "lib.tcache");
        std::fs::write(&by_library, &old).expect("write");
        let cache = Cache::builder(registry.clone())
            .file(&by_library)
            .ignore_env()
            .refresh_interval(None)
            .open();
        let library_report = cache.health().migration.expect("migrated on load");
        cache.flush().expect("written");
        drop(cache);
        // And offline.
        let path = path_in(&dir, "c.tcache");
        std::fs::write(&path, &old).expect("write");
        let mut expected = std::fs::read(&by_library).expect("file");
        if with_journal {
            // A record at schema 1 beside the snapshot: migrated and merged in too.
            let cache = Cache::builder(Migrations::new(APP, 1))
                .file(&path)
                .ignore_env()
                .compaction(1e9, u64::MAX)
                .open();
            cache.put(ns(), entry(7, 1));
            cache.flush().expect("appended");
            drop(cache);
            assert!(path_in(&dir, "c.tcache.journal").exists());
            std::fs::write(&by_library, std::fs::read(&path).expect("file")).expect("write");
            std::fs::copy(
                path_in(&dir, "c.tcache.journal"),
                path_in(&dir, "lib.tcache.journal"),
            )
            .expect("copy");
            let cache = Cache::builder(registry.clone())
                .file(&by_library)
                .ignore_env()
                .refresh_interval(None)
                .open();
            cache.flush().expect("written");
            drop(cache);
            expected = std::fs::read(&by_library).expect("file");
        }
        let before = std::fs::read(&path).expect("file");
        let dry = migrate_file(
            &path,
            &registry,
            &MigrateOptions {
                dry_run: true,
                ..MigrateOptions::default()
            },
        )
        .expect("dry run");
        assert_eq!(
            std::fs::read(&path).expect("file"),
            before,
            "a dry run writes nothing"
        );
        let outcome = migrate_file(
            &path,
            &registry,
            &MigrateOptions {
                backup: true,
                ..MigrateOptions::default()
            },
        )
        .expect("migrates");
        let (
            MigrateOutcome::Migrated {
                report: dry_report,
                written: false,
                entries: dry_entries,
                ..
            },
            MigrateOutcome::Migrated {
                report,
                written: true,
                backups,
                entries,
            },
        ) = (dry, outcome)
        else {
            panic!("with_journal {with_journal}: not a dry run and a migration");
        };
        assert_eq!(dry_report, report, "with_journal {with_journal}");
        assert_eq!(dry_entries, entries);
        assert_eq!(entries, 600 + usize::from(with_journal));
        if !with_journal {
            assert_eq!(report, library_report, "the library's report");
        }
        assert_eq!(
            report.steps[0].changes[0].entries, 600,
            "tiled→blocked: {report}"
        );
        assert_eq!(
            std::fs::read(&path).expect("file"),
            expected,
            "with_journal {with_journal}: the library's bytes"
        );
        assert_eq!(backups.len(), 1 + usize::from(with_journal), "{backups:?}");
        assert_eq!(std::fs::read(&backups[0]).expect("backup"), before);
        assert!(!path_in(&dir, "c.tcache.journal").exists());
    }
}
