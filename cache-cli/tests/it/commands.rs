//! Each command end to end, its exit codes, and bad input.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::tunecache;

const KEY: &str = r#"{"m":128,"n":256,"k":64,"dtype":"float16"}"#;

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn file() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("c.tcache");
    (dir, path)
}

fn put(path: &Path, algo: &str, median: &str) {
    let o = tunecache(
        path,
        &[
            "put",
            "-n",
            "matmul",
            "-k",
            KEY,
            "--algo",
            algo,
            "--params",
            r#"{"tile":32}"#,
            "--median-ns",
            median,
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
}

#[test]
fn put_then_get_list_stats_show_the_ranking() {
    let (_d, path) = file();
    put(&path, "tiled", "1200");
    put(&path, "naive", "5000");
    let o = tunecache(
        &path,
        &[
            "get",
            "-n",
            "matmul",
            "-k",
            r#"{"dtype":"float16","k":64,"n":256,"m":128}"#,
        ],
    );
    assert_eq!(o.status.code(), Some(0));
    let out = text(&o);
    let tiled = out.find("tiled").expect("tiled listed");
    let naive = out.find("naive").expect("naive listed");
    assert!(tiled < naive, "best first: {out}");
    assert!(
        out.contains("0e1b3268bc863dcd8fc87916d051a86e"),
        "the documented fingerprint: {out}"
    );

    let o = tunecache(&path, &["list"]);
    assert!(text(&o).contains("tiled"), "{}", text(&o));
    let o = tunecache(&path, &["--json", "stats"]);
    let v: serde_json::Value = serde_json::from_str(&text(&o)).expect("stats --json is JSON");
    assert_eq!(v["entries"], 1);
    assert_eq!(v["app"], "tunecache");
}

#[test]
fn get_of_a_missing_key_exits_4() {
    let (_d, path) = file();
    put(&path, "tiled", "1200");
    let o = tunecache(&path, &["get", "-n", "matmul", "-k", r#"{"m":1}"#]);
    assert_eq!(o.status.code(), Some(4));
    assert!(err(&o).contains("no entry"), "{}", err(&o));
}

#[test]
fn a_missing_file_is_an_error_naming_it() {
    let (_d, path) = file();
    let o = tunecache(&path, &["stats"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err(&o).contains(&path.display().to_string()) && err(&o).contains("no such cache file"),
        "{}",
        err(&o)
    );
}

#[test]
fn a_wrong_flag_is_a_usage_error() {
    let (_d, path) = file();
    let o = tunecache(&path, &["list", "--no-such-flag"]);
    assert_eq!(o.status.code(), Some(2));
    let o = tunecache(
        &path,
        &[
            "put",
            "-n",
            "x",
            "-k",
            "{}",
            "--algo",
            "a",
            "--median-ns",
            "-5",
        ],
    );
    assert_eq!(
        o.status.code(),
        Some(2),
        "a negative time is refused: {}",
        err(&o)
    );
}

#[test]
fn a_float_in_a_key_is_refused_with_the_reason() {
    let (_d, path) = file();
    let o = tunecache(
        &path,
        &[
            "put",
            "-n",
            "x",
            "-k",
            r#"{"alpha":0.5}"#,
            "--algo",
            "a",
            "--median-ns",
            "5",
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("floats are not allowed"), "{}", err(&o));
    assert!(!path.exists(), "nothing was written");
}

#[test]
fn verify_passes_a_healthy_cache_and_fails_a_damaged_one_without_touching_it() {
    let (_d, path) = file();
    put(&path, "tiled", "1200");
    put(&path, "naive", "5000");
    let o = tunecache(&path, &["verify"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let mut bytes = std::fs::read(&path).expect("snapshot");
    let at = bytes.len() - 20;
    bytes[at] ^= 0x10;
    std::fs::write(&path, &bytes).expect("damage it");
    let o = tunecache(&path, &["verify"]);
    assert_eq!(o.status.code(), Some(3));
    assert!(
        text(&o).contains("checksum mismatch") && text(&o).contains(&path.display().to_string()),
        "{}",
        text(&o)
    );
    assert_eq!(
        std::fs::read(&path).expect("snapshot"),
        bytes,
        "verify changed the file"
    );
}

#[test]
fn export_then_import_carries_every_entry() {
    let (dir, path) = file();
    put(&path, "tiled", "1200");
    let o = tunecache(
        &path,
        &[
            "put",
            "-n",
            "conv",
            "-k",
            r#"{"c":3}"#,
            "--algo",
            "winograd",
            "--median-ns",
            "7",
            "--scope",
            r#"{"device":"H100"}"#,
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let exported = dir.path().join("e.jsonl");
    let o = tunecache(&path, &["export", "-o", exported.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let other = dir.path().join("other.tcache");
    let o = tunecache(&other, &["import", exported.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(text(&o).contains("imported 2 entries"));
    let a = text(&tunecache(&path, &["list"]));
    let b = text(&tunecache(&other, &["list"]));
    assert_eq!(a, b, "same entries, scopes and winners");
}

#[test]
fn an_import_with_a_bad_line_names_it_and_imports_nothing() {
    let (dir, path) = file();
    let input = dir.path().join("in.jsonl");
    std::fs::write(
        &input,
        concat!(
            r#"{"scope":{},"namespace":"matmul","key":{"m":1},"candidates":[{"algo":"a","median_ns":5}]}"#,
            "\n",
            r#"{"scope":{},"namespace":"matmul","key":{"m":2},"candidates":[{"algo":"a","median":5}]}"#,
            "\n"
        ),
    )
    .expect("write");
    let o = tunecache(&path, &["import", input.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err(&o).contains("line 2") && err(&o).contains("median"),
        "{}",
        err(&o)
    );
    assert!(!path.exists(), "nothing was imported");
}

#[test]
fn import_reads_stdin() {
    let (_d, path) = file();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tunecache"))
        .arg("--cache-file")
        .arg(&path)
        .arg("import")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(br#"{"scope":{},"namespace":"matmul","key":{"m":1},"candidates":[{"algo":"a","median_ns":5}]}"#)
        .expect("write");
    assert!(child.wait().expect("wait").success());
    let o = tunecache(&path, &["get", "-n", "matmul", "-k", r#"{"m":1}"#]);
    assert_eq!(o.status.code(), Some(0));
}

#[test]
fn a_closed_pipe_ends_quietly() {
    let (_d, path) = file();
    let mut lines = String::new();
    for i in 0..3000 {
        lines.push_str(&format!(
            "{{\"scope\":{{}},\"namespace\":\"matmul\",\"key\":{{\"m\":{i}}},\"candidates\":[{{\"algo\":\"a\",\"median_ns\":5}}]}}\n"
        ));
    }
    let input = path.with_extension("jsonl");
    std::fs::write(&input, lines).expect("write");
    assert!(
        tunecache(&path, &["import", input.to_str().expect("utf-8")])
            .status
            .success()
    );
    let mut child = test_support::cli::command(crate::EXE, &path, &["list"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("one line");
    // The reader is dropped here: the rest of the output hits a closed pipe.
    let o = child.wait_with_output().expect("wait");
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(!err(&o).contains("panicked"), "{}", err(&o));
}

#[test]
fn a_newer_file_is_not_written_and_the_error_says_why() {
    let (_d, path) = file();
    put(&path, "tiled", "1200");
    let mut bytes = std::fs::read(&path).expect("snapshot");
    bytes[11] = 0x07; // a future format version
    std::fs::write(&path, &bytes).expect("write");
    let o = tunecache(
        &path,
        &[
            "put",
            "-n",
            "matmul",
            "-k",
            KEY,
            "--algo",
            "x",
            "--median-ns",
            "1",
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("newer"), "{}", err(&o));
    assert_eq!(std::fs::read(&path).expect("snapshot"), bytes);
}

/// Every JSON document in `o`'s stdout: one indented document, or one per line.
fn json_documents(o: &Output) -> Vec<serde_json::Value> {
    let out = text(o);
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(&out) {
        return vec![v];
    }
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

#[test]
fn every_command_honours_json() {
    let (dir, path) = file();
    put(&path, "tiled", "1200");
    let exported = dir.path().join("out.jsonl");
    let exported = exported.to_str().expect("utf-8");
    let runs: [&[&str]; 10] = [
        &["stats"],
        &["list"],
        &["get", "-n", "matmul", "-k", KEY],
        &["show", "-n", "matmul", "-k", KEY],
        &["verify"],
        &["export"],
        &["export", "-o", exported],
        &["import", exported],
        &[
            "put",
            "-n",
            "matmul",
            "-k",
            KEY,
            "--algo",
            "naive",
            "--median-ns",
            "9000",
        ],
        &["migrate", "--dry-run"],
    ];
    for args in runs {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let o = tunecache(&path, &all);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", err(&o));
        let docs = json_documents(&o);
        assert!(!docs.is_empty(), "{args:?} printed no JSON");
        assert!(
            docs.iter().all(serde_json::Value::is_object),
            "{args:?}: {docs:?}"
        );
    }
}

#[test]
fn stats_and_verify_say_what_a_load_would_do() {
    let (_d, path) = file();
    put(&path, "tiled", "1200");
    let o = tunecache(&path, &["stats"]);
    assert!(
        text(&o).contains("versions   as stored, schema 1; current for this build"),
        "{}",
        text(&o)
    );
    let o = tunecache(&path, &["--json", "verify"]);
    let v: serde_json::Value = serde_json::from_str(&text(&o)).expect("JSON");
    assert_eq!(v["gate"], "as stored, schema 1; current for this build");
    // Another application's file: this tool knows no migrations of it, and says so.
    let other = path.with_file_name("other.tcache");
    let o = tunecache(
        &other,
        &[
            "--app",
            "elsewhere",
            "put",
            "-n",
            "m",
            "-k",
            "{}",
            "--algo",
            "a",
            "--median-ns",
            "1",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let o = tunecache(&other, &["stats"]);
    assert!(
        text(&o)
            .contains("as stored, elsewhere schema 1; this build knows no migrations of elsewhere"),
        "{}",
        text(&o)
    );
}

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
    assert_eq!(
        run(&[
            "put",
            "-n",
            "matmul",
            "-k",
            r#"{"m":9}"#,
            "--algo",
            "a",
            "--median-ns",
            "3"
        ]),
        Some(0)
    );
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

#[test]
fn the_environment_switches_refuse_writes_and_leave_inspection_alone() {
    let (_d, path) = file();
    put(&path, "tiled", "1200");
    let files = || {
        let journal = path.with_file_name("c.tcache.journal");
        (std::fs::read(&path).ok(), std::fs::read(journal).ok())
    };
    let before = files();
    let with = |var: &str, value: &str, args: &[&str]| {
        test_support::cli::command(crate::EXE, &path, args)
            .env(var, value)
            .output()
            .expect("run")
    };
    let put_args = [
        "put",
        "-n",
        "matmul",
        "-k",
        KEY,
        "--algo",
        "x",
        "--median-ns",
        "1",
    ];
    let import_args = ["import", "/dev/null"];
    let tune_args = ["tune", "--backend", "cpu", "--steps", "1", "--no-progress"];
    for var in ["TUNECACHE_READ_ONLY", "TUNECACHE_DISABLE"] {
        for args in [
            &put_args[..],
            &import_args[..],
            &tune_args[..],
            &["migrate"][..],
        ] {
            let o = with(var, "1", args);
            assert_eq!(o.status.code(), Some(1), "{var} {args:?}: {}", err(&o));
            assert!(
                err(&o).contains(var) && err(&o).contains("nothing was written"),
                "{var} {args:?}: {}",
                err(&o)
            );
        }
        for args in [
            &["stats"][..],
            &["verify"][..],
            &["list"][..],
            &["migrate", "--dry-run"][..],
        ] {
            let o = with(var, "1", args);
            assert_eq!(o.status.code(), Some(0), "{var} {args:?}: {}", err(&o));
        }
        let o = with(var, "maybe", &["stats"]);
        assert_eq!(o.status.code(), Some(2), "{var}=maybe: {}", err(&o));
        assert!(err(&o).contains(&format!("{var}=\"maybe\"")), "{}", err(&o));
    }
    assert_eq!(files(), before, "nothing was written, snapshot or journal");
    assert_eq!(
        with("TUNECACHE_READ_ONLY", "0", &put_args).status.code(),
        Some(0)
    );
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
        let o = tunecache(
            &path,
            &[
                "put",
                "-n",
                "matmul",
                "-k",
                big,
                "--algo",
                "a",
                "--median-ns",
                "1",
            ],
        );
        assert_eq!(o.status.code(), Some(1), "{big}");
        assert!(
            err(&o).contains("out of range") && !err(&o).contains("float"),
            "{big}: {}",
            err(&o)
        );
    }
    assert!(
        err(&tunecache(
            &path,
            &[
                "put",
                "-n",
                "m",
                "-k",
                r#"{"m":1.5}"#,
                "--algo",
                "a",
                "--median-ns",
                "1"
            ]
        ))
        .contains("floats are not allowed")
    );
    // Statistics that contradict each other are a usage error, not a strange entry.
    for extra in [
        &["--median-ns", "1", "--min-ns", "5"][..],
        &["--median-ns", "1", "--samples", "0"][..],
    ] {
        let o = put_with(extra);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", err(&o));
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
        &[
            "put",
            "-n",
            "matmul",
            "-k",
            KEY,
            "--algo",
            "b",
            "--median-ns",
            "5",
            "--wait",
            "1",
        ],
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
}

#[test]
fn log_lines_carry_no_colour_codes_when_stderr_is_not_a_terminal() {
    let (_d, path) = file();
    std::fs::write(&path, b"garbage").expect("write");
    let o = tunecache(
        &path,
        &[
            "put",
            "-n",
            "matmul",
            "-k",
            KEY,
            "--algo",
            "a",
            "--median-ns",
            "1",
        ],
    );
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
    let o = tunecache(
        &path,
        &[
            "put",
            "-n",
            "matmul",
            "-k",
            KEY,
            "--algo",
            "",
            "--median-ns",
            "1",
        ],
    );
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
            &[
                "put",
                "-n",
                "matmul",
                "-k",
                KEY,
                "--algo",
                "a",
                "--median-ns",
                "1",
            ][..],
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
    let o = tunecache(
        &path,
        &[
            "put",
            "-n",
            "matmul",
            "-k",
            KEY,
            "--algo",
            "late",
            "--median-ns",
            "7",
        ],
    );
    holder.join().expect("holder");
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let o = tunecache(&path, &["get", "-n", "matmul", "-k", KEY]);
    assert!(text(&o).contains("late"), "saved: {}", text(&o));
}
