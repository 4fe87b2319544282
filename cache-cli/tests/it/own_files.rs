//! What a command writes never destroys what it reads (issue 49, hostile review): `export -o`
//! and `bundle create -o` refuse the cache's own files by any name, as `merge` and `report`
//! do; a killed `merge -o` or `export -o` leaves no temporary that outlives the next run; and
//! a newest commit whose block is damaged is reported, never taken for an interrupted write,
//! and kept as a copy before a write cuts it off.

use std::path::Path;

use test_support::cli::stderr;

use crate::tunecache;

/// `n` JSON lines of namespace `mm`, keys 0..n, each with candidate `algo`.
fn lines(n: usize, algo: &str) -> String {
    (0..n)
        .map(|i| {
            format!(
                r#"{{"scope":{{}},"namespace":"mm","key":{{"i":{i}}},"recorded_at":1700000000000,"candidates":[{{"algo":"{algo}","median_ns":5,"measured_at":1700000000000}}]}}"#
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

fn import(file: &Path, text: &str) {
    let source = file.with_extension("jsonl");
    std::fs::write(&source, text).expect("lines");
    let out = tunecache(file, &["import", source.to_str().expect("utf-8")]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn export_and_bundle_create_refuse_the_caches_own_files_by_any_name() {
    let dir = test_support::temp_dir();
    let file = dir.path().join("c.tcache");
    import(&file, &lines(100, "a"));
    let out = tunecache(
        &file,
        &[
            "put",
            "-n",
            "mm",
            "-k",
            r#"{"z":1}"#,
            "--algo",
            "a",
            "--median-ns",
            "3",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let before = std::fs::read(&file).expect("read");
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&file, &link).expect("symlink");
    for output in [
        file.clone(),
        link,
        dir.path().join("c.tcache.journal"),
        dir.path().join("c.tcache.lock"),
    ] {
        let o = output.to_str().expect("utf-8");
        for args in [vec!["export", "-o", o], vec!["bundle", "create", "-o", o]] {
            let out = tunecache(&file, &args);
            assert_eq!(out.status.code(), Some(1), "{args:?}");
            assert!(
                stderr(&out).contains("the cache's own file"),
                "{}",
                stderr(&out)
            );
        }
    }
    assert_eq!(
        std::fs::read(&file).expect("read"),
        before,
        "the table is untouched"
    );
    let out = tunecache(&file, &["get", "-n", "mm", "-k", r#"{"z":1}"#]);
    assert!(
        out.status.success(),
        "the acknowledged put survives: {}",
        stderr(&out)
    );
}

#[test]
fn a_killed_runs_temporaries_go_with_the_next_run_and_look_alikes_stay() {
    let dir = test_support::temp_dir();
    let file = dir.path().join("c.tcache");
    import(&file, &lines(50, "a"));
    let out_dir = dir.path().join("out");
    std::fs::create_dir(&out_dir).expect("mkdir");
    // What `kill -9` of `merge -o m.tcache` and `export -o e.jsonl` leaves: their temporaries.
    let left = [
        out_dir.join(".m.tcache.tmp.999999.0"),
        out_dir.join(".e.jsonl.tmp.999998.3"),
    ];
    let mine = out_dir.join(".m.tcache.tmp.mine");
    for f in left.iter().chain([&mine]) {
        std::fs::write(f, b"half").expect("write");
        // A killed run's leftover, a while ago (one made this minute may be a live writer's).
        std::fs::File::options()
            .write(true)
            .open(f)
            .and_then(|f| {
                f.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(120))
            })
            .expect("old");
    }
    let merged = out_dir.join("m.tcache");
    let out = tunecache(
        &file,
        &[
            "merge",
            "-o",
            merged.to_str().expect("utf-8"),
            file.to_str().expect("utf-8"),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let exported = out_dir.join("e.jsonl");
    let out = tunecache(&file, &["export", "-o", exported.to_str().expect("utf-8")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(&exported)
            .expect("read")
            .lines()
            .count(),
        50
    );
    for f in &left {
        assert!(!f.exists(), "{} was left", f.display());
    }
    assert!(mine.exists(), "a name tunecache does not give stays");
}

/// The newest commit's block, damaged: the older commit is read, and that is damage
/// (exit 3), not an interrupted write; the next write keeps the file as it was first.
#[test]
fn a_damaged_newest_commit_block_is_damage_and_is_kept_before_a_write() {
    let dir = test_support::temp_dir();
    let file = dir.path().join("c.tcache");
    import(&file, &lines(3000, "a"));
    // Enough changed entries to be folded as a commit of their own.
    import(&file, &lines(1500, "b"));
    let out = tunecache(&file, &["verify"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        !dir.path().join("c.tcache.journal").exists(),
        "folded into commit 2"
    );
    // The commit block is the file's last bytes: flip one in the middle of them.
    let mut bytes = std::fs::read(&file).expect("read");
    let at = bytes.len() - 40;
    bytes[at] ^= 0x04;
    std::fs::write(&file, &bytes).expect("write");
    let out = tunecache(&file, &["verify"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(
        text.contains("commit 2 (slot B) does not read back"),
        "{text}"
    );
    assert!(!text.contains("interrupted"), "{text}");
    for args in [vec!["export"], vec!["list"]] {
        let out = tunecache(&file, &args);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {}", stderr(&out));
    }
    // A file cut short by one byte is the same damage.
    let cut = dir.path().join("cut.tcache");
    std::fs::write(&cut, &bytes[..bytes.len() - 1]).expect("write");
    assert_eq!(tunecache(&cut, &["verify"]).status.code(), Some(3));
    // A write keeps the file as it is before it cuts the damaged commit off.
    let source = dir.path().join("more.jsonl");
    std::fs::write(&source, lines(1500, "c")).expect("lines");
    let out = tunecache(&file, &["import", source.to_str().expect("utf-8")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("does not read back"),
        "{}",
        stderr(&out)
    );
    let kept: Vec<_> = std::fs::read_dir(dir.path())
        .expect("list")
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("c.tcache.damaged-")
        })
        .collect();
    assert_eq!(kept.len(), 1, "one copy");
    assert_eq!(
        std::fs::read(kept[0].path()).expect("read"),
        bytes,
        "byte for byte"
    );
}

/// The change list of the newest commit is a block like the others: damaged, `verify` says
/// so (it said "checksums verified" and exited 0).
#[test]
fn a_damaged_change_list_is_reported_by_verify() {
    let dir = test_support::temp_dir();
    let file = dir.path().join("c.tcache");
    import(&file, &lines(3000, "a"));
    import(&file, &lines(1500, "b"));
    let t = cache_core::cache_format::table::Table::open(
        std::fs::read(&file).expect("read"),
        &cache_core::cache_format::Limits::default(),
    )
    .expect("opens");
    assert_eq!(t.commit().seq, 2);
    let changes = t.commit().changes.expect("a change list");
    let mut bytes = std::fs::read(&file).expect("read");
    bytes[(changes.offset + u64::from(changes.len) / 2) as usize] ^= 0x04;
    std::fs::write(&file, &bytes).expect("write");
    let out = tunecache(&file, &["verify"]);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert_eq!(out.status.code(), Some(3), "{text}");
    assert!(text.contains("change list of commit 2"), "{text}");
}

/// A file already under the copy's name that is not the damaged file (a partial leftover,
/// someone's file) is left as it is, and the copy goes under another name: the damaged
/// commit is never cut off without a whole copy.
#[test]
fn a_file_under_the_copys_name_is_kept_and_the_copy_goes_elsewhere() {
    let dir = test_support::temp_dir();
    let file = dir.path().join("c.tcache");
    import(&file, &lines(3000, "a"));
    import(&file, &lines(1500, "b"));
    let mut bytes = std::fs::read(&file).expect("read");
    let at = bytes.len() - 40;
    bytes[at] ^= 0x04;
    // Find the copy's name from a first write on a scratch copy of the same damage.
    let scratch_dir = test_support::temp_dir();
    let scratch = scratch_dir.path().join("c.tcache");
    std::fs::write(&scratch, &bytes).expect("write");
    import(&scratch, &lines(1500, "c"));
    let name = std::fs::read_dir(scratch_dir.path())
        .expect("list")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("c.tcache.damaged-"))
        .expect("a copy");
    std::fs::write(&file, &bytes).expect("write");
    let squatter = dir.path().join(&name);
    std::fs::write(&squatter, &bytes[..1000]).expect("a partial leftover");
    import(&file, &lines(1500, "c"));
    assert_eq!(
        std::fs::read(&squatter).expect("read"),
        &bytes[..1000],
        "left as it was"
    );
    let other = dir.path().join(format!("{name}-1"));
    assert_eq!(
        std::fs::read(&other).expect("the copy"),
        bytes,
        "a whole copy elsewhere"
    );
}
