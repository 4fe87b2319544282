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

/// A file of format 3 (one msgpack snapshot), as builds before the table wrote them.
pub(crate) fn file_with(app: &str, schema: u32, ids: std::ops::Range<u64>) -> Vec<u8> {
    let mut data = CacheData::new();
    for i in ids {
        data.insert(&Scope::default(), "matmul", entry(5, i));
    }
    encode_snapshot(app, schema, &data)
}

/// A table (format 4), as this build writes them.
pub(crate) fn table_with(app: &str, schema: u32, ids: std::ops::Range<u64>) -> Vec<u8> {
    let mut data = CacheData::new();
    for i in ids {
        data.insert(&Scope::default(), "matmul", entry(5, i));
    }
    cache_core::cache_format::table::table_bytes(app, schema, None, &data)
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
    assert_left_untouched(table_with(APP, 99, 0..10), "newer schema, a table");
}

#[test]
fn a_newer_format_file_is_left_byte_for_byte_unchanged() {
    let mut bytes = table_with(APP, 1, 0..10);
    assert_eq!(
        u32::from(bytes[11]),
        cache_core::cache_format::FORMAT_VERSION,
        "format version byte"
    );
    bytes[11] += 1;
    assert_left_untouched(bytes, "newer format");
}

/// A file that is not tunecache's at the cache's path (a user's file given by mistake, a
/// bundle, a cache whose marker was overwritten) is left as it is, never moved aside: nothing
/// tunecache did not create is removed or changed (a later `gc --leftovers` removed what was
/// moved aside).
#[test]
fn a_file_that_is_not_tunecaches_is_left_byte_for_byte_unchanged() {
    assert_left_untouched(b"this is not a cache file at all".to_vec(), "garbage");
    assert_left_untouched(b"{\"a\": 1}\n".to_vec(), "a JSON file");
    let mut data = cache_core::cache_format::CacheData::new();
    data.insert(&Default::default(), "matmul", crate::support::entry(7, 1));
    let snapshot = cache_core::cache_format::encode_snapshot(APP, 1, &data);
    let manifest =
        cache_core::cache_format::bundle::manifest_of(&data, APP, 1, &snapshot, 0, "test");
    let bundle = cache_core::cache_format::bundle::encode_bundle(&manifest, &snapshot);
    assert_left_untouched(bundle, "a bundle");
    let mut flipped = table_with(APP, 1, 0..10);
    flipped[3] ^= 0x20;
    assert_left_untouched(flipped, "a table whose marker was overwritten");
}

#[test]
fn another_applications_file_is_left_byte_for_byte_unchanged() {
    assert_left_untouched(file_with("someone-else", 1, 0..10), "foreign application");
    assert_left_untouched(
        table_with("someone-else", 1, 0..10),
        "foreign application, a table",
    );
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

pub(crate) fn rename_step() -> Step {
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
    let table = cache_core::cache_format::table::Table::open(rewritten, &Default::default())
        .expect("a table");
    assert_eq!(
        table.head().schema,
        2,
        "rewritten as a table at the current schema"
    );
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
            let mut b = table_with(APP, 3, 0..3);
            b[11] += 1;
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
                    source: FormatError::NewerFormat { found, supported },
                    ..
                },
            ) if *found == u64::from(*supported) + 1 => {}
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

/// A cache written by a format 1 build, snapshot and journal (a format 1 payload is a format 3
/// one without policies or chosen candidates, so the version bytes are all that differ): opened
/// by this build, every entry of both is there; the next save writes a table (format 4) and
/// loses nothing.
#[test]
fn a_format_1_cache_with_a_journal_loses_nothing_when_lifted() {
    use cache_core::cache_format::{JournalHeader, encode_journal_header, encode_record};
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let mut data = CacheData::new();
    for id in 0..5 {
        data.insert(&Scope::default(), "matmul", entry(5, id));
    }
    let mut snap = encode_snapshot(APP, 1, &data);
    let generation = cache_core::cache_format::peek_header(&snap, &Default::default())
        .expect("header")
        .1
        .generation;
    let mut jour = encode_journal_header(&JournalHeader {
        app: APP.into(),
        schema: 1,
        base: generation,
        nonce: 0,
    });
    let mut more = CacheData::new();
    for id in 5..8 {
        more.insert(&Scope::default(), "matmul", entry(5, id));
    }
    jour.extend(encode_record(&more));
    // The format number: after the array header and the marker (FORMAT.md).
    let (snap_at, jour_at) = (1 + 10, 1 + 18);
    assert_eq!(
        (snap[snap_at], jour[jour_at]),
        (3, 4),
        "format bytes where expected"
    );
    snap[snap_at] = 1;
    jour[jour_at] = 1;
    let journal = crate::support::path_in_journal(&path);
    std::fs::write(&path, &snap).expect("write");
    std::fs::write(&journal, &jour).expect("write");

    let cache = builder(&path).open();
    assert_eq!(cache.health().mode, Mode::Persistent);
    for id in 0..8 {
        assert!(has(&cache, 5, id), "entry {id} of the format 1 cache");
    }
    cache.put(ns(), entry(5, 8));
    cache.flush().expect("saved");
    drop(cache);
    assert_eq!(
        std::fs::read(&path).expect("file")[snap_at],
        4,
        "written as a table, format 4"
    );
    let again = builder(&path).open();
    for id in 0..9 {
        assert!(has(&again, 5, id), "entry {id} after the lift");
    }
}
