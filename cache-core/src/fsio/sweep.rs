//! The temporaries a writer that died left beside its target: recognised by the exact names
//! [`AtomicFile`](super::AtomicFile) gives them, and removed only when no live writer can be
//! holding them.

use std::fs;
use std::path::Path;

use super::{parent_dir, tmp_prefix};

/// The file a temporary file of tunecache's was to replace, from the temporary's name
/// (`.<name>.tmp.<pid>.<counter>`, see [`tmp_prefix`](super::tmp_prefix)); `None` for any other name.
pub(crate) fn temporary_of(name: &str) -> Option<&str> {
    let rest = name.strip_prefix('.')?;
    let (target, tail) = rest.rsplit_once(".tmp.")?;
    let (pid, counter) = tail.split_once('.')?;
    // Exactly as written: decimal, no sign, no leading zero (`0123` is not a name we give).
    let digits = |s: &str| {
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'))
    };
    (digits(pid) && digits(counter) && !target.is_empty()).then_some(target)
}

/// Removes temporary files left beside `target` by writers that crashed: exactly the names
/// [`AtomicFile`](super::AtomicFile) gives them (`.<name>.tmp.<pid>.<counter>`), nothing that merely starts the
/// same way, and none that a live writer still holds (an [`AtomicFile`](super::AtomicFile) keeps a lock on its
/// temporary until it is put in place or dropped: a compaction writes its copy without the
/// cache lock, so holding that lock does not mean no temporary is being written). Call while
/// holding the cache lock.
pub(crate) fn remove_stale_temporaries(target: &Path) {
    sweep_temporaries(target, |path| just_made(path) || held_by_a_writer(path));
}

/// A writer creates its temporary, then locks it: for that instant a live temporary is
/// unlocked. Anything modified in the last minute (or in the future: a wrong clock) is spared,
/// whoever holds it; a leftover that young goes at a later sweep.
fn just_made(path: &Path) -> bool {
    const YOUNG: std::time::Duration = std::time::Duration::from_secs(60);
    fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .map_or(true, |at| {
            std::time::SystemTime::now()
                .duration_since(at)
                .map_or(true, |age| age < YOUNG)
        })
}

/// Removes the temporaries an [`AtomicFile`](super::AtomicFile) for `target` left beside it when its process
/// died before putting the file in place (a `kill -9` of `tunecache merge -o OUT`): only
/// regular files named as [`AtomicFile`](super::AtomicFile) names them, and only those whose lock this process
/// can take. A live writer holds its temporary's lock; where the file system has no locks,
/// nothing is removed (no cache lock guards an output of the caller's choosing).
pub fn remove_abandoned_temporaries(target: &Path) {
    sweep_temporaries(target, |path| {
        just_made(path) || !fs::File::open(path).is_ok_and(|f| f.try_lock().is_ok())
    });
}

fn sweep_temporaries(target: &Path, spare: impl Fn(&Path) -> bool) {
    let dir = parent_dir(target);
    let prefix = tmp_prefix(target);
    let fitted = &prefix[1..prefix.len() - ".tmp.".len()];
    if let Ok(entries) = fs::read_dir(&dir) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let ours = name.to_str().and_then(temporary_of) == Some(fitted);
            let file = entry.file_type().is_ok_and(|t| t.is_file());
            if ours && file && !spare(&entry.path()) {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
}

/// Whether a live writer holds the lock an [`AtomicFile`](super::AtomicFile) takes on its temporary.
fn held_by_a_writer(path: &Path) -> bool {
    let Ok(file) = fs::File::open(path) else {
        return false;
    };
    matches!(file.try_lock(), Err(fs::TryLockError::WouldBlock))
}

#[cfg(test)]
mod tests {
    use super::super::AtomicFile;
    use super::*;

    #[test]
    fn only_the_names_of_our_own_temporaries_are_recognised() {
        let target = Path::new("/c/ab/0123.art");
        let tmp = format!("{}{}.{}", tmp_prefix(target), 42, 7);
        assert_eq!(temporary_of(&tmp), Some("0123.art"));
        for other in [
            ".0123.art.tmp.x.7",
            ".0123.art.tmp.42",
            "0123.art.tmp.42.7",
            ".tmp.42.7",
            ".0123.art.tmp.42.7.bak",
            "notes.tmp.txt",
        ] {
            assert_eq!(temporary_of(other), None, "{other}");
        }
    }

    /// An output's leftovers (a killed `merge -o`) go when the next write of that output
    /// starts; one a live writer holds, and anything not named as ours, stay.
    #[test]
    fn an_outputs_abandoned_temporaries_go_and_a_live_one_stays() {
        let dir = tempfile::tempdir().expect("dir");
        let target = dir.path().join("m.tcache");
        let mut live = AtomicFile::create(&target, false).expect("started");
        live.write_all(b"in progress").expect("write");
        let killed = dir
            .path()
            .join(format!("{}{}.{}", tmp_prefix(&target), 999_999, 0));
        fs::write(&killed, b"half a merge").expect("write");
        fs::File::options()
            .write(true)
            .open(&killed)
            .and_then(|f| {
                f.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(120))
            })
            .expect("a leftover two minutes old");
        let other = dir.path().join(".m.tcache.tmp.notes");
        fs::write(&other, b"the user's").expect("write");
        remove_abandoned_temporaries(&target);
        assert!(!killed.exists(), "the killed run's temporary goes");
        assert!(other.exists(), "a look-alike name stays");
        live.commit().expect("the live writer finishes");
        assert_eq!(fs::read(&target).expect("read"), b"in progress");
    }

    /// A live writer's temporary is unlocked for an instant after it is created: a sweep in
    /// that instant must not take it (seen: two `export -o` of one output at once). A name
    /// with a leading zero is not one we give.
    #[test]
    fn a_young_temporary_and_a_look_alike_with_a_leading_zero_stay() {
        let dir = tempfile::tempdir().expect("dir");
        let target = dir.path().join("o.jsonl");
        let young = dir
            .path()
            .join(format!("{}{}.{}", tmp_prefix(&target), 999_997, 0));
        fs::write(&young, b"just created, not yet locked").expect("write");
        let zero = dir.path().join(".o.jsonl.tmp.0123.00");
        fs::write(&zero, b"the user's").expect("write");
        fs::File::options()
            .write(true)
            .open(&zero)
            .and_then(|f| {
                f.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(120))
            })
            .expect("old");
        remove_abandoned_temporaries(&target);
        remove_stale_temporaries(&target);
        assert!(young.exists(), "a temporary made this minute stays");
        assert!(zero.exists(), "a name we never give stays");
    }

    /// A temporary being written (a compaction's copy, made without the cache lock) is not
    /// a leftover: the sweep a locked writer makes leaves it; once dropped unfinished by a
    /// process that died, with no lock on it, it goes.
    #[test]
    fn the_sweep_of_leftover_temporaries_spares_one_being_written() {
        let dir = tempfile::tempdir().expect("dir");
        let target = dir.path().join("c.tcache");
        let mut live = AtomicFile::create(&target, false).expect("started");
        live.write_all(b"a copy in progress").expect("write");
        let crashed = dir
            .path()
            .join(format!("{}{}.{}", tmp_prefix(&target), 999_999, 0));
        fs::write(&crashed, b"half a snapshot").expect("write");
        fs::File::options()
            .write(true)
            .open(&crashed)
            .and_then(|f| {
                f.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(120))
            })
            .expect("a leftover two minutes old");
        remove_stale_temporaries(&target);
        assert!(!crashed.exists(), "a leftover of a dead writer goes");
        live.commit()
            .expect("the live writer's temporary was spared");
        assert_eq!(fs::read(&target).expect("read"), b"a copy in progress");
    }
}
