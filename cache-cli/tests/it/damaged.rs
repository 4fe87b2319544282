//! Whole-cache walks over a damaged table (issue 49, case 1 and 5): every command that walks a
//! cache (export, list, merge, bundle create, diff, verify) goes on past a damaged node to
//! every entry it can reach, says once per damaged block what was lost, and exits non-zero
//! where it promises a complete result (merge and bundle create write nothing unless asked
//! with --allow-damaged). A table whose nodes name one child many times is walked once per
//! node.

use std::path::Path;

use cache_core::TableWriter;
use cache_core::cache_format::table::{TKey, Table};
use cache_core::cache_format::{Limits, Scope};
use test_support::cli::{stderr, stdout};

use crate::diff::{Cands, entry};
use crate::large::table_of;
use crate::tunecache;

const WINS: Cands<'static> = &[("x", Some((100.0, 5.0))), ("y", Some((200.0, 5.0)))];
const ENTRIES: i64 = 8_532;

/// Flips a bit of the leaf that holds entry `id` (not the first of its leaf, so its key
/// appears once in the file: in that leaf).
fn damage_leaf_of(path: &Path, id: i64) {
    let key = TableWriter::key_of(&Scope::default(), "mm", &entry(id, 0, WINS));
    let mut bytes = std::fs::read(path).expect("read");
    let at = bytes
        .windows(48)
        .position(|w| w == key.0)
        .expect("the key is in its leaf");
    assert_eq!(
        bytes.windows(48).filter(|w| *w == key.0).count(),
        1,
        "a key inside a leaf"
    );
    bytes[at + 7] ^= 0x04;
    std::fs::write(path, bytes).expect("write");
}

/// The keys of the table at `path`, in order.
fn keys(path: &Path) -> Vec<TKey> {
    let t = Table::open(std::fs::read(path).expect("read"), &Limits::default()).expect("table");
    t.cursor(&TKey([0; 48]))
        .filter_map(Result::ok)
        .map(|k| k.0)
        .collect()
}

fn lines(text: &str) -> usize {
    text.lines().filter(|l| !l.trim().is_empty()).count()
}

#[test]
fn a_damaged_leaf_costs_its_entries_and_every_walk_says_so() {
    let dir = test_support::temp_dir();
    let path = dir.path().join("c.tcache");
    table_of(&path, ENTRIES);
    let before = keys(&path);
    assert_eq!(before.len() as i64, ENTRIES);
    // An entry in the middle of the table, not the first of its leaf.
    let id = (0..ENTRIES)
        .find(|id| {
            let k = TableWriter::key_of(&Scope::default(), "mm", &entry(*id, 0, WINS));
            let i = before.iter().position(|x| *x == k).expect("present");
            i > before.len() / 2 && i % 64 > 5 && i % 64 < 60
        })
        .expect("an entry in the middle");
    damage_leaf_of(&path, id);
    let reachable = keys(&path).len();
    assert!(
        reachable < before.len() && reachable >= before.len() - 64,
        "a leaf: {reachable}"
    );

    // export: every reachable entry, one line per damaged block and per namespace, exit 3.
    let out = tunecache(&path, &["export"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert_eq!(
        lines(&stdout(&out)),
        reachable,
        "every entry after the damage too"
    );
    let err = stderr(&out);
    assert_eq!(err.matches("the tree node at offset").count(), 1, "{err}");
    assert!(
        err.contains(&format!(
            "{} of the {ENTRIES} entries of namespace \"mm\"",
            ENTRIES as usize - reachable
        )),
        "{err}"
    );
    let out = tunecache(&path, &["--json", "list"]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(lines(&stdout(&out)), reachable);

    // merge and bundle create: nothing written without --allow-damaged.
    let merged = dir.path().join("merged.tcache");
    let m = merged.to_str().expect("utf-8");
    let out = tunecache(&path, &["merge", "-o", m, path.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("the merge was not written"),
        "{}",
        stderr(&out)
    );
    assert!(!merged.exists());
    let out = tunecache(
        &path,
        &[
            "merge",
            "--allow-damaged",
            "-o",
            m,
            path.to_str().expect("utf-8"),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(keys(&merged).len(), reachable);
    let bundle = dir.path().join("b.tcb");
    let b = bundle.to_str().expect("utf-8");
    let out = tunecache(&path, &["bundle", "create", "-o", b]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(!bundle.exists());
    let out = tunecache(&path, &["bundle", "create", "--allow-damaged", "-o", b]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = tunecache(&path, &["--json", "bundle", "verify", b]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "what was read, whole: {}",
        stdout(&out)
    );
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(report["manifest"]["entries"], reachable, "{report}");

    // diff of the damaged cache against its merge: incomplete, so exit 3.
    let out = tunecache(&path, &["diff", path.to_str().expect("utf-8"), m]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    // verify names the block.
    let out = tunecache(&path, &["verify"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        stdout(&out).contains("the tree node at offset"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn a_damaged_root_is_said_and_the_journal_is_still_exported() {
    let dir = test_support::temp_dir();
    let path = dir.path().join("c.tcache");
    table_of(&path, ENTRIES);
    let mut bytes = std::fs::read(&path).expect("read");
    let t = Table::open(bytes.clone(), &Limits::default()).expect("table");
    let root = t.commit().root.expect("a root");
    bytes[root.offset as usize + 100] ^= 0x01;
    std::fs::write(&path, bytes).expect("write");
    let out = tunecache(&path, &["export"]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(lines(&stdout(&out)), 0);
    let err = stderr(&out);
    assert!(err.contains("the root node at offset"), "{err}");
    assert!(
        err.contains(&format!("{ENTRIES} of the {ENTRIES} entries")),
        "{err}"
    );
}

#[test]
fn a_table_whose_nodes_name_one_child_many_times_is_walked_in_moments() {
    let dir = test_support::temp_dir();
    let path = dir.path().join("c.tcache");
    table_of(&path, 300);
    let table = std::fs::read(&path).expect("read");
    let dag = test_support::craft::dag(table.clone(), 8);
    assert!(dag.len() - table.len() < 70_000, "eight nodes more");
    std::fs::write(&path, dag).expect("write");
    let started = std::time::Instant::now();
    let bundle = dir.path().join("b.tcb");
    let b = bundle.to_str().expect("utf-8");
    for args in [
        &["verify"][..],
        &["export"],
        &["list"],
        &["bundle", "create", "-o", b],
    ] {
        let out = tunecache(&path, args);
        assert_ne!(out.status.code(), Some(0), "{args:?} {}", stderr(&out));
    }
    // A naive walk visits 128^8 leaves; this one each node once (generous for a debug build).
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
}

/// A directory whose namespace counts are 2^64 - 1 (`data/dir-count-huge.tcache`: the format
/// vector `probes.tcache` with its directory's two counts set so, block and commit checksummed
/// again; found by a hostile review): a count is taken as stored, so the commands that add
/// counts up (stats, report, export) must not overflow. Each ends normally; verify says what
/// is wrong.
#[test]
fn directory_counts_as_large_as_they_come_overflow_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("c.tcache");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/data/dir-count-huge.tcache"),
        &file,
    )
    .expect("copy");
    let html = dir.path().join("r.html");
    let out = dir.path().join("e.jsonl");
    for args in [
        vec!["stats"],
        vec!["--json", "stats"],
        vec!["report", "-o", html.to_str().expect("utf-8")],
        vec!["export", "-o", out.to_str().expect("utf-8")],
        vec!["list"],
    ] {
        let o = tunecache(&file, &args);
        assert!(!stderr(&o).contains("panicked"), "{args:?}: {}", stderr(&o));
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
    }
    let stats: serde_json::Value =
        serde_json::from_str(&stdout(&tunecache(&file, &["--json", "stats"]))).expect("JSON");
    assert_eq!(stats["entries"], u64::MAX, "the lie, shown as stored");
    let verify = tunecache(&file, &["verify"]);
    assert_eq!(verify.status.code(), Some(3), "{}", stdout(&verify));
}
