//! Migrating files: a migration keeps damage aside and the good records, and an offline
//! migration (`migrate_file`) writes exactly what the library writes after migrating the same
//! file on load.

use cache_core::cache_format::{CacheData, Scope, encode_snapshot};
use cache_core::cache_migrate::{Migrations, Step};
use cache_core::{Cache, Store};

use crate::support::{APP, entry, ns, path_in, temp_dir};
use crate::versions::{file_with, rename_step};

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
        nonce: 0,
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
            // A table at schema 1 (the first save rewrites the format 3 file) and a record at
            // schema 1 beside it: migrated and merged in too.
            let cache = Cache::builder(Migrations::new(APP, 1))
                .file(&path)
                .ignore_env()
                .compaction(1e9, u64::MAX)
                .open();
            cache.put(ns(), entry(7, 1));
            cache.flush().expect("rewritten as a table");
            cache.put(ns(), entry(7, 2));
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
        assert_eq!(entries, 600 + 2 * usize::from(with_journal));
        if !with_journal {
            assert_eq!(report, library_report, "the library's report");
        }
        // The table's entries (the first save put one more into it beside the 600).
        assert_eq!(
            report.steps[0].changes[0].entries,
            600 + u64::from(with_journal),
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
