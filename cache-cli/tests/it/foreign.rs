//! Files that are not tunecache's, at the paths tunecache uses (the cache's, its journal's):
//! every command leaves them byte for byte, under their own names, and says why it stops.

use crate::commands::{KEY, err, file, put, put_args};
use crate::tunecache;

/// Found by a hostile review: a user's file given as the cache (a typo in `--cache-file`) was
/// renamed to `.unusable-<ms>` by a write and replaced by a cache, and `gc --leftovers` then
/// removed it for good. A file without tunecache's marker is now left byte for byte, by every
/// command, each exiting 1 and naming it.
#[test]
fn a_file_that_is_not_a_cache_is_never_moved_or_changed() {
    let (dir, _) = file();
    let notes = dir.path().join("notes.txt");
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(60 * 86_400);
    std::fs::write(&notes, b"important\n").expect("notes");
    std::fs::File::options()
        .write(true)
        .open(&notes)
        .and_then(|f| f.set_modified(old))
        .expect("mtime");
    let lines = dir.path().join("in.jsonl");
    std::fs::write(
        &lines,
        r#"{"scope":{},"namespace":"mm","key":{"m":1},"candidates":[{"algo":"a","params":{},"status":"ok","median_ns":5.0}]}"#,
    )
    .expect("lines");
    let import = lines.display().to_string();
    for args in [
        put_args(KEY, "a", "1").to_vec(),
        vec!["import", import.as_str()],
        vec!["gc", "--leftovers", "0"],
        vec!["gc", "--dry-run"],
    ] {
        let o = tunecache(&notes, &args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", err(&o));
        assert!(
            err(&o).contains("notes.txt") && err(&o).contains("not a tunecache file"),
            "{args:?}: {}",
            err(&o)
        );
        assert_eq!(std::fs::read(&notes).expect("still there"), b"important\n");
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .expect("dir")
            .flatten()
            .map(|f| f.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("notes.txt"))
            .collect();
        assert!(
            names
                .iter()
                .all(|n| n == "notes.txt" || n == "notes.txt.lock"),
            "{args:?}: {names:?}"
        );
    }
}

/// Found by a second hostile review: a file at the journal's name (`<cache>.journal`) that is
/// not a journal was renamed to `.unusable-<ms>` by the next write, and `gc --leftovers 0`
/// then removed it. It is left alone as one at the cache's path is, also when the cache
/// file beside it is damaged and set aside.
#[test]
fn a_file_at_the_journals_name_that_is_not_a_journal_is_never_moved_or_changed() {
    let (dir, path) = file();
    put(&path, "tiled", "1200");
    let journal = dir.path().join("c.tcache.journal");
    let theirs = b"my notes\n";
    for damaged_cache in [false, true] {
        std::fs::write(&journal, theirs).expect("notes");
        if damaged_cache {
            std::fs::write(&path, b"\x96\xa9tunecache\x04TBL").expect("damaged cache");
        }
        // Beside a damaged cache, the put sets the cache aside and then stops at the journal.
        let commands = if damaged_cache {
            vec![put_args(KEY, "a", "1").to_vec()]
        } else {
            vec![
                put_args(KEY, "a", "1").to_vec(),
                vec!["gc", "--leftovers", "0"],
                vec!["gc", "--dry-run"],
            ]
        };
        for args in commands {
            let o = tunecache(&path, &args);
            assert_eq!(o.status.code(), Some(1), "{args:?}: {}", err(&o));
            assert!(
                err(&o).contains("c.tcache.journal") && err(&o).contains("not a tunecache journal"),
                "{args:?}: {}",
                err(&o)
            );
            assert_eq!(std::fs::read(&journal).expect("still there"), theirs);
            let moved: Vec<String> = std::fs::read_dir(dir.path())
                .expect("dir")
                .flatten()
                .map(|f| f.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("c.tcache.journal."))
                .collect();
            assert!(moved.is_empty(), "{args:?}: {moved:?}");
        }
    }
}

/// Found by the second hostile review: `get`, `show` and `explain` on a file they cannot read
/// (cut short, not a cache) answered only "no entry" (`explain`: "no tier has this key"), as
/// if the key had never been recorded. They now say what could not be read, first.
#[test]
fn a_lookup_in_a_file_it_cannot_read_says_so_before_it_misses() {
    let (dir, path) = file();
    put(&path, "tiled", "1200");
    let cut = dir.path().join("cut.tcache");
    let bytes = std::fs::read(&path).expect("cache");
    std::fs::write(&cut, &bytes[..bytes.len() - 1]).expect("cut");
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, b"my notes\n").expect("notes");
    let key = r#"{"m":128,"n":256,"k":64,"dtype":"float16"}"#;
    for file in [&cut, &notes] {
        for args in [
            vec!["get", "-n", "matmul", "-k", key],
            vec!["show", "-n", "matmul", "-k", key],
            vec!["explain", "-n", "matmul", "-k", key, "--scope", "{}"],
        ] {
            let o = tunecache(file, &args);
            let said = err(&o);
            let name = file.file_name().and_then(|n| n.to_str()).expect("name");
            assert!(
                said.contains(&format!("damaged: {}", file.display())) || said.contains(name),
                "{args:?} on {name}: {said}"
            );
            assert!(said.contains("damaged:"), "{args:?} on {name}: {said}");
        }
    }
    // A sound file says nothing of the kind.
    let o = tunecache(&path, &["get", "-n", "matmul", "-k", key]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(!err(&o).contains("damaged"), "{}", err(&o));
}

/// Found by the second hostile review: `migrate` on a path that is not a regular file (a
/// FIFO, a folder; `/dev/null`) made a lock file beside it (`/dev/null.lock`) before refusing.
#[test]
fn migrate_makes_no_lock_file_beside_what_is_not_a_file() {
    let dir = tempfile::tempdir().expect("dir");
    let fifo = dir.path().join("pipe.tcache");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    let folder = dir.path().join("folder.tcache");
    std::fs::create_dir(&folder).expect("folder");
    for path in [&fifo, &folder] {
        let o = tunecache(path, &["migrate"]);
        assert_ne!(o.status.code(), Some(0), "{}: {}", path.display(), err(&o));
        let lock = format!("{}.lock", path.display());
        assert!(!std::path::Path::new(&lock).exists(), "{lock}");
    }
}

/// A damaged entry is said once by `get` and `show` (the third review saw its line twice: the
/// file's entries were looked up twice).
#[test]
fn a_damaged_entry_is_said_once() {
    let (_dir, path) = file();
    for m in 1..4 {
        let key = format!(r#"{{"m":{m}}}"#);
        let o = tunecache(
            &path,
            &[
                "put",
                "-n",
                "mm",
                "-k",
                &key,
                "--algo",
                "a",
                "--median-ns",
                "5",
            ],
        );
        assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    }
    let o = tunecache(&path, &["gc"]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let mut bytes = std::fs::read(&path).expect("table");
    bytes[200] ^= 0x01; // the first entry's block, after the header
    std::fs::write(&path, &bytes).expect("damage");
    let damaged = (1..4).find(|m| {
        let key = format!(r#"{{"m":{m}}}"#);
        err(&tunecache(&path, &["get", "-n", "mm", "-k", &key])).contains("cannot be read")
    });
    let key = format!(r#"{{"m":{}}}"#, damaged.expect("one entry is damaged"));
    for command in ["get", "show"] {
        let o = tunecache(&path, &[command, "-n", "mm", "-k", &key]);
        assert_eq!(
            err(&o).matches("cannot be read").count(),
            1,
            "{command}: {}",
            err(&o)
        );
    }
}
