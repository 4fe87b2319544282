//! `tunecache migrate`: the same bytes as the library's automatic path, a dry run that
//! changes nothing, a bounded wait for the lock, backups, and clear failures.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use crate::tunecache;

use cache_core::cache_migrate::Migrations;
use cache_core::{Cache, Store};

fn golden(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../golden/warpconvnet-demo")
        .join(rel)
}

fn migrations() -> PathBuf {
    golden("migrations.json")
}

fn registry() -> Migrations {
    Migrations::from_json(&std::fs::read_to_string(migrations()).expect("read")).expect("valid")
}

fn copy_input(dir: &Path, version: u32, name: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::copy(golden(&format!("inputs/v{version}.tcache")), &path).expect("copy");
    path
}

fn out(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn the_cli_writes_exactly_the_bytes_of_the_automatic_path() {
    let dir = tempfile::tempdir().expect("dir");
    let automatic = copy_input(dir.path(), 8, "auto.tcache");
    let offline = copy_input(dir.path(), 8, "cli.tcache");

    // The library: open (migrates in memory), let the saver write the migrated file.
    let cache = Cache::builder(registry())
        .file(&automatic)
        .ignore_env()
        .backup_on_migrate(false)
        .open();
    assert!(cache.health().migration.is_some());
    cache.flush().expect("the migrated file is written");
    drop(cache);

    let o = tunecache(
        &offline,
        &[
            "migrate",
            "--migrations",
            migrations().to_str().expect("utf-8"),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let text = out(&o);
    assert!(
        text.contains("cache migration v8→v9 renamed 6 entries (production→mask_gemm)"),
        "{text}"
    );
    assert!(text.contains("cache migration v8→v9 renamed 3 entries (production_fwd_as_dgrad→mask_gemm_fwd_as_dgrad)"), "{text}");

    let a = std::fs::read(&automatic).expect("auto");
    let b = std::fs::read(&offline).expect("cli");
    assert_eq!(a, b, "the CLI and the library wrote different bytes");
    assert_eq!(
        a,
        std::fs::read(golden("expected/v8.tcache")).expect("golden"),
        "and both equal the golden output"
    );
}

#[test]
fn a_dry_run_prints_the_plan_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let path = copy_input(dir.path(), 6, "c.tcache");
    let before = std::fs::read(&path).expect("read");
    let o = tunecache(
        &path,
        &[
            "migrate",
            "--dry-run",
            "--migrations",
            migrations().to_str().expect("utf-8"),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let text = out(&o);
    assert!(
        text.contains("plan for")
            && text.contains("v6→v7:")
            && text.contains(r#"{"op":"rename_key_field","from":"c_in","to":"ci"}"#),
        "{text}"
    );
    assert!(
        text.contains("dropped 1 entries (namespace scratch)")
            && text.contains("nothing was written"),
        "{text}"
    );
    assert_eq!(
        std::fs::read(&path).expect("read"),
        before,
        "the dry run changed the file"
    );
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .expect("dir")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names.len(), 1, "the dry run created files: {names:?}");
    // Its --json summary counts the entries and their pace.
    let o = tunecache(
        &path,
        &[
            "--json",
            "migrate",
            "--dry-run",
            "--migrations",
            migrations().to_str().expect("utf-8"),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(r["outcome"], "dry-run", "{r:#}");
    let entries = r["entries"].as_u64().expect("entries");
    assert!(entries > 0, "{r:#}");
    crate::progress::has_pace(&r, entries);
}

#[test]
fn backup_keeps_the_original_bytes() {
    let dir = tempfile::tempdir().expect("dir");
    let path = copy_input(dir.path(), 7, "c.tcache");
    let before = std::fs::read(&path).expect("read");
    let o = tunecache(
        &path,
        &[
            "migrate",
            "--backup",
            "--migrations",
            migrations().to_str().expect("utf-8"),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let backups: Vec<_> = std::fs::read_dir(dir.path())
        .expect("dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("c.tcache.bak."))
        .collect();
    assert_eq!(backups.len(), 1, "{}", out(&o));
    assert_eq!(std::fs::read(backups[0].path()).expect("backup"), before);
    assert!(out(&o).contains(&format!("backup: {}", backups[0].path().display())));
}

#[test]
fn a_held_lock_makes_migrate_wait_a_bounded_time_and_fail_clearly() {
    let dir = tempfile::tempdir().expect("dir");
    let path = copy_input(dir.path(), 8, "c.tcache");
    let before = std::fs::read(&path).expect("read");
    let lock = test_support::hold_lock(&dir.path().join("c.tcache.lock"));
    let started = Instant::now();
    let o = tunecache(
        &path,
        &[
            "migrate",
            "--lock-timeout",
            "0.5",
            "--migrations",
            migrations().to_str().expect("utf-8"),
        ],
    );
    let took = started.elapsed();
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert!(out(&o).contains("waiting for the lock"), "{}", out(&o));
    assert!(took < Duration::from_secs(20), "waited {took:?}");
    assert_eq!(
        std::fs::read(&path).expect("read"),
        before,
        "nothing clobbered"
    );
    drop(lock);
    let o = tunecache(
        &path,
        &[
            "migrate",
            "--migrations",
            migrations().to_str().expect("utf-8"),
        ],
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "once the lock is free it migrates: {}",
        out(&o)
    );
}

#[test]
fn no_migration_path_fails_and_leaves_the_file() {
    let dir = tempfile::tempdir().expect("dir");
    let path = copy_input(dir.path(), 6, "c.tcache");
    let before = std::fs::read(&path).expect("read");
    // A registry that only knows 8→9.
    let partial = dir.path().join("partial.json");
    let mut file = registry().to_file().expect("declarative");
    file.steps.retain(|s| s.from == 8);
    std::fs::write(&partial, serde_json::to_string(&file).expect("json")).expect("write");
    let o = tunecache(
        &path,
        &["migrate", "--migrations", partial.to_str().expect("utf-8")],
    );
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert!(
        out(&o).contains("no migration path from schema 6 to 9"),
        "{}",
        out(&o)
    );
    assert_eq!(std::fs::read(&path).expect("read"), before);
}

#[test]
fn current_and_missing_files_are_nothing_to_do() {
    let dir = tempfile::tempdir().expect("dir");
    let path = copy_input(dir.path(), 9, "c.tcache");
    let registry = migrations();
    let args = ["migrate", "--migrations", registry.to_str().expect("utf-8")];
    // The golden input is of format 1: its container is lifted to the current format, its
    // results' measurement policy recorded as unknown.
    let o = tunecache(&path, &args);
    assert_eq!(o.status.code(), Some(0));
    assert!(out(&o).contains("container format"), "{}", out(&o));
    let before = std::fs::read(&path).expect("read");
    let o = tunecache(&path, &args);
    assert_eq!(o.status.code(), Some(0));
    assert!(out(&o).contains("already at schema 9"), "{}", out(&o));
    assert_eq!(std::fs::read(&path).expect("read"), before);
    let o = tunecache(
        &dir.path().join("none.tcache"),
        &[
            "migrate",
            "--migrations",
            migrations().to_str().expect("utf-8"),
        ],
    );
    assert_eq!(o.status.code(), Some(0));
    assert!(out(&o).contains("nothing to migrate"), "{}", out(&o));
}

#[test]
fn without_a_registry_migrate_says_what_is_missing() {
    let dir = tempfile::tempdir().expect("dir");
    let path = copy_input(dir.path(), 8, "c.tcache");
    let o = tunecache(&path, &["migrate"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        out(&o).contains(
            "no migration registry for application \"warpconvnet-demo\": pass --migrations FILE"
        ),
        "{}",
        out(&o)
    );
}

#[test]
fn a_migrated_file_reads_back_through_the_library() {
    let dir = tempfile::tempdir().expect("dir");
    let path = copy_input(dir.path(), 6, "c.tcache");
    assert!(
        tunecache(
            &path,
            &[
                "migrate",
                "--migrations",
                migrations().to_str().expect("utf-8")
            ]
        )
        .status
        .success()
    );
    let h100: cache_core::cache_format::Fields = serde_json::from_str(
        r#"{"device":"NVIDIA H100 80GB HBM3","sm":[9,0],"driver":"560.35.03","library":"warpconvnet 1.6"}"#,
    )
    .expect("scope");
    let cache = Cache::builder(registry())
        .file(&path)
        .ignore_env()
        .read_only(true)
        .scope(cache_core::cache_format::Scope::new(h100))
        .open();
    assert!(
        cache.health().migration.is_none(),
        "nothing left to migrate"
    );
    let ns = cache_core::Namespace::new("AB_gather_scatter").expect("ns");
    let key = cache_core::cache_format::Key::new(
        [
            ("li", 4),
            ("lo", 4),
            ("ci", 32),
            ("co", 64),
            ("kv", 27),
            ("gr", 1),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), cache_core::cache_format::Value::Int(v)))
        .chain([(
            "dt".to_owned(),
            cache_core::cache_format::Value::from("float16"),
        )])
        .collect(),
    );
    let hit = cache
        .lookup(ns, &key)
        .expect("found under the migrated key");
    assert_eq!(
        hit.best().map(|c| c.id.algorithm.as_str()),
        Some("mask_gemm")
    );
}

/// An export says which application and schema its lines are written in, and an import
/// passes them through the same version gate as every other read path: a schema-6 export goes
/// into a schema-9 cache migrated (or refused, without the migrations), never stored as it is.
#[test]
fn an_old_export_is_migrated_on_import_not_stored_as_it_is() {
    let dir = tempfile::tempdir().expect("dir");
    let old = copy_input(dir.path(), 6, "old.tcache");
    let exported = dir.path().join("old.jsonl");
    let o = tunecache(&old, &["export", "-o", exported.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let text = std::fs::read_to_string(&exported).expect("export");
    assert!(
        text.lines()
            .all(|l| l.contains(r#""app":"warpconvnet-demo","schema":6"#)),
        "every line says its version: {}",
        text.lines().next().unwrap_or_default()
    );
    // The target: the same data at schema 9.
    let target = copy_input(dir.path(), 9, "new.tcache");
    let migrations = migrations();
    let migrations = migrations.to_str().expect("utf-8");
    let before = std::fs::read(&target).expect("target");
    let refused = tunecache(&target, &["import", exported.to_str().expect("utf-8")]);
    assert_eq!(refused.status.code(), Some(1), "{}", out(&refused));
    assert!(
        out(&refused).contains("pass --migrations"),
        "{}",
        out(&refused)
    );
    assert_eq!(
        std::fs::read(&target).expect("target"),
        before,
        "nothing was imported"
    );
    let o = tunecache(
        &target,
        &[
            "import",
            exported.to_str().expect("utf-8"),
            "--migrations",
            migrations,
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let listed = out(&tunecache(&target, &["--json", "list"]));
    assert!(
        !listed.contains("\"production\""),
        "the v8→v9 rename was applied: {listed}"
    );
    assert!(!listed.contains("c_in"), "the v6→v7 key rename was applied");
    assert!(listed.contains("mask_gemm"), "{listed}");
    // Lines of another application are refused.
    let foreign = text.replace(r#""app":"warpconvnet-demo""#, r#""app":"someone-else""#);
    let foreign_file = dir.path().join("foreign.jsonl");
    std::fs::write(&foreign_file, foreign).expect("write");
    let o = tunecache(
        &target,
        &[
            "import",
            foreign_file.to_str().expect("utf-8"),
            "--migrations",
            migrations,
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert!(out(&o).contains("someone-else"), "{}", out(&o));
}
