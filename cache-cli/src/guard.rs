//! Where a command writes a file of its own (`-o`): never over a cache it reads (the cache's
//! file, its journal or its lock, under any name that leads there), and not among the
//! temporaries an earlier run of it left when it was killed.

use std::path::{Path, PathBuf};

use anyhow::bail;

/// `path` as the file system resolves it: symbolic links followed, `..` taken. A path that
/// does not exist yet resolves through its folder (its name as given).
fn resolved(path: &Path) -> PathBuf {
    if let Ok(p) = std::fs::canonicalize(path) {
        return p;
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    match (std::fs::canonicalize(parent), path.file_name()) {
        (Ok(folder), Some(name)) => folder.join(name),
        _ => path.to_owned(),
    }
}

/// Refuses `output` when it is the cache `cache` (its file, journal or lock file), whatever
/// the name it is given by: writing there would replace the results the command reads.
/// `what` says what the command writes ("the export").
pub(crate) fn refuse_cache_files(output: &Path, cache: &Path, what: &str) -> anyhow::Result<()> {
    let target = resolved(output);
    let cache = resolved(cache);
    let Some(name) = cache.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return Ok(());
    };
    let ours = [
        name.clone(),
        format!("{name}.journal"),
        format!("{name}.lock"),
    ];
    let named = target
        .file_name()
        .is_some_and(|n| ours.iter().any(|o| *o == n.to_string_lossy()));
    if target.parent() == cache.parent() && named {
        bail!(
            "{}: that is the cache's own file ({}); write {what} elsewhere",
            output.display(),
            cache.display()
        );
    }
    Ok(())
}

/// Before writing `output` whole: removes the temporaries a killed earlier write of it left
/// beside it (see [`cache_core::file::remove_abandoned_temporaries`]).
pub(crate) fn sweep(output: &Path) {
    cache_core::file::remove_abandoned_temporaries(output);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_journal_and_lock_are_refused_by_any_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = dir.path().join("c.tcache");
        std::fs::write(&cache, b"x").expect("write");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&cache, &link).expect("symlink");
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).expect("mkdir");
        for bad in [
            cache.clone(),
            link,
            dir.path().join("c.tcache.journal"),
            dir.path().join("c.tcache.lock"),
            sub.join("../c.tcache"),
        ] {
            assert!(
                refuse_cache_files(&bad, &cache, "the export").is_err(),
                "{}",
                bad.display()
            );
        }
        for fine in [dir.path().join("c.jsonl"), sub.join("c.tcache")] {
            refuse_cache_files(&fine, &cache, "the export").expect("another file");
        }
    }
}
