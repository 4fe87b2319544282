//! Writing an export's files under its directory: all of them or none (what this export
//! created is removed again if a write fails), never replacing a file with other bytes, and
//! never outside the directory (a folder on the way that is a symbolic link is refused).

use std::path::{Path, PathBuf};

use super::export::{ExportError, ExportSummary, render};
use cache_core::cache_format::CacheData;

/// Writes [`render`]'s files under `dir`: all of them, or none if one would replace a file
/// with other contents (checked before anything is written, and again as each is written: a
/// file that appears meanwhile is left alone).
pub fn export(data: &CacheData, namespace: &str, dir: &Path) -> Result<ExportSummary, ExportError> {
    let (files, verbatim) = render(data, namespace)?;
    let io = |path: &Path, e: &dyn std::fmt::Display| ExportError::Io {
        path: path.to_owned(),
        error: e.to_string(),
    };
    let mut unchanged = 0;
    let mut to_write = Vec::new();
    for (rel, text) in &files {
        let path = dir.join(rel);
        check_folders(dir, Path::new(rel))?;
        match std::fs::symlink_metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => to_write.push((path, text)),
            Err(e) => return Err(io(&path, &e)),
            Ok(meta) if !meta.is_file() => return Err(ExportError::Exists(path)),
            Ok(_) => {
                // Compared without reading more than the text's length and one byte: a huge
                // file there is not the same, whatever it holds.
                let mut there = Vec::with_capacity(text.len() + 1);
                std::io::Read::read_to_end(
                    &mut std::io::Read::take(
                        std::fs::File::open(&path).map_err(|e| io(&path, &e))?,
                        text.len() as u64 + 1,
                    ),
                    &mut there,
                )
                .map_err(|e| io(&path, &e))?;
                let same = there == text.as_bytes();
                if !same {
                    return Err(ExportError::Exists(path));
                }
                unchanged += 1;
            }
        }
    }
    // All or nothing: what this export made is removed again if a later write fails. The
    // export directory itself is the caller's to name (made if missing, with its parents).
    let mut made = Made::default();
    if !to_write.is_empty() && std::fs::symlink_metadata(dir).is_err() {
        std::fs::create_dir_all(dir).map_err(|e| io(dir, &e))?;
        made.folders.push(dir.to_owned());
    }
    for (path, text) in to_write {
        let written =
            make_folders(dir, &path, &mut made).and_then(|()| write_new(&path, text.as_bytes()));
        match written {
            Ok(()) => made.files.push(path),
            Err(e) => {
                made.undo();
                return Err(e);
            }
        }
    }
    Ok(ExportSummary {
        files: files.len(),
        verbatim,
        unchanged,
    })
}

/// What an export created, to remove if it cannot finish.
#[derive(Default)]
struct Made {
    files: Vec<PathBuf>,
    folders: Vec<PathBuf>,
}

impl Made {
    fn undo(self) {
        for f in self.files.iter().rev() {
            let _ = std::fs::remove_file(f);
        }
        // Innermost first; a folder something else was put into meanwhile stays.
        for d in self.folders.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Each folder between `dir` and the file `rel` that exists must be a real folder (not a
/// symbolic link, which would take the write outside `dir`).
fn check_folders(dir: &Path, rel: &Path) -> Result<(), ExportError> {
    let mut at = dir.to_owned();
    let parts: Vec<_> = rel.components().collect();
    for part in &parts[..parts.len().saturating_sub(1)] {
        at.push(part);
        match std::fs::symlink_metadata(&at) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(ExportError::NotInside(at)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => {
                return Err(ExportError::Io {
                    path: at,
                    error: e.to_string(),
                });
            }
        }
    }
    Ok(())
}

/// Creates the folders between `dir` and `path` one at a time, each checked to be a real
/// folder (a link that appeared since the check is refused), noting those it made.
fn make_folders(dir: &Path, path: &Path, made: &mut Made) -> Result<(), ExportError> {
    let rel = path.strip_prefix(dir).unwrap_or(path);
    let mut at = dir.to_owned();
    let parts: Vec<_> = rel.components().collect();
    for part in &parts[..parts.len().saturating_sub(1)] {
        at.push(part);
        match std::fs::create_dir(&at) {
            Ok(()) => made.folders.push(at.clone()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(ExportError::Io {
                    path: at,
                    error: e.to_string(),
                });
            }
        }
        if !std::fs::symlink_metadata(&at).is_ok_and(|m| m.is_dir()) {
            return Err(ExportError::NotInside(at));
        }
    }
    Ok(())
}

/// Writes a file that was not there when the export looked, through the core's create-new
/// writer (`AtomicFile::commit_new`: the bytes to a temporary beside it, synced, then linked
/// to the name): a file that appeared there meanwhile is left alone (`Exists`).
fn write_new(path: &Path, bytes: &[u8]) -> Result<(), ExportError> {
    let io = |e: cache_core::StoreError| match &e {
        cache_core::StoreError::Io { source, .. }
            if source.kind() == std::io::ErrorKind::AlreadyExists =>
        {
            ExportError::Exists(path.to_owned())
        }
        cache_core::StoreError::NotAFile { .. } => ExportError::Exists(path.to_owned()),
        _ => ExportError::Io {
            path: path.to_owned(),
            error: e.to_string(),
        },
    };
    let mut file = cache_core::file::AtomicFile::create(path, true).map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    file.commit_new().map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_file_never_replaces_one_that_appeared_and_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("tc-write-new-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("E=1,N=2,device_name=X.json");
        let _ = std::fs::remove_file(&path);
        write_new(&path, b"{}\n").expect("written");
        assert_eq!(std::fs::read(&path).expect("read"), b"{}\n");
        // Appeared between the export's look and its write: refused, left as it is.
        std::fs::write(&path, "theirs").expect("write");
        assert!(matches!(
            write_new(&path, b"ours"),
            Err(ExportError::Exists(_))
        ));
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "theirs");
        let left: Vec<_> = std::fs::read_dir(&dir)
            .expect("dir")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left.len(), 1, "no temporary left: {left:?}");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
