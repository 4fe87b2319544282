//! Each command end to end, its exit codes, and bad input.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::tunecache;

pub(crate) const KEY: &str = r#"{"m":128,"n":256,"k":64,"dtype":"float16"}"#;

pub(crate) fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub(crate) fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub(crate) fn file() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("c.tcache");
    (dir, path)
}

/// `put -n matmul -k KEY --algo ALGO --median-ns MEDIAN`.
pub(crate) fn put_args<'a>(key: &'a str, algo: &'a str, median: &'a str) -> [&'a str; 9] {
    [
        "put",
        "-n",
        "matmul",
        "-k",
        key,
        "--algo",
        algo,
        "--median-ns",
        median,
    ]
}

pub(crate) fn put(path: &Path, algo: &str, median: &str) {
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

/// An import holds its entries as their bytes, not the model: into a new file it must write
/// exactly the snapshot of the model its lines make (keys given twice merged), and into a file
/// with entries, the merge of both.
#[test]
fn an_import_writes_the_snapshot_of_the_model_its_lines_make() {
    use cache_format::json::{ImportOrigin, parse_lines};
    use cache_format::{CacheData, Limits};
    let data_of = |path: &std::path::Path| -> CacheData {
        cache_core::inspect(path, &Limits::default(), None)
            .expect("reads")
            .data()
    };
    let (dir, path) = file();
    let input = dir.path().join("in.jsonl");
    let mut lines = String::new();
    for i in 0..40 {
        let ns = ["matmul", "conv"][i % 2];
        let scope = [r#"{}"#, r#"{"device":"H100"}"#][(i / 2) % 2];
        lines.push_str(&format!(
            r#"{{"scope":{scope},"namespace":"{ns}","key":{{"m":{}}},"recorded_at":1700000000000,"candidates":[{{"algo":"a{}","median_ns":{},"measured_at":1700000000{:03}}}]}}"#,
            i % 20,
            i % 3,
            5 + i,
            i
        ));
        lines.push('\n');
    }
    std::fs::write(&input, &lines).expect("write");
    let source = input.display().to_string();
    let model = parse_lines(&lines, &source, ImportOrigin::MarkImported).expect("parses");
    assert!(model.len() < 40, "some keys come twice and are merged");
    let o = tunecache(&path, &["import", input.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let bytes = std::fs::read(&path).expect("written");
    let app = cache_format::table::Table::open(bytes.clone(), &Limits::default())
        .expect("a table")
        .head()
        .app
        .clone();
    assert_eq!(
        bytes,
        cache_format::table::table_bytes(&app, 1, None, &model),
        "the model's table"
    );
    // Into a file that has entries: the merge of both.
    let (_d2, other) = file();
    put(&other, "tiled", "1200");
    let before = data_of(&other);
    let o = tunecache(&other, &["import", input.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let o = tunecache(&other, &["verify"]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let after = data_of(&other);
    let mut expected = before;
    expected.merge(model);
    let journal = other.with_extension("tcache.journal");
    if !journal.exists() {
        assert_eq!(after, expected);
    } else {
        // Appended as a journal record: the entries as the library reads them.
        let stats: serde_json::Value =
            serde_json::from_str(&text(&tunecache(&other, &["stats", "--json"]))).expect("json");
        assert_eq!(stats["entries"], expected.len(), "{stats}");
    }
}

/// A few lines into a large cache are one journal record: the snapshot is neither decoded
/// nor rewritten (its bytes stay as they were), and the entries read back merged with it.
#[test]
fn a_small_import_into_a_large_cache_is_one_journal_record() {
    let (dir, path) = file();
    let line = |m: usize, algo: &str| {
        format!(
            r#"{{"scope":{{}},"namespace":"matmul","key":{{"m":{m}}},"recorded_at":1700000000000,"candidates":[{{"algo":"{algo}","median_ns":5,"measured_at":1700000000000}}]}}"#
        ) + "\n"
    };
    let big = dir.path().join("big.jsonl");
    std::fs::write(&big, (0..300).map(|m| line(m, "a")).collect::<String>()).expect("write");
    let o = tunecache(&path, &["import", big.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let snapshot = std::fs::read(&path).expect("snapshot");
    let journal = path.with_extension("tcache.journal");
    assert!(!journal.exists());
    // Two new keys, and a second candidate for key 7.
    let small = dir.path().join("small.jsonl");
    std::fs::write(
        &small,
        [line(1000, "a"), line(1001, "a"), line(7, "b")].concat(),
    )
    .expect("write");
    let o = tunecache(&path, &["import", small.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(text(&o).contains("imported 3 entries"), "{}", text(&o));
    assert_eq!(
        std::fs::read(&path).expect("snapshot"),
        snapshot,
        "not rewritten"
    );
    assert!(journal.exists(), "appended as a journal record");
    let stats: serde_json::Value =
        serde_json::from_str(&text(&tunecache(&path, &["stats", "--json"]))).expect("json");
    assert_eq!(stats["entries"], 302, "{stats}");
    assert_eq!(stats["journal"]["records"], 1, "{stats}");
    let o = tunecache(
        &path,
        &["get", "-n", "matmul", "-k", r#"{"m":7}"#, "--json"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let got = text(&o);
    assert!(
        got.contains("\"a\"") && got.contains("\"b\""),
        "both candidates of key 7: {got}"
    );
    let o = tunecache(&path, &["verify"]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
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

#[test]
fn a_migration_file_that_is_a_fifo_or_huge_is_refused_unread() {
    let dir = test_support::temp_dir();
    let cache = dir.path().join("c.tcache");
    let put = crate::tunecache(
        &cache,
        &[
            "put",
            "-n",
            "mm",
            "-k",
            "{}",
            "--algo",
            "x",
            "--median-ns",
            "5",
        ],
    );
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    let fifo = dir.path().join("m.json");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    let huge = dir.path().join("huge.json");
    std::fs::File::create(&huge)
        .expect("create")
        .set_len(1 << 30)
        .expect("sparse");
    for file in [&fifo, &huge] {
        let f = file.to_str().expect("utf-8");
        let started = std::time::Instant::now();
        let (ok, kib) = crate::large::peak_kib(test_support::cli::command(
            crate::EXE,
            &cache,
            &["migrate", "--migrations", f],
        ));
        assert!(!ok, "{f} refused");
        assert!(kib < 100 * 1024, "{f} read: {kib} KiB");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "no wait on a FIFO"
        );
        let out = crate::tunecache(&cache, &["migrate", "--migrations", f]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("cannot read") && err.contains(f), "{err}");
    }
}
