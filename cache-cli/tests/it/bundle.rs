//! `tunecache bundle`: create → import into an empty cache gives the same export, the same
//! inputs give the same bytes, damage is refused whole, older schemas are migrated and newer
//! ones left alone, and `inspect` says which scopes match.

use std::path::{Path, PathBuf};

use test_support::cli::{command, stderr, stdout};

use crate::diff::{Cands, entry, write};
use crate::{EXE, tunecache};

const X_WINS: Cands<'static> = &[("x", Some((100.0, 5.0))), ("y", Some((200.0, 5.0)))];

fn run(file: &Path, args: &[&str]) -> std::process::Output {
    tunecache(file, args)
}

fn p(path: &Path) -> &str {
    path.to_str().expect("utf-8")
}

fn golden(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../golden/warpconvnet-demo")
        .join(rel)
}

#[test]
fn a_bundle_round_trips_and_the_same_inputs_give_the_same_bytes() {
    let dir = tempfile::tempdir().expect("dir");
    let source = dir.path().join("source.tcache");
    write(&source, (1..=20).map(|id| entry(id, 0, X_WINS)).collect());
    let (b1, b2) = (dir.path().join("b1.tcb"), dir.path().join("b2.tcb"));
    for b in [&b1, &b2] {
        let o = run(&source, &["bundle", "create", "-o", p(b)]);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    assert_eq!(
        std::fs::read(&b1).expect("b1"),
        std::fs::read(&b2).expect("b2")
    );
    let dated = dir.path().join("dated.tcb");
    let o = command(
        EXE,
        &source,
        &["--json", "bundle", "create", "-o", p(&dated)],
    )
    .env("SOURCE_DATE_EPOCH", "1700000000")
    .output()
    .expect("run");
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(r["manifest"]["created"], 1_700_000_000, "{r:#}");
    assert_eq!(r["manifest"]["entries"], 20, "{r:#}");
    crate::progress::has_pace(&r, 20);

    let empty = dir.path().join("empty.tcache");
    let o = run(&empty, &["--json", "bundle", "import", p(&b1)]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(r["imported"]["added"], 20, "{r:#}");
    crate::progress::has_pace(&r, 20);
    assert_eq!(
        stdout(&run(&empty, &["export"])),
        stdout(&run(&source, &["export"])),
        "the export of the import equals the source's"
    );
    // Again: nothing new; fill adds nothing either.
    for policy in ["join", "fill"] {
        let o = run(
            &empty,
            &["--json", "bundle", "import", p(&b1), "--policy", policy],
        );
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
        assert_eq!(
            (
                r["imported"]["added"].as_u64(),
                r["imported"]["skipped"].as_u64()
            ),
            (Some(0), Some(20)),
            "{policy}: {r:#}"
        );
    }
    let o = run(&empty, &["--json", "bundle", "verify", p(&b1)]);
    assert_eq!(o.status.code(), Some(0));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    crate::progress::has_pace(&r, 20);
}

#[test]
fn damage_anywhere_fails_verify_and_import_leaves_the_cache_unchanged() {
    let dir = tempfile::tempdir().expect("dir");
    let source = dir.path().join("source.tcache");
    write(&source, (1..=5).map(|id| entry(id, 0, X_WINS)).collect());
    let good = dir.path().join("good.tcb");
    assert_eq!(
        run(&source, &["bundle", "create", "-o", p(&good)])
            .status
            .code(),
        Some(0)
    );
    let bytes = std::fs::read(&good).expect("bundle");
    let target = dir.path().join("target.tcache");
    write(&target, vec![entry(99, 0, X_WINS)]);
    let before = stdout(&run(&target, &["export"]));
    // Positions across the framing, the manifest and the snapshot (every bit of every byte
    // is covered by cache-format's unit test).
    for at in [
        0,
        3,
        12,
        bytes.len() / 3,
        bytes.len() / 2,
        bytes.len() - 8,
        bytes.len() - 1,
    ] {
        let bad = dir.path().join(format!("bad-{at}.tcb"));
        let mut damaged = bytes.clone();
        damaged[at] ^= 0x10;
        std::fs::write(&bad, &damaged).expect("write");
        let v = run(&target, &["bundle", "verify", p(&bad)]);
        assert_eq!(v.status.code(), Some(3), "byte {at}: {}", stdout(&v));
        let i = run(&target, &["bundle", "import", p(&bad)]);
        assert_eq!(i.status.code(), Some(1), "byte {at}: {}", stderr(&i));
        assert!(
            stderr(&i).contains("nothing was imported"),
            "{}",
            stderr(&i)
        );
    }
    assert_eq!(
        stdout(&run(&target, &["export"])),
        before,
        "the cache is unchanged"
    );
}

#[test]
fn an_older_bundle_is_migrated_and_a_newer_one_left_alone() {
    let dir = tempfile::tempdir().expect("dir");
    let v8 = dir.path().join("v8.tcache");
    std::fs::copy(golden("inputs/v8.tcache"), &v8).expect("copy");
    // A committed bundle (history, never regenerated), made from inputs/v8.tcache.
    let old = golden("bundles/v8.tcb");
    assert_eq!(
        run(&v8, &["bundle", "verify", p(&old)]).status.code(),
        Some(0)
    );
    let migrations = golden("migrations.json");
    let fresh = dir.path().join("fresh.tcache");
    let o = run(
        &fresh,
        &[
            "--json",
            "bundle",
            "import",
            p(&old),
            "--migrations",
            p(&migrations),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(r["imported"]["migrated_from"], 8, "{r:#}");
    let stats = run(&fresh, &["--json", "stats"]);
    let s: serde_json::Value = serde_json::from_slice(&stats.stdout).expect("JSON");
    assert_eq!(s["schema"], 9, "{s:#}");
    assert!(
        stdout(&run(&fresh, &["export"])).contains("mask_gemm"),
        "renamed by v8→v9"
    );

    // A schema-9 bundle into a schema-8 cache: left alone, with one warning, exit 0.
    let new = dir.path().join("v9.tcb");
    assert_eq!(
        run(&fresh, &["bundle", "create", "-o", p(&new)])
            .status
            .code(),
        Some(0)
    );
    let before = std::fs::read(&v8).expect("v8");
    let o = run(&v8, &["bundle", "import", p(&new)]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        stderr(&o).matches("newer than the cache's").count(),
        1,
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read(&v8).expect("v8"), before, "left alone");
}

#[test]
fn inspect_says_which_scopes_match_and_which_fields_differ() {
    let dir = tempfile::tempdir().expect("dir");
    let source = dir.path().join("source.tcache");
    write(&source, vec![entry(1, 0, X_WINS)]);
    let b = dir.path().join("b.tcb");
    assert_eq!(
        run(&source, &["bundle", "create", "-o", p(&b)])
            .status
            .code(),
        Some(0)
    );
    let o = run(
        &source,
        &["--json", "bundle", "inspect", p(&b), "--scope", "{}"],
    );
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(r["scopes"][0]["matches"], true, "{r:#}");
    let o = run(
        &source,
        &[
            "--json",
            "bundle",
            "inspect",
            p(&b),
            "--scope",
            r#"{"driver":"560"}"#,
        ],
    );
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(r["scopes"][0]["matches"], false, "{r:#}");
    assert_eq!(r["scopes"][0]["differing"][0][0], "driver", "{r:#}");
}

#[test]
fn a_bundle_is_never_written_over_a_fifo_and_leaves_no_temporary() {
    use std::os::unix::fs::FileTypeExt;
    let dir = tempfile::tempdir().expect("dir");
    let source = dir.path().join("source.tcache");
    write(&source, (1..=3).map(|id| entry(id, 0, X_WINS)).collect());
    let fifo = dir.path().join("out.tcb");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    let o = run(&source, &["bundle", "create", "-o", p(&fifo)]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("FIFO"), "{}", stderr(&o));
    let kind = std::fs::symlink_metadata(&fifo)
        .expect("still there")
        .file_type();
    assert!(kind.is_fifo(), "the FIFO was replaced");
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| !n.contains(".tmp")),
        "a temporary was left: {names:?}"
    );
}

#[test]
fn a_huge_file_that_starts_like_an_old_bundle_is_refused_by_its_size_unread() {
    // 3 GiB, sparse: the first bytes of a version 2 bundle, then nothing. Reading it whole
    // would take 3 GiB of memory before its size is refused.
    let dir = test_support::temp_dir();
    let huge = dir.path().join("huge.tcb");
    let mut head = vec![0x96, 0xa8];
    head.extend_from_slice(b"TCBUNDLE");
    head.push(2);
    std::fs::write(&huge, &head).expect("write");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&huge)
        .expect("open")
        .set_len(3 << 30)
        .expect("sparse");
    let cache = dir.path().join("c.tcache");
    let h = huge.to_str().expect("utf-8");
    for args in [
        &["bundle", "verify", h][..],
        &["bundle", "inspect", h],
        &["bundle", "import", h],
    ] {
        let (ok, kib) = crate::large::peak_kib(test_support::cli::command(EXE, &cache, args));
        assert!(!ok, "{args:?} refuses it");
        assert!(kib < 200 * 1024, "{args:?} read it: {kib} KiB at its peak");
    }
    let out = tunecache(&cache, &["bundle", "verify", h]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("over the limit"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // The system tier too.
    let mut get = test_support::cli::command(EXE, &cache, &["get", "-n", "mm", "-k", "{}"]);
    get.env("TUNECACHE_SYSTEM_PATH", &huge);
    let (_, kib) = crate::large::peak_kib(get);
    assert!(kib < 200 * 1024, "the system tier read it: {kib} KiB");
}

/// With `TUNECACHE_TRUST`, `bundle verify` (an inspecting command) judges by the policy as the
/// machine would take it but keeps nothing (a second review found it took the first policy it
/// saw for good); `bundle import` takes it.
#[test]
fn verify_keeps_no_trust_state_and_import_does() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("c.tcache");
    let key = dir.path().join("alice");
    let ok = |o: std::process::Output| {
        assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    };
    ok(run(&file, &["keys", "generate", "-o", p(&key)]));
    let policy = dir.path().join("trust.json");
    let public = key.with_extension("pub");
    ok(run(
        &file,
        &["keys", "policy", "--key", p(&public), "-o", p(&policy)],
    ));
    write(&file, vec![entry(1, 0, X_WINS)]);
    let bundle = dir.path().join("b.tcb");
    let secret = key.with_extension("key");
    ok(run(
        &file,
        &["bundle", "create", "-o", p(&bundle), "--sign", p(&secret)],
    ));
    let state = dir.path().join("generations").join("trust-state.json");
    let with_trust = |args: &[&str], target: &Path| {
        command(EXE, target, args)
            .env("TUNECACHE_TRUST", &policy)
            .output()
            .expect("run")
    };
    ok(with_trust(&["bundle", "verify", p(&bundle)], &file));
    assert!(!state.exists(), "verify kept a trust state");
    let target = dir.path().join("t.tcache");
    ok(with_trust(&["bundle", "import", p(&bundle)], &target));
    assert!(state.exists(), "import takes the policy");
}
