//! The CLI under hostile conditions: closed pipes, unwritable stderr, terminal injection,
//! environment switches, special files, held locks, wrong clocks of other tools, and the
//! messages that say what happened.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::commands::{KEY, err, file, put, put_args, text};
use crate::tunecache;

/// A cache whose journal ends in bytes that are not a record: `verify` finds a problem.
fn damaged() -> (tempfile::TempDir, PathBuf) {
    let (d, path) = file();
    put(&path, "tiled", "1200");
    put(&path, "naive", "5000");
    let journal = path.with_file_name("c.tcache.journal");
    let mut bytes = std::fs::read(&journal).expect("a journal");
    bytes.extend_from_slice(&[0xc1; 64]); // 0xc1 is never valid msgpack
    std::fs::write(&journal, bytes).expect("write");
    (d, path)
}

#[test]
fn exit_codes_survive_a_closed_stdout() {
    let (_d, path) = damaged();
    assert_eq!(tunecache(&path, &["verify"]).status.code(), Some(3));
    for args in [&["verify"][..], &["--json", "verify"][..]] {
        let mut child = test_support::cli::command(crate::EXE, &path, args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn");
        drop(child.stdout.take()); // the reader goes away before anything is written
        let status = child.wait().expect("wait");
        assert_eq!(
            status.code(),
            Some(3),
            "{args:?}: the damage is still reported"
        );
    }
}

#[test]
fn nothing_panics_when_stderr_cannot_be_written() {
    let full = || {
        Stdio::from(
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .expect("/dev/full"),
        )
    };
    let (_d, path) = damaged();
    let run = |args: &[&str]| {
        test_support::cli::command(crate::EXE, &path, args)
            .env("TUNECACHE_LOG", "debug")
            .stdout(Stdio::null())
            .stderr(full())
            .status()
            .expect("run")
            .code()
    };
    assert_eq!(run(&["get", "-n", "matmul", "-k", r#"{"m":9}"#]), Some(4));
    assert_eq!(run(&["verify"]), Some(3));
    // A write that warns (the damaged journal) and logs at debug level.
    assert_eq!(run(&put_args(r#"{"m":9}"#, "a", "3")), Some(0));
    assert_eq!(run(&["--no-such-flag"]), Some(2));
}

#[test]
fn a_timeout_no_duration_can_hold_is_a_usage_error() {
    let (_d, path) = file();
    for bad in ["1e20", "-1", "inf", "NaN", "soon"] {
        let flag = format!("--lock-timeout={bad}");
        let o = tunecache(&path, &["migrate", &flag]);
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", err(&o));
        assert!(err(&o).contains("--lock-timeout"), "{bad}: {}", err(&o));
        assert!(!err(&o).contains("panicked"), "{}", err(&o));
    }
}

/// A key whose string value carries an escape sequence (JSON allows it).
const EVIL_KEY: &str = r#"{"m":1,"dtype":"f\u001b[31m16"}"#;

#[test]
fn names_from_the_file_cannot_drive_the_terminal_or_fake_lines() {
    let (_d, path) = file();
    let evil_algo = "tiled\u{1b}]0;pwned\u{7}\u{1b}[2J";
    let evil_reason = "oom\nproblem: a line that is not ours\r";
    for (algo, extra) in [
        (evil_algo, vec!["--median-ns", "10"]),
        ("naive", vec!["--failed", evil_reason]),
    ] {
        let mut args = vec!["put", "-n", "matmul", "-k", EVIL_KEY, "--algo", algo];
        args.extend(extra);
        let o = tunecache(&path, &args);
        assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    }
    let key = ["-n", "matmul", "-k", EVIL_KEY];
    for args in [
        vec!["list"],
        [&["get"][..], &key[..]].concat(),
        [&["show"][..], &key[..]].concat(),
        vec!["stats"],
    ] {
        let o = tunecache(&path, &args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", err(&o));
        let out = text(&o);
        assert!(
            !out.chars().any(|c| c.is_control() && c != '\n'),
            "{args:?} printed a control character: {out:?}"
        );
        assert!(
            !out.lines().any(|l| l.starts_with("problem:")),
            "{args:?} printed a line from the file as its own: {out}"
        );
        assert!(
            out.contains("\\u{1b}") || args[0] == "stats",
            "{args:?}: {out}"
        );
    }
}

/// Each message says what happened and what to do, once.
#[test]
fn messages_say_what_happened_once() {
    let (dir, path) = file();
    // An OS error is not printed twice.
    let not_a_dir = dir.path().join("plain-file");
    std::fs::write(&not_a_dir, b"x").expect("write");
    let o = tunecache(&not_a_dir.join("c.tcache"), &["stats"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(err(&o).matches("os error").count(), 1, "{}", err(&o));
    // Params are not called a key.
    let put_with = |extra: &[&str]| {
        let mut args = vec!["put", "-n", "matmul", "-k", KEY, "--algo", "a"];
        args.extend_from_slice(extra);
        tunecache(&path, &args)
    };
    let o = put_with(&["--median-ns", "1", "--params", "nope"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err(&o).contains("--params") && !err(&o).contains("for a key"),
        "{}",
        err(&o)
    );
    // An integer out of range is not called a float.
    for big in [
        r#"{"m":-9223372036854775809}"#,
        r#"{"m":18446744073709551616}"#,
        r#"{"m":9223372036854775808}"#,
    ] {
        let o = tunecache(&path, &put_args(big, "a", "1"));
        assert_eq!(o.status.code(), Some(1), "{big}");
        assert!(
            err(&o).contains("out of range") && !err(&o).contains("float"),
            "{big}: {}",
            err(&o)
        );
        // The rounded float named another integer (-2^63, which is in range).
        assert!(
            !err(&o).contains("integer -9223372036854775808 is"),
            "{big}: {}",
            err(&o)
        );
    }
    assert!(
        err(&tunecache(&path, &put_args(r#"{"m":1.5}"#, "a", "1")))
            .contains("floats are not allowed")
    );
    // Statistics that contradict each other are a usage error, not a strange entry.
    for extra in [
        &["--median-ns", "1", "--min-ns", "5"][..],
        &["--median-ns", "1", "--samples", "0"][..],
        // No measured kernel takes no time (every shared-tier reader refuses such a value).
        &["--median-ns", "0"][..],
        &["--median-ns=-0"][..],
        &["--median-ns", "-5"][..],
        &["--median-ns", "NaN"][..],
    ] {
        let o = put_with(extra);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", err(&o));
        assert!(
            err(&o).contains("--"),
            "{extra:?} names the option: {}",
            err(&o)
        );
    }
    // Nothing to tune is a usage error, not a "warm run".
    for flag in ["--steps=0", "--repeat=0"] {
        let o = tunecache(&path, &["tune", "--backend", "cpu", flag, "--no-progress"]);
        assert_eq!(o.status.code(), Some(2), "{flag}: {}", err(&o));
        assert!(!text(&o).contains("warm run"), "{flag}");
    }
}

#[test]
fn a_write_that_cannot_finish_says_to_run_it_again() {
    let (dir, path) = file();
    put(&path, "tiled", "1200");
    let _held = test_support::hold_lock(&dir.path().join("c.tcache.lock"));
    let o = test_support::cli::command(
        crate::EXE,
        &path,
        &[&put_args(KEY, "b", "5")[..], &["--wait", "1"]].concat(),
    )
    .env("TUNECACHE_TEST_LOCK_TIMEOUT_MS", "200")
    .output()
    .expect("run");
    assert_eq!(o.status.code(), Some(1), "{}", err(&o));
    assert!(
        !err(&o).contains("in the background"),
        "the process exits: {}",
        err(&o)
    );
    assert!(!err(&o).contains("will retry"), "{}", err(&o));
    // A longer wait says, while it waits, that it is still saving (issue 8, case 11).
    let o = test_support::cli::command(
        crate::EXE,
        &path,
        &[&put_args(KEY, "b", "5")[..], &["--wait", "3"]].concat(),
    )
    .output()
    .expect("run");
    assert_eq!(o.status.code(), Some(1), "{}", err(&o));
    assert!(
        err(&o).contains("still saving the result to"),
        "progress while waiting: {}",
        err(&o)
    );
}

#[test]
fn log_lines_carry_no_colour_codes_when_stderr_is_not_a_terminal() {
    let (_d, path) = file();
    // A table cut short: tunecache's, unusable, moved aside with a warning.
    std::fs::write(&path, b"\x96\xa9tunecache\x04TB").expect("write");
    let o = tunecache(&path, &put_args(KEY, "a", "1"));
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(
        err(&o).contains("is unusable"),
        "the warning is there: {}",
        err(&o)
    );
    assert!(!err(&o).contains('\u{1b}'), "{:?}", err(&o));
}

/// Whatever a cache holds comes back through its own export, even a name the commands that
/// record new results now refuse (an empty algorithm name, once accepted by `put`).
#[test]
fn a_cache_s_own_export_imports_back_whole() {
    use cache_core::cache_format::{
        CacheData, Candidate, Entry, Fields, Fingerprint, Key, Origin, Scope, Stats, Value,
        encode_snapshot,
    };
    let (dir, path) = file();
    let stats = Stats {
        median_ns: 5.0,
        min_ns: 4.0,
        spread_ns: 0.5,
        samples: 3,
    };
    let mut data = CacheData::new();
    for i in 0..100 {
        let key = Key::new(Fields::from([("m".to_owned(), Value::Int(i))]));
        let name = if i % 10 == 0 { "" } else { "tiled" };
        data.insert(
            &Scope::default(),
            "matmul",
            Entry::new(
                key,
                Fingerprint::default(),
                Origin::Imported("t".into()),
                1,
                [Candidate::measured(name, Fields::new(), stats)],
            ),
        );
    }
    std::fs::write(&path, encode_snapshot("tunecache", 1, &data)).expect("write");
    let exported = dir.path().join("all.jsonl");
    let o = tunecache(&path, &["export", "-o", exported.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let copy = dir.path().join("copy.tcache");
    let o = tunecache(&copy, &["import", exported.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let listed = |p: &Path| text(&tunecache(p, &["--json", "list"])).lines().count();
    assert_eq!(listed(&copy), 100, "every entry came back");
    // New results with an empty name are refused where they enter.
    let o = tunecache(&path, &put_args(KEY, "", "1"));
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
}

#[test]
fn commands_on_a_path_that_is_not_a_regular_file_fail_at_once_and_touch_nothing() {
    let (dir, _) = file();
    let fifo = dir.path().join("fifo.tcache");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo")
            .success()
    );
    let zero = dir.path().join("zero.tcache");
    std::os::unix::fs::symlink("/dev/zero", &zero).expect("symlink");
    for path in [&fifo, &zero] {
        for args in [
            &["stats"][..],
            &["verify"][..],
            &put_args(KEY, "a", "1")[..],
            &["migrate", "--dry-run"][..],
        ] {
            let mut child = test_support::cli::command(crate::EXE, path, args)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn");
            let done = test_support::wait_until(std::time::Duration::from_secs(10), || {
                matches!(child.try_wait(), Ok(Some(_)))
            });
            if !done {
                let _ = child.kill();
            }
            assert!(done, "{args:?} on {} blocked", path.display());
            let o = child.wait_with_output().expect("output");
            assert_eq!(o.status.code(), Some(1), "{args:?}: {}", err(&o));
            assert!(
                err(&o).contains("not a regular file"),
                "{args:?}: {}",
                err(&o)
            );
        }
    }
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .expect("dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names.len(), 2, "nothing was created: {names:?}");
}

/// Seen once (issue 24): a procfs file claims size 0 and was read to the 1 GiB bound before
/// failing; it is refused at once, named as what it is.
#[test]
#[cfg(target_os = "linux")]
fn a_procfs_file_as_the_cache_file_is_refused_without_reading_it() {
    let (dir, _) = file();
    let link = dir.path().join("proc.tcache");
    std::os::unix::fs::symlink("/proc/self/pagemap", &link).expect("symlink");
    for args in [
        &["stats"][..],
        &["verify"][..],
        &["migrate", "--dry-run"][..],
    ] {
        let t = std::time::Instant::now();
        let o = tunecache(&link, args);
        assert!(
            t.elapsed() < std::time::Duration::from_secs(5),
            "{args:?}: {:?}",
            t.elapsed()
        );
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", err(&o));
        assert!(err(&o).contains("procfs"), "{args:?}: {}", err(&o));
    }
}

/// A command-line write waits for its own save for as long as --wait allows: a lock held
/// past the library's default bound (2 s) no longer fails the put.
#[test]
fn a_put_waits_for_a_lock_held_a_while() {
    let (dir, path) = file();
    put(&path, "tiled", "1200");
    let lock = dir.path().join("c.tcache.lock");
    let holder = std::thread::spawn(move || {
        let held = test_support::hold_lock(&lock);
        std::thread::sleep(std::time::Duration::from_secs(3));
        drop(held);
    });
    std::thread::sleep(std::time::Duration::from_millis(200));
    let o = tunecache(&path, &put_args(KEY, "late", "7"));
    holder.join().expect("holder");
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let o = tunecache(&path, &["get", "-n", "matmul", "-k", KEY]);
    assert!(text(&o).contains("late"), "saved: {}", text(&o));
}

#[test]
fn an_import_with_an_entry_no_reader_would_accept_imports_nothing() {
    let (dir, path) = file();
    put(&path, "tiled", "1200");
    let before = std::fs::read(path.with_file_name("c.tcache.journal")).ok();
    let deep = format!("{}1{}", "[".repeat(40), "]".repeat(40));
    let lines = format!(
        "{{\"scope\":{{}},\"namespace\":\"matmul\",\"key\":{{\"m\":1}},\"candidates\":[{{\"algo\":\"a\",\"median_ns\":5}}]}}\n\
         {{\"scope\":{{}},\"namespace\":\"matmul\",\"key\":{{\"shape\":{deep}}},\"candidates\":[{{\"algo\":\"a\",\"median_ns\":5}}]}}\n"
    );
    let input = dir.path().join("deep.jsonl");
    std::fs::write(&input, lines).expect("write");
    let o = tunecache(&path, &["import", input.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(1), "{}", err(&o));
    assert!(err(&o).contains("nothing was imported"), "{}", err(&o));
    assert_eq!(
        std::fs::read(path.with_file_name("c.tcache.journal")).ok(),
        before
    );
}

/// Issue 8, case 1: `put` of a result no reader could read back (a param nested past the
/// readers' bound) fails with exit 1 and a message naming the field; nothing is written, and a
/// param one level shallower is recorded.
#[test]
fn put_refuses_what_no_reader_could_read_and_names_the_field() {
    let (_d, path) = file();
    let nested = |depth: usize| format!(r#"{{"p":{}1{}}}"#, "[".repeat(depth), "]".repeat(depth));
    let deep = nested(24);
    let mut args = put_args(KEY, "tiled", "1200").to_vec();
    args.extend(["--params", &deep]);
    let o = tunecache(&path, &args);
    assert_eq!(o.status.code(), Some(1), "{}", err(&o));
    assert!(
        err(&o).contains(r#"param "p" nests 24 levels; readers accept at most 23"#),
        "{}",
        err(&o)
    );
    assert!(!path.exists(), "nothing was written");
    let ok = nested(23);
    let mut args = put_args(KEY, "tiled", "1200").to_vec();
    args.extend(["--params", &ok]);
    let o = tunecache(&path, &args);
    assert!(o.status.success(), "{}", err(&o));
    let o = tunecache(&path, &["verify"]);
    assert!(o.status.success(), "{}{}", text(&o), err(&o));
}

/// Issue 8, case 11: a compaction a command-line write has no time for does not make the cache
/// unwritable. The journal here has grown past its share, so the next save is due to compact
/// 80,000 entries; `put --wait 2` gives the compaction a quarter of that, then appends, and
/// says "recorded" truthfully, every time.
#[test]
fn a_compaction_the_put_has_no_time_for_does_not_fail_it() {
    use cache_core::cache_format::{Candidate, Entry, Fields, Fingerprint, Key, Stats};
    use cache_core::cache_migrate::Migrations;
    use cache_core::{Cache, Namespace, Store};
    let (_d, path) = file();
    let ns = Namespace::new("matmul").expect("name");
    let stats = Stats {
        median_ns: 10.0,
        min_ns: 9.0,
        spread_ns: 0.5,
        samples: 5,
    };
    let entry = |i: i64| {
        let key = Key::new(Fields::from([("i".to_owned(), i.into())]));
        let c = Candidate::measured("tiled", Fields::new(), stats);
        Entry::new(
            key,
            Fingerprint::default(),
            cache_core::measured_here(),
            1,
            [c],
        )
    };
    for half in 0..2 {
        // Never compacts: the first save writes the snapshot, later ones append.
        let cache = Cache::builder(Migrations::new("bench", 1))
            .file(&path)
            .ignore_env()
            .refresh_interval(None)
            .compaction(1e9, u64::MAX)
            .open();
        for i in 0..40_000 {
            cache.put(ns, entry(half * 40_000 + i));
        }
        cache.flush().expect("saved");
    }
    let journal = path.with_file_name("c.tcache.journal");
    assert!(std::fs::metadata(&journal).expect("journal").len() > 1 << 20);
    for attempt in 0..2 {
        let algo = format!("algo{attempt}");
        let mut args = put_args(KEY, &algo, "1200").to_vec();
        args.extend(["--wait", "2"]);
        let started = std::time::Instant::now();
        let o = tunecache(&path, &args);
        assert!(
            o.status.success(),
            "attempt {attempt} ({:?}): {}",
            started.elapsed(),
            err(&o)
        );
    }
    let o = tunecache(&path, &["get", "-n", "matmul", "-k", KEY]);
    assert!(
        text(&o).contains("algo0") && text(&o).contains("algo1"),
        "{}",
        text(&o)
    );
    let o = tunecache(&path, &["stats"]);
    assert!(text(&o).contains("80001"), "{}", text(&o));
}

/// Issue 24, case 20: keys and names holding DEL, C1 controls or bidirectional characters are
/// exported as JSON escapes (valid JSON, safe to print), to stdout and to a file alike, so
/// `export | import` works; `--json` reports escape them the same way.
#[test]
fn json_output_escapes_what_a_terminal_would_act_on() {
    let (dir, path) = file();
    let key = r#"{"name":"a\u007fb\u009b[2Jc\u202ed"}"#;
    let o = tunecache(&path, &put_args(key, "evil\u{202e}algo", "5"));
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let to_file = dir.path().join("e.jsonl");
    let file_out = tunecache(&path, &["export", "-o", to_file.to_str().expect("utf-8")]);
    assert_eq!(file_out.status.code(), Some(0), "{}", err(&file_out));
    let stdout = tunecache(&path, &["export"]);
    let get = tunecache(&path, &["--json", "get", "-n", "matmul", "-k", key]);
    let written = std::fs::read_to_string(&to_file).expect("export");
    for (what, out) in [
        ("stdout", text(&stdout)),
        ("file", written),
        ("get --json", text(&get)),
    ] {
        assert!(out.is_ascii(), "{what}: {out:?}");
        for line in out.lines() {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {line}"));
            assert!(
                v.to_string().contains("\u{202e}"),
                "{what}: the text survives: {v}"
            );
        }
    }
    let copy = dir.path().join("copy.tcache");
    let mut import = test_support::cli::command(crate::EXE, &copy, &["import"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("import");
    std::io::Write::write_all(&mut import.stdin.take().expect("stdin"), &stdout.stdout)
        .expect("pipe");
    assert!(import.wait().expect("import").success(), "export | import");
    let again = text(&tunecache(&copy, &["export"]));
    for part in [r"a\u007fb\u009b[2Jc\u202ed", r"evil\u202ealgo"] {
        assert!(again.contains(part), "the same entry came back: {again}");
    }
}
