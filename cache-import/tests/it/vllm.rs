//! vLLM / SGLang tuned-config directories: import, and export back byte for byte.

use std::path::Path;

use cache_core::cache_format::{
    CacheData, Candidate, Entry, Fields, Fingerprint, Key, Origin, Outcome, Scope, Stats, Value,
};
use cache_import::Format;
use cache_import::vllm::{export, render};

use crate::support::{fixture, read};

fn files_in(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for item in walk(dir) {
        let rel = item
            .strip_prefix(dir)
            .expect("under")
            .to_string_lossy()
            .into_owned();
        if rel.ends_with(".json") {
            out.push((rel, std::fs::read(&item).expect("read")));
        }
    }
    out.sort();
    out
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for item in std::fs::read_dir(dir).expect("dir") {
        let path = item.expect("item").path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[test]
fn shipped_vllm_and_sglang_configs_import_and_export_byte_identical() {
    for (format, dir, ns) in [
        (Format::Vllm, "real/vllm", "vllm/fused_moe"),
        (Format::Sglang, "real/sglang", "sglang/fused_moe"),
    ] {
        let src = fixture(dir);
        let (data, summary) = read(format, &src).expect("imports");
        let sources = files_in(&src);
        assert_eq!(
            summary.files,
            sources.len(),
            "{dir}: the README is passed by"
        );
        let out = tempfile::tempdir().expect("tmp");
        let written = export(&data, ns, out.path()).expect("exports");
        assert_eq!(
            (written.files, written.verbatim),
            (sources.len(), sources.len())
        );
        assert_eq!(files_in(out.path()), sources, "{dir}: byte for byte");
        // Again into the same directory: the same bytes are there, nothing is written.
        let again = export(&data, ns, out.path()).expect("exports again");
        assert_eq!(again.unchanged, sources.len());
    }
}

#[test]
fn a_config_file_maps_to_keys_scope_and_a_chosen_winner_per_batch_size() {
    let (data, summary) = read(Format::Vllm, &fixture("hand/vllm")).expect("imports");
    assert_eq!(
        (summary.files, summary.entries),
        (1, 3),
        "two batch sizes and the file"
    );
    assert!(
        summary.notes[0].contains("triton_version"),
        "{:?}",
        summary.notes
    );
    let scope = Scope::new(Fields::from([(
        "device_name".to_owned(),
        Value::from("NVIDIA_H100_80GB_HBM3"),
    )]));
    let key = |m: i64| {
        Key::new(Fields::from([
            ("E".to_owned(), Value::Int(8)),
            ("N".to_owned(), Value::Int(14336)),
            ("dtype".to_owned(), Value::from("fp8_w8a8")),
            (
                "block_shape".to_owned(),
                Value::List(vec![Value::Int(128), Value::Int(128)]),
            ),
            ("M".to_owned(), Value::Int(m)),
        ]))
    };
    let one = data
        .get(&scope, "vllm/fused_moe", &key(1).fingerprint())
        .expect("M=1");
    let best = one.best().expect("a winner");
    assert_eq!(best.outcome, Outcome::Chosen("vllm config".into()));
    assert_eq!(best.id.algorithm, "@config");
    assert_eq!(best.id.params.get("num_stages"), Some(&Value::Int(3)));
    assert!(best.stats().is_none(), "no figures are made up");
    // A float field keeps the config whole as JSON text.
    let big = data
        .get(&scope, "vllm/fused_moe", &key(64).fingerprint())
        .expect("M=64");
    let Some(Value::Str(json)) = big.best().expect("winner").id.params.get("json") else {
        panic!("kept as JSON text");
    };
    assert!(json.contains("\"waves_per_eu\":0.5"), "{json}");
}

#[test]
fn a_measured_winner_changes_only_its_config_and_keeps_the_source_layout() {
    let src = fixture("hand/vllm");
    let (mut data, _) = read(Format::Vllm, &src).expect("imports");
    let (scope, entry) = data
        .entries()
        .find(|(_, ns, e)| {
            *ns == "vllm/fused_moe" && e.key().fields().get("M") == Some(&Value::Int(1))
        })
        .map(|(s, _, e)| (s.clone(), e.clone()))
        .expect("M=1");
    let mut params = entry.best().expect("winner").id.params.clone();
    params.insert("num_warps", Value::Int(8));
    let stats = Stats {
        median_ns: 1000.0,
        min_ns: 990.0,
        spread_ns: 1.0,
        samples: 9,
    };
    let measured = Entry::new(
        entry.key().clone(),
        Fingerprint::default(),
        Origin::Measured("here".into()),
        entry.recorded_at() + 1,
        [Candidate::measured("@config", params, stats)],
    );
    data.insert(&scope, "vllm/fused_moe", measured);
    let (files, verbatim) = render(&data, "vllm/fused_moe").expect("renders");
    assert_eq!(verbatim, 0);
    let source = std::fs::read_to_string(walk(&src).remove(0)).expect("source");
    let expected = source.replacen("\"num_warps\": 4", "\"num_warps\": 8", 1);
    assert_eq!(
        files[0].1, expected,
        "only the measured config changed, in place"
    );
}

#[test]
fn keys_from_no_file_get_files_named_and_laid_out_as_vllm_writes_them() {
    let mut data = CacheData::new();
    let scope = Scope::new(Fields::from([(
        "device_name".to_owned(),
        Value::from("NVIDIA_H200"),
    )]));
    for m in [16, 1] {
        let key = Key::new(Fields::from([
            ("N".to_owned(), Value::Int(14336)),
            ("E".to_owned(), Value::Int(8)),
            ("M".to_owned(), Value::Int(m)),
        ]));
        let params = Fields::from([
            ("num_warps".to_owned(), Value::Int(4)),
            ("BLOCK_SIZE_M".to_owned(), Value::Int(m)),
        ]);
        let c = Candidate::chosen("@config", params, "test");
        data.insert(
            &scope,
            "vllm/fused_moe",
            Entry::new(
                key,
                Fingerprint::default(),
                Origin::Measured("t".into()),
                1,
                [c],
            ),
        );
    }
    let (files, _) = render(&data, "vllm/fused_moe").expect("renders");
    assert_eq!(files[0].0, "E=8,N=14336,device_name=NVIDIA_H200.json");
    assert_eq!(
        files[0].1,
        "{\n    \"1\": {\n        \"BLOCK_SIZE_M\": 1,\n        \"num_warps\": 4\n    },\n    \"16\": {\n        \"BLOCK_SIZE_M\": 16,\n        \"num_warps\": 4\n    }\n}\n"
    );
}

#[test]
fn a_damaged_file_is_refused_whole_with_its_name_and_line() {
    let good = std::fs::read_to_string(walk(&fixture("hand/vllm")).remove(0)).expect("good");
    for (bad, line, what) in [
        (
            good.replacen("\"num_warps\": 4,", "\"num_warps\": 4", 1),
            9,
            "expected ','",
        ),
        (
            good.replacen("\"num_stages\": 3\n", "\"num_stages\": [3]\n", 1),
            9,
            "num_stages",
        ),
        (
            good.replacen("\"64\"", "\"sixty-four\"", 1),
            11,
            "not a batch size",
        ),
        (
            good.replacen("\"1\": {", "\"1\": 7, \"x\": {", 1),
            3,
            "not an object",
        ),
    ] {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::copy(
            walk(&fixture("real/vllm"))
                .into_iter()
                .find(|p| p.extension().is_some_and(|e| e == "json"))
                .expect("one"),
            dir.path().join("E=1,N=1,device_name=A.json"),
        )
        .expect("copy");
        std::fs::write(dir.path().join("E=2,N=2,device_name=B.json"), &bad).expect("write");
        let err = read(Format::Vllm, dir.path()).expect_err("refused");
        let text = err.to_string();
        assert!(
            text.contains("E=2,N=2,device_name=B.json") && text.contains("nothing was imported"),
            "{text}"
        );
        assert_eq!(err.line, Some(line), "{text}");
        assert!(text.contains(what), "{text}");
    }
}

#[test]
fn special_files_and_foreign_names_are_never_read_and_kept_paths_never_escape() {
    let dir = tempfile::tempdir().expect("tmp");
    let fifo = dir.path().join("E=1,N=2,device_name=X.json");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    let err = read(Format::Vllm, dir.path()).expect_err("a FIFO is refused, not opened");
    assert!(err.to_string().contains("not a regular file"), "{err}");
    // A cache whose kept file name leaves the directory exports nothing.
    let mut data = CacheData::new();
    let key = Key::new(Fields::from([(
        "file".to_owned(),
        Value::from("../escape.json"),
    )]));
    let text = Fields::from([("text".to_owned(), Value::from("{}"))]);
    let c = Candidate::chosen("@source", text, "vllm config");
    data.insert(
        &Scope::default(),
        "vllm/fused_moe/files",
        Entry::new(
            key,
            Fingerprint::default(),
            Origin::Measured("t".into()),
            1,
            [c],
        ),
    );
    let out = tempfile::tempdir().expect("tmp");
    let err = export(&data, "vllm/fused_moe", &out.path().join("sub")).expect_err("refused");
    assert!(err.to_string().contains("not a relative path"), "{err}");
    assert!(!out.path().join("escape.json").exists());
    // A file of other contents in the way: refused, left alone, nothing else written.
    let (data, _) = read(Format::Vllm, &fixture("hand/vllm")).expect("imports");
    let (files, _) = render(&data, "vllm/fused_moe").expect("renders");
    std::fs::write(out.path().join(&files[0].0), "mine").expect("write");
    let err = export(&data, "vllm/fused_moe", out.path()).expect_err("refused");
    assert!(err.to_string().contains("exists and differs"), "{err}");
    assert_eq!(
        std::fs::read_to_string(out.path().join(&files[0].0)).expect("read"),
        "mine"
    );
}

fn chosen_entry(e: i64, m: i64, warps: i64) -> Entry {
    let key = Key::new(Fields::from([
        ("N".to_owned(), Value::Int(14336)),
        ("E".to_owned(), Value::Int(e)),
        ("M".to_owned(), Value::Int(m)),
    ]));
    let params = Fields::from([("num_warps".to_owned(), Value::Int(warps))]);
    Entry::new(
        key,
        Fingerprint::default(),
        Origin::Measured("t".into()),
        1,
        [Candidate::chosen("@config", params, "test")],
    )
}

fn device(name: &str, extra: Option<(&str, &str)>) -> Scope {
    let mut fields = Fields::from([("device_name".to_owned(), Value::from(name))]);
    if let Some((k, v)) = extra {
        fields.insert(k.to_owned(), Value::from(v));
    }
    Scope::new(fields)
}

/// Hardening IV, case 6: two scopes with one device name map to one file; the export wrote
/// one of them and then said "nothing was written". Now it refuses before writing anything.
#[test]
fn two_groups_for_one_file_are_refused_before_anything_is_written() {
    let mut data = CacheData::new();
    data.insert(
        &device("NVIDIA_H200", None),
        "vllm/fused_moe",
        chosen_entry(8, 1, 4),
    );
    data.insert(
        &device("NVIDIA_H200", Some(("driver", "560"))),
        "vllm/fused_moe",
        chosen_entry(8, 1, 8),
    );
    data.insert(
        &device("NVIDIA_A100", None),
        "vllm/fused_moe",
        chosen_entry(8, 1, 4),
    );
    let out = tempfile::tempdir().expect("tmp");
    let e = export(&data, "vllm/fused_moe", out.path()).expect_err("a collision");
    assert!(
        matches!(e, cache_import::vllm::ExportError::Collision { ref file } if file.contains("NVIDIA_H200")),
        "{e}"
    );
    assert!(e.to_string().contains("nothing was written"), "{e}");
    assert_eq!(
        std::fs::read_dir(out.path()).expect("dir").count(),
        0,
        "nothing was written"
    );
    // The same configs under both scopes are one file.
    let mut same = CacheData::new();
    same.insert(
        &device("NVIDIA_H200", None),
        "vllm/fused_moe",
        chosen_entry(8, 1, 4),
    );
    same.insert(
        &device("NVIDIA_H200", Some(("driver", "560"))),
        "vllm/fused_moe",
        chosen_entry(8, 1, 4),
    );
    let written = export(&same, "vllm/fused_moe", out.path()).expect("one file");
    assert_eq!(written.files, 1);
}

/// Hardening IV, case 7: a folder inside the export directory that is a symbolic link to
/// elsewhere took the export's files outside it. Now refused, nothing written anywhere.
#[test]
fn a_symbolic_link_inside_the_export_directory_is_not_followed() {
    let src = fixture("real/sglang");
    let (data, _) = read(Format::Sglang, &src).expect("imports");
    let (files, _) = render(&data, "sglang/fused_moe").expect("renders");
    let folder = files
        .iter()
        .find_map(|(rel, _)| rel.split_once('/').map(|(d, _)| d.to_owned()))
        .expect("the fixture has a version folder");
    let out = tempfile::tempdir().expect("tmp");
    let elsewhere = tempfile::tempdir().expect("tmp");
    std::os::unix::fs::symlink(elsewhere.path(), out.path().join(&folder)).expect("link");
    let e = export(&data, "sglang/fused_moe", out.path()).expect_err("refused");
    assert!(
        matches!(e, cache_import::vllm::ExportError::NotInside(_)),
        "{e}"
    );
    assert_eq!(
        std::fs::read_dir(elsewhere.path()).expect("dir").count(),
        0,
        "nothing outside the export directory"
    );
    assert_eq!(
        std::fs::read_dir(out.path()).expect("dir").count(),
        1,
        "only the link the user made"
    );
}
