//! `tunecache import --from FORMAT` and `export --to vllm`: every format imported twice changes
//! nothing, a damaged file changes nothing and is named with its line, shipped configs come
//! back byte for byte.

use std::path::{Path, PathBuf};

use crate::tunecache;

fn fixtures(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../cache-import/tests/fixtures")
        .join(rel)
}

fn ok(o: &std::process::Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

const SOURCES: [(&str, &str); 10] = [
    ("vllm", "real/vllm"),
    ("sglang", "real/sglang"),
    ("vllm", "hand/vllm"),
    ("triton", "real/triton"),
    ("tunableop", "hand/tunableop"),
    ("kernel-tuner", "real/kernel_tuner"),
    ("kernel-tuner", "hand/kernel_tuner"),
    ("xla", "real/xla"),
    ("xla", "hand/xla"),
    ("autoheuristic", "hand/autoheuristic"),
];

#[test]
fn importing_every_format_twice_changes_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("c.tcache");
    for (format, rel) in SOURCES {
        let src = fixtures(rel);
        ok(&tunecache(
            &file,
            &["import", "--from", format, src.to_str().expect("utf-8")],
        ));
    }
    let before = std::fs::read(&file).expect("file");
    let copy = dir.path().join("before.tcache");
    std::fs::write(&copy, &before).expect("copy");
    // The journal too: small imports into a larger file are appended there.
    let journal = dir.path().join("c.tcache.journal");
    if journal.exists() {
        std::fs::copy(&journal, dir.path().join("before.tcache.journal")).expect("copy");
    }
    for (format, rel) in SOURCES {
        let src = fixtures(rel);
        ok(&tunecache(
            &file,
            &["import", "--from", format, src.to_str().expect("utf-8")],
        ));
    }
    assert!(
        std::fs::read(&file).expect("file") == before,
        "the second import changed the file"
    );
    let (a, b) = (copy.to_str().expect("utf-8"), file.to_str().expect("utf-8"));
    let report: serde_json::Value =
        serde_json::from_str(&ok(&tunecache(&file, &["--json", "diff", a, b]))).expect("json");
    let counts = report["counts"].as_object().expect("counts");
    for (category, n) in counts {
        if category != "same" {
            assert_eq!(n, 0, "{category}: {report:#}");
        }
    }
    assert!(counts["same"].as_u64().expect("n") > 100, "{report:#}");
    let listed = ok(&tunecache(&file, &["list"]));
    for ns in [
        "vllm/fused_moe",
        "sglang/fused_moe",
        "triton/scale",
        "tunableop/GemmTunableOp_float_NT",
        "kernel_tuner/vector_add",
        "xla/results",
        "xla/dots",
    ] {
        assert!(listed.contains(ns), "{ns} in\n{listed}");
    }
    assert!(
        listed.contains("@config") && listed.contains("chosen"),
        "{listed}"
    );
}

#[test]
fn a_source_imported_again_writes_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("c.tcache");
    let journal = dir.path().join("c.tcache.journal");
    let files = || (std::fs::read(&file).ok(), std::fs::read(&journal).ok());
    let src = fixtures("real/vllm");
    ok(&tunecache(
        &file,
        &["import", "--from", "vllm", src.to_str().expect("utf-8")],
    ));
    let (src2, rel) = (fixtures("real/sglang"), "sglang");
    ok(&tunecache(
        &file,
        &["import", "--from", rel, src2.to_str().expect("utf-8")],
    ));
    let before = files();
    assert!(before.1.is_some(), "the second source went to the journal");
    for (format, src) in [("vllm", &src), ("sglang", &src2)] {
        ok(&tunecache(
            &file,
            &["import", "--from", format, src.to_str().expect("utf-8")],
        ));
        assert!(
            files() == before,
            "importing {format} again wrote to the cache"
        );
    }
}

#[test]
fn a_damaged_source_changes_nothing_and_is_named_with_its_line() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("c.tcache");
    ok(&tunecache(
        &file,
        &[
            "import",
            "--from",
            "tunableop",
            fixtures("hand/tunableop").to_str().expect("utf-8"),
        ],
    ));
    let before = std::fs::read(&file).expect("file");
    let src = dir.path().join("configs");
    std::fs::create_dir(&src).expect("dir");
    for item in std::fs::read_dir(fixtures("real/vllm")).expect("dir") {
        let path = item.expect("item").path();
        std::fs::copy(&path, src.join(path.file_name().expect("name"))).expect("copy");
    }
    let bad = src.join("E=8,N=14336,device_name=NVIDIA_H200.json");
    let text = std::fs::read_to_string(&bad).expect("read").replacen(
        "\"num_stages\": 3",
        "\"num_stages\": null",
        1,
    );
    std::fs::write(&bad, text).expect("write");
    let o = tunecache(
        &file,
        &["import", "--from", "vllm", src.to_str().expect("utf-8")],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("E=8,N=14336,device_name=NVIDIA_H200.json:")
            && err.contains("num_stages")
            && err.contains("nothing was imported"),
        "{err}"
    );
    assert!(
        std::fs::read(&file).expect("file") == before,
        "a refused import changed the cache"
    );
    // WarpConvNet's files go through its own migrations, in Python: said, nothing imported.
    let o = tunecache(
        &file,
        &[
            "import",
            "--from",
            "warpconvnet",
            src.to_str().expect("utf-8"),
        ],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("python -m tunecache.integrations.warpconvnet"),
        "{err}"
    );
    assert!(std::fs::read(&file).expect("file") == before);
}

#[test]
fn shipped_configs_export_byte_for_byte_and_never_over_other_files() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("c.tcache");
    let src = fixtures("real/vllm");
    ok(&tunecache(
        &file,
        &["import", "--from", "vllm", src.to_str().expect("utf-8")],
    ));
    let out = dir.path().join("out");
    let said = ok(&tunecache(
        &file,
        &["export", "--to", "vllm", "-o", out.to_str().expect("utf-8")],
    ));
    assert!(said.contains("6 byte for byte"), "{said}");
    for item in std::fs::read_dir(&src).expect("dir") {
        let path = item.expect("item").path();
        let name = path.file_name().expect("name");
        if path.extension().is_some_and(|e| e == "json") {
            assert!(
                std::fs::read(&path).expect("src") == std::fs::read(out.join(name)).expect("out"),
                "{name:?}"
            );
        } else {
            assert!(!out.join(name).exists(), "{name:?} is not a config");
        }
    }
    let victim = out.join("E=8,N=14336,device_name=NVIDIA_H200.json");
    std::fs::write(&victim, "{}\n").expect("write");
    let o = tunecache(
        &file,
        &["export", "--to", "vllm", "-o", out.to_str().expect("utf-8")],
    );
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("exists and differs")
    );
    assert_eq!(std::fs::read_to_string(&victim).expect("read"), "{}\n");
}

#[test]
fn explain_and_diff_say_what_a_shipped_winner_is() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("c.tcache");
    let src = fixtures("real/vllm");
    ok(&tunecache(
        &file,
        &["import", "--from", "vllm", src.to_str().expect("utf-8")],
    ));
    let key = r#"{"E":8,"N":14336,"M":64}"#;
    let scope = r#"{"device_name":"NVIDIA_H200"}"#;
    let args = [
        "--json",
        "explain",
        "-n",
        "vllm/fused_moe",
        "-k",
        key,
        "--scope",
        scope,
    ];
    let r: serde_json::Value = serde_json::from_str(&ok(&tunecache(&file, &args))).expect("json");
    let found = &r["found"][0];
    assert_eq!(found["used"], true, "{r:#}");
    assert!(
        found["reasons"][0]
            .as_str()
            .expect("reason")
            .contains("chosen by vllm config"),
        "{r:#}"
    );
    // Another release's file with another config for that batch size: a changed winner.
    let newer = dir.path().join("newer");
    std::fs::create_dir(&newer).expect("dir");
    let name = "E=8,N=14336,device_name=NVIDIA_H200.json";
    let text = std::fs::read_to_string(src.join(name)).expect("read");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("json");
    let warps = doc["64"]["num_warps"].as_i64().expect("num_warps");
    let mut doc = doc;
    doc["64"]["num_warps"] = serde_json::json!(warps * 2);
    std::fs::write(
        newer.join(name),
        serde_json::to_string_pretty(&doc).expect("text"),
    )
    .expect("write");
    let other = dir.path().join("other.tcache");
    ok(&tunecache(
        &other,
        &["import", "--from", "vllm", newer.to_str().expect("utf-8")],
    ));
    let (a, b) = (
        file.to_str().expect("utf-8"),
        other.to_str().expect("utf-8"),
    );
    let report: serde_json::Value =
        serde_json::from_str(&ok(&tunecache(&file, &["--json", "diff", a, b]))).expect("json");
    // The batch size's config, and the file's kept text.
    assert_eq!(report["counts"]["winner-changed"], 2, "{report:#}");
    let changed: Vec<String> = report["changes"]
        .as_array()
        .expect("changes")
        .iter()
        .filter(|c| c["category"] == "winner-changed")
        .map(ToString::to_string)
        .collect();
    assert!(
        changed.iter().any(|c| c.contains("vllm/fused_moe/files")),
        "{changed:?}"
    );
    assert!(
        changed.iter().any(|c| c.contains(r#"\"M\":64"#)),
        "{changed:?}"
    );
}

#[test]
fn a_fresh_machine_imports_into_a_folder_not_made_yet() {
    // The documented ways in for a new machine, with no ~/.cache/tunecache yet: JSON lines,
    // another tool's files, a bundle; each makes the folder as opening a cache does.
    let dir = tempfile::tempdir().expect("dir");
    let source = dir.path().join("source.tcache");
    ok(&tunecache(
        &source,
        &[
            "import",
            "--from",
            "vllm",
            fixtures("real/vllm").to_str().expect("utf-8"),
        ],
    ));
    let bundle = dir.path().join("b.tcb");
    ok(&tunecache(
        &source,
        &["bundle", "create", "-o", bundle.to_str().expect("utf-8")],
    ));
    let lines = ok(&tunecache(&source, &["export"]));
    let fresh = |name: &str| dir.path().join(name).join("not/made/yet/c.tcache");
    ok(&tunecache(
        &fresh("a"),
        &[
            "import",
            "--from",
            "vllm",
            fixtures("real/vllm").to_str().expect("utf-8"),
        ],
    ));
    ok(&tunecache(
        &fresh("b"),
        &["bundle", "import", bundle.to_str().expect("utf-8")],
    ));
    let mut cmd = test_support::cli::command(crate::EXE, &fresh("c"), &["import"]);
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run");
    use std::io::Write as _;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(lines.as_bytes())
        .expect("write");
    ok(&child.wait_with_output().expect("wait"));
    // The same through the default folder under a fresh HOME, without --cache-file.
    let home = dir.path().join("home");
    std::fs::create_dir(&home).expect("home");
    let mut cmd = std::process::Command::new(crate::EXE);
    test_support::env::clean(&mut cmd);
    let o = cmd
        .env("HOME", &home)
        .env_remove("XDG_CACHE_HOME")
        .args(["bundle", "import", bundle.to_str().expect("utf-8")])
        .output()
        .expect("run");
    ok(&o);
    for name in ["a", "b", "c"] {
        let exported = ok(&tunecache(&fresh(name), &["export"]));
        assert_eq!(exported.lines().count(), lines.lines().count(), "{name}");
    }
}
