//! Large caches through the binary (issue 37): a fresh process opens a table in constant
//! memory, one damaged entry among 100,000 is one miss that `verify` names, and eight
//! processes at once answer from a 1,000,000-entry cache each within the memory a 1,000-entry
//! one costs (plus 16 MB).

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Stdio};

use cache_core::TableWriter;
use cache_core::cache_format::table::{TKey, Table};
use cache_core::cache_format::{Limits, Scope};
use cache_core::cache_migrate::Migrations;
use test_support::cli::{command, stdout};

use crate::diff::{Cands, entry};
use crate::{EXE, tunecache};

const WINS: Cands<'static> = &[("x", Some((100.0, 5.0))), ("y", Some((200.0, 5.0)))];

/// Writes a table of entries `0..n` (namespace `mm`, the default scope) in key order, holding
/// the keys, not the entries.
pub(crate) fn table_of(path: &Path, n: i64) {
    let scope = Scope::default();
    let mut keys: Vec<(TKey, i64)> = (0..n)
        .map(|id| (TableWriter::key_of(&scope, "mm", &entry(id, 0, WINS)), id))
        .collect();
    keys.sort_unstable();
    let registry = Migrations::new("difftest", 1);
    let mut w = TableWriter::create(path, &registry, &Limits::default()).expect("create");
    for (_, id) in keys {
        w.add(&scope, "mm", &entry(id, 0, WINS)).expect("add");
    }
    w.finish().expect("finish");
}

fn key_arg(id: i64) -> String {
    format!(r#"{{"id":{id}}}"#)
}

/// Runs `cmd` and returns whether it succeeded and its peak resident memory in KiB (`wait4`).
pub(crate) fn peak_kib(mut cmd: Command) -> (bool, i64) {
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run tunecache");
    wait_peak(child)
}

fn wait_peak(child: std::process::Child) -> (bool, i64) {
    let pid = libc::pid_t::try_from(child.id()).expect("pid");
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for the out-parameter.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is this test's own child, not waited for yet; both pointers are valid.
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(waited, pid, "wait4: {}", std::io::Error::last_os_error());
    std::mem::forget(child);
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    (ok, usage.ru_maxrss)
}

#[test]
fn a_damaged_entry_among_100k_is_one_miss_and_verify_names_it() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("c.tcache");
    table_of(&path, 100_000);
    // Flip a bit inside one entry's bytes, in place, as a failing disk would.
    let victim = entry(54_321, 0, WINS);
    let t = Table::open(std::fs::read(&path).expect("read"), &Limits::default()).expect("table");
    let at = t
        .locate(&TableWriter::key_of(&Scope::default(), "mm", &victim))
        .expect("reads")
        .expect("present");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .expect("open");
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, at.offset + 12).expect("read");
    file.write_all_at(&[byte[0] ^ 0x08], at.offset + 12)
        .expect("write");
    drop(file);
    let hex = victim.fingerprint().to_hex();
    // Its neighbours are served; it is not, with a message naming the file and the entry.
    for id in [0, 54_320, 54_322, 99_999] {
        let o = tunecache(&path, &["get", "-n", "mm", "-k", &key_arg(id)]);
        assert_eq!(o.status.code(), Some(0), "key {id}: {}", stdout(&o));
    }
    let o = tunecache(&path, &["get", "-n", "mm", "-k", &key_arg(54_321)]);
    assert_ne!(o.status.code(), Some(0), "{}", stdout(&o));
    let said = format!("{}{}", stdout(&o), String::from_utf8_lossy(&o.stderr));
    assert!(
        said.contains(&hex) && said.contains("cannot be read") && said.contains("c.tcache"),
        "{said}"
    );
    let v = tunecache(&path, &["verify"]);
    assert_eq!(v.status.code(), Some(3), "{}", stdout(&v));
    let report = stdout(&v);
    assert!(report.contains(&hex), "verify names the entry: {report}");
    assert_eq!(
        report.matches(&hex).count(),
        1,
        "one problem, said once: {report}"
    );
    // A walk leaves it out and says so: every other entry exported, the entry named, exit 3.
    let x = tunecache(&path, &["export"]);
    assert_eq!(x.status.code(), Some(3));
    assert_eq!(stdout(&x).lines().count(), 99_999);
    let err = String::from_utf8_lossy(&x.stderr);
    assert!(
        err.contains(&hex) && err.contains("1 of the 100000 entries"),
        "{err}"
    );
}

#[test]
fn eight_processes_answer_from_a_million_entries_in_the_memory_of_a_thousand() {
    let dir = tempfile::tempdir().expect("dir");
    let (small, large) = (
        dir.path().join("small.tcache"),
        dir.path().join("large.tcache"),
    );
    table_of(&small, 1_000);
    let started = std::time::Instant::now();
    table_of(&large, 1_000_000);
    eprintln!("1M entries written in {:?}", started.elapsed());
    let get = |file: &Path, id: i64| command(EXE, file, &["get", "-n", "mm", "-k", &key_arg(id)]);
    let (ok, baseline) = peak_kib(get(&small, 500));
    assert!(ok, "the 1k lookup");
    let children: Vec<_> = (0..8)
        .map(|i| {
            get(&large, 1 + i * 124_999)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("run tunecache")
        })
        .collect();
    for (i, child) in children.into_iter().enumerate() {
        let (ok, peak) = wait_peak(child);
        assert!(ok, "process {i} was served");
        assert!(
            peak <= baseline + 16 * 1024,
            "process {i} peaked at {peak} KiB, the 1k case at {baseline} KiB"
        );
    }
}
