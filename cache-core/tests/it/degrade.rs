//! Unusable locations and switches: read-only, disabled, unwritable, full disk, environment.

use std::collections::HashMap;

use cache_core::{Cache, Location, Mode, Refusal, Store, StoreError};

use crate::support::{
    builder, capture_logs, child_lines, entry, has, ids_on_disk, ns, path_in, registry,
    spawn_child, temp_dir, wait_until, warnings_about,
};

#[test]
fn an_unwritable_location_degrades_to_memory_with_one_warning() {
    capture_logs();
    let dir = temp_dir();
    let blocker = path_in(&dir, "a-file");
    std::fs::write(&blocker, b"x").expect("write");
    // A directory cannot be created under a regular file, even by root.
    let path = blocker.join("sub").join("c.tcache");
    let cache = builder(&path).open();
    assert_eq!(cache.health().mode, Mode::Memory);
    cache.put(ns(), entry(1, 1));
    assert!(has(&cache, 1, 1), "still caches in memory");
    assert!(matches!(
        cache.flush(),
        Err(StoreError::NotPersistent { .. })
    ));
    assert!(matches!(
        cache.flush(),
        Err(StoreError::NotPersistent { .. })
    ));
    drop(cache);
    let warned = warnings_about(&path.display().to_string());
    assert_eq!(warned.len(), 1, "{warned:?}");
}

#[test]
fn read_only_reads_the_file_and_never_writes_it() {
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let writer = builder(&path).open();
    writer.put(ns(), entry(1, 1));
    writer.flush().expect("flush");
    drop(writer);
    let before = std::fs::read(&path).expect("file");
    let cache = builder(&path).read_only(true).open();
    assert_eq!(cache.health().mode, Mode::ReadOnly);
    assert!(has(&cache, 1, 1));
    cache.put(ns(), entry(1, 2));
    assert!(matches!(
        cache.flush(),
        Err(StoreError::NotPersistent { .. })
    ));
    drop(cache);
    assert_eq!(std::fs::read(&path).expect("file"), before);
    assert!(!path_in(&dir, "c.tcache.journal").exists());
}

#[test]
fn disabled_touches_no_file() {
    let dir = temp_dir();
    let path = path_in(&dir, "sub").join("c.tcache");
    let cache = builder(&path).disabled(true).open();
    assert_eq!(cache.health().mode, Mode::Memory);
    cache.put(ns(), entry(1, 1));
    assert!(has(&cache, 1, 1));
    drop(cache);
    assert!(!path_in(&dir, "sub").exists(), "nothing was created");
}

#[test]
fn the_default_file_lives_in_the_user_cache_directory() {
    let (location, _) = Cache::builder(registry(1)).ignore_env().resolve();
    let Location::File { path, read_only } = location else {
        panic!("expected a file: {location:?}")
    };
    assert!(!read_only);
    assert!(
        path.ends_with("tunecache/testapp.tcache"),
        "{}",
        path.display()
    );
    assert_eq!(path.parent(), cache_core::default_dir().as_deref());
}

fn env_child(env: &[(&str, &str)]) -> HashMap<String, String> {
    let dir = temp_dir();
    let mut child = spawn_child("env-open", &path_in(&dir, "unused"), &[], env);
    let lines = child_lines(&mut child);
    assert!(child.wait().expect("wait").success());
    lines
        .iter()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[test]
fn the_environment_overrides_location_and_switches() {
    let dir = temp_dir();
    let d = dir.path().display().to_string();
    let f = path_in(&dir, "explicit.tcache").display().to_string();

    let out = env_child(&[("TUNECACHE_DIR", &d)]);
    assert_eq!(out["path"], format!("{d}/testapp.tcache"));
    assert_eq!(
        (out["mode"].as_str(), out["flush"].as_str()),
        ("Persistent", "ok")
    );
    assert!(path_in(&dir, "testapp.tcache").exists());

    let out = env_child(&[("TUNECACHE_DIR", &d), ("TUNECACHE_FILE", &f)]);
    assert_eq!(out["path"], f, "the file override wins over the directory");

    let out = env_child(&[("TUNECACHE_DIR", &d), ("TUNECACHE_DISABLE", "1")]);
    assert_eq!(
        (
            out["mode"].as_str(),
            out["path"].as_str(),
            out["flush"].as_str()
        ),
        ("Memory", "none", "err")
    );

    let out = env_child(&[("TUNECACHE_FILE", &f), ("TUNECACHE_READ_ONLY", "true")]);
    assert_eq!(
        (out["mode"].as_str(), out["flush"].as_str()),
        ("ReadOnly", "err")
    );
}

#[test]
fn an_invalid_switch_value_is_named_in_a_warning_and_ignored() {
    capture_logs();
    let b = Cache::builder(registry(1)).file("/nonexistent/x.tcache");
    // resolve() reads the real environment; use a value no test sets.
    let (location, warnings) = b.resolve();
    assert!(matches!(location, Location::File { .. }));
    assert!(warnings.is_empty() || warnings.iter().all(|w| w.contains("TUNECACHE_")));
    let dir = temp_dir();
    let mut child = spawn_child(
        "env-open",
        &path_in(&dir, "x"),
        &[],
        &[
            ("TUNECACHE_DISABLE", "maybe"),
            ("TUNECACHE_DIR", &dir.path().display().to_string()),
        ],
    );
    let lines = child_lines(&mut child);
    assert!(child.wait().expect("wait").success());
    assert!(
        lines.contains(&"mode Persistent".to_owned()),
        "an unknown value does not disable: {lines:?}"
    );
}

fn full_disk(how: &str) {
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let cache = builder(&path).open();
    for i in 0..200 {
        cache.put(ns(), entry(1, i));
    }
    cache.flush().expect("flush");
    drop(cache);
    let limit = std::fs::metadata(&path).expect("snapshot").len() + 2048;
    let mut child = spawn_child("fsize", &path, &[limit.to_string(), how.to_owned()], &[]);
    let lines = child_lines(&mut child);
    assert!(child.wait().expect("wait").success(), "{lines:?}");
    assert!(
        lines.iter().any(|l| l.starts_with("flush-failed")),
        "the write hit the limit: {lines:?}"
    );
    assert!(
        lines.contains(&"intact true".to_owned()),
        "the files were left intact: {lines:?}"
    );
    assert!(
        lines.contains(&"flush-ok".to_owned()),
        "saved once space returned: {lines:?}"
    );
    assert_eq!(
        ids_on_disk(&path, 1, 200).len(),
        200,
        "the old results are all there"
    );
    assert_eq!(ids_on_disk(&path, 2, 300).len(), 300, "and the new ones");
}

#[test]
fn a_full_disk_during_an_append_loses_nothing() {
    full_disk("append");
}

#[test]
fn a_full_disk_during_a_compaction_loses_nothing() {
    full_disk("compact");
}

/// A condition is reported once, however often it comes up; how often is said once, when the
/// cache closes.
#[test]
fn a_repeated_condition_warns_once_and_is_counted_at_close() {
    use cache_core::cache_format::{CacheData, Scope, encode_snapshot};
    capture_logs();
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let mut data = CacheData::new();
    for i in 0..50 {
        // A control character makes a namespace name unusable.
        data.insert(
            &Scope::default(),
            &format!("summary-probe-{i}\u{1}"),
            entry(1, i),
        );
    }
    data.insert(&Scope::default(), "matmul", entry(1, 99));
    std::fs::write(&path, encode_snapshot(crate::support::APP, 1, &data)).expect("write");
    let cache = builder(&path).open();
    assert!(has(&cache, 1, 99), "the good entry is read");
    let warned = warnings_about("summary-probe-");
    assert_eq!(warned.len(), 1, "one warning for fifty names: {warned:?}");
    drop(cache);
    let summary = warnings_about("49 more like this were not shown");
    assert_eq!(summary.len(), 1, "{:?}", warnings_about("summary-probe-"));
}

/// A device, a FIFO or a link to one at the cache path: never read (a FIFO would block every
/// open, /dev/zero would be read without end), never renamed or replaced (as root, moving
/// /dev/null aside would break the system), nothing created beside it; memory only, one
/// warning naming it.
#[test]
fn a_path_that_is_not_a_regular_file_is_left_alone() {
    use std::os::unix::fs::FileTypeExt;
    capture_logs();
    let dir = temp_dir();
    let fifo = path_in(&dir, "fifo.tcache");
    let c_path = std::ffi::CString::new(fifo.to_str().expect("utf-8")).expect("no NUL");
    // SAFETY: a valid NUL-terminated path and a mode.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0, "mkfifo");
    let null = path_in(&dir, "null.tcache");
    std::os::unix::fs::symlink("/dev/null", &null).expect("symlink");
    let zero = path_in(&dir, "zero.tcache");
    std::os::unix::fs::symlink("/dev/zero", &zero).expect("symlink");
    for (path, kind) in [
        (&fifo, "a FIFO"),
        (&null, "a character device"),
        (&zero, "a character device"),
    ] {
        let opened = {
            let path = path.clone();
            std::thread::spawn(move || {
                let cache = builder(&path).open();
                cache.put(ns(), entry(1, 1));
                (
                    cache.health().mode,
                    cache.flush().is_err(),
                    has(&cache, 1, 1),
                )
            })
        };
        assert!(
            wait_until(std::time::Duration::from_secs(10), || opened.is_finished()),
            "{kind}: opening the cache blocked"
        );
        let (mode, flush_failed, kept) = opened.join().expect("no panic");
        assert_eq!(mode, Mode::Memory, "{kind}");
        assert!(flush_failed && kept, "{kind}: in memory, not persistent");
        let warned = warnings_about(&path.display().to_string());
        assert_eq!(warned.len(), 1, "{kind}: {warned:?}");
        assert!(warned[0].contains(kind), "{warned:?}");
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        let siblings: Vec<_> = std::fs::read_dir(dir.path())
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&name) && *n != name)
            .collect();
        assert!(siblings.is_empty(), "{kind}: created {siblings:?}");
    }
    assert!(
        std::fs::metadata(&fifo)
            .expect("fifo")
            .file_type()
            .is_fifo()
    );
    assert!(
        std::fs::symlink_metadata(&null)
            .expect("link")
            .file_type()
            .is_symlink()
    );
    assert!(
        std::fs::metadata("/dev/null")
            .expect("/dev/null")
            .file_type()
            .is_char_device()
    );
}

/// An application name that would make a header no reader accepts (over 64 KiB) used to
/// panic the saver thread; now the cache keeps results in memory and says why.
#[test]
fn an_application_name_too_long_for_any_reader_keeps_the_cache_in_memory() {
    capture_logs();
    let dir = temp_dir();
    let path = path_in(&dir, "long.tcache");
    let app = "a".repeat(70 << 10);
    let cache = Cache::builder(cache_core::cache_migrate::Migrations::new(app, 1))
        .file(&path)
        .ignore_env()
        .open();
    cache.put(ns(), entry(1, 1));
    assert!(matches!(
        cache.flush(),
        Err(StoreError::NotPersistent { .. })
    ));
    assert_eq!(cache.health().mode, Mode::Memory);
    assert!(has(&cache, 1, 1));
    assert!(
        cache
            .health()
            .reason
            .is_some_and(|r| r.contains("application name")),
        "{:?}",
        cache.health().reason
    );
    drop(cache);
    assert!(!path.exists(), "no file was written");
}

/// What the library writes, every reader must accept: a batch over the caps is refused before
/// anything is written, whether it would be appended or compacted, and the file keeps what it
/// had.
#[test]
fn the_writer_refuses_what_a_reader_would_refuse() {
    use cache_core::cache_format::{Candidate, Entry, Fingerprint, Limits, Origin, Stats};
    let limits = Limits {
        max_candidates: 3,
        ..Limits::default()
    };
    for compact_always in [false, true] {
        let dir = temp_dir();
        let path = path_in(&dir, "c.tcache");
        let open = || {
            let b = builder(&path).limits(limits);
            if compact_always {
                b.compaction(0.0, 0)
            } else {
                b
            }
            .open()
        };
        let cache = open();
        cache.put(ns(), entry(1, 1));
        cache.flush().expect("a good entry is saved");
        let before = (
            std::fs::read(&path).ok(),
            std::fs::read(path_in(&dir, "c.tcache.journal")).ok(),
        );
        let stats = Stats {
            median_ns: 1.0,
            min_ns: 1.0,
            spread_ns: 0.0,
            samples: 1,
        };
        // Each put is within the cap of 3 candidates; merged, the entry has 4. Put refuses
        // what is over the caps by itself; a merge that grows past them is the writer's to
        // refuse.
        let with = |range: std::ops::Range<u32>| {
            Entry::new(
                crate::support::key(2, 2),
                Fingerprint::default(),
                Origin::Imported("t".into()),
                1,
                range.map(|i| Candidate::measured(format!("c{i}"), Default::default(), stats)),
            )
        };
        cache.put(ns(), with(0..3));
        cache.put(ns(), with(3..4));
        let flushed = cache.flush();
        assert!(
            matches!(&flushed, Err(StoreError::Format { .. })),
            "compact_always={compact_always}: {flushed:?}"
        );
        drop(cache);
        let after = (
            std::fs::read(&path).ok(),
            std::fs::read(path_in(&dir, "c.tcache.journal")).ok(),
        );
        assert_eq!(
            after, before,
            "compact_always={compact_always}: nothing was written"
        );
        assert!(
            has(&open(), 1, 1),
            "compact_always={compact_always}: still readable"
        );
    }
}

/// An entry no reader would accept (non-finite timings, a key nested too deep) is refused where
/// it enters, with a warning, so the good entries recorded with it are saved.
#[test]
fn an_entry_no_reader_would_accept_is_refused_and_costs_the_others_nothing() {
    use cache_core::cache_format::{
        Candidate, Entry, Fields, Fingerprint, Key, Stats, Value, now_millis,
    };
    capture_logs();
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let cache = builder(&path).open();
    let nan = Stats {
        median_ns: f64::NAN,
        min_ns: 1.0,
        spread_ns: 0.0,
        samples: 3,
    };
    let bad_stats = Entry::new(
        crate::support::key(9, 1),
        Fingerprint::default(),
        cache_core::measured_here(),
        now_millis(),
        [Candidate::measured("tiled", Fields::new(), nan)],
    );
    let mut deep = Value::Int(1);
    for _ in 0..40 {
        deep = Value::List(vec![deep]);
    }
    let deep_key = Key::new(Fields::from([("shape".to_owned(), deep)]));
    let ok = Stats {
        median_ns: 5.0,
        min_ns: 5.0,
        spread_ns: 0.0,
        samples: 3,
    };
    let bad_key = Entry::new(
        deep_key.clone(),
        Fingerprint::default(),
        cache_core::measured_here(),
        now_millis(),
        [Candidate::measured("tiled", Fields::new(), ok)],
    );
    cache.put(ns(), entry(1, 1));
    // `try_put` tells the caller (issue 8, case 1), naming what is wrong; `put` warns.
    match cache.try_put(ns(), bad_stats.clone()) {
        Err(StoreError::Refused { namespace, reason }) => {
            assert_eq!(namespace, "matmul");
            assert!(reason.to_string().contains("non-finite"), "{reason}");
            assert!(matches!(reason, Refusal::NonFinite { .. }), "{reason:?}");
        }
        other => panic!("NaN timings must be refused: {other:?}"),
    }
    // Negative timings come from no measurement, and every shared-tier reader refuses them.
    let negative = Entry::new(
        crate::support::key(9, 2),
        Fingerprint::default(),
        cache_core::measured_here(),
        now_millis(),
        [Candidate::measured(
            "tiled",
            Fields::new(),
            Stats {
                median_ns: -1.0,
                min_ns: -1.0,
                spread_ns: 0.0,
                samples: 3,
            },
        )],
    );
    match cache.try_put(ns(), negative) {
        Err(StoreError::Refused { reason, .. }) => {
            assert!(matches!(reason, Refusal::Negative { .. }), "{reason:?}");
            assert!(reason.to_string().contains("negative"), "{reason}");
        }
        other => panic!("negative timings must be refused: {other:?}"),
    }
    match cache.try_put(ns(), bad_key.clone()) {
        Err(StoreError::Refused { reason, .. }) => {
            assert!(
                reason
                    .to_string()
                    .contains("key field \"shape\" nests 40 levels"),
                "{reason}"
            );
            assert!(
                matches!(&reason, Refusal::TooDeep { depth: 40, .. }),
                "{reason:?}"
            );
        }
        other => panic!("a key nested 40 deep must be refused: {other:?}"),
    }
    cache.put(ns(), bad_stats);
    cache.put(ns(), bad_key);
    cache
        .try_put(ns(), entry(1, 2))
        .expect("a good entry is accepted");
    cache.flush().expect("the good entries are saved");
    assert!(cache.lookup(ns(), &crate::support::key(9, 1)).is_none());
    assert!(cache.lookup(ns(), &deep_key).is_none());
    drop(cache);
    assert_eq!(ids_on_disk(&path, 1, 3), [1, 2]);
    let warned = warnings_about("was not recorded");
    assert!(!warned.is_empty(), "a warning says what was refused");
}
