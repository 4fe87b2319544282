//! Reading a tool's files: only regular files (a FIFO, a device or a procfs file is refused,
//! never opened to block or read forever, through the core's one `open_regular`), bounded in
//! size, listed in a fixed order so that an import is the same on every run.

use std::io::Read;
use std::path::{Path, PathBuf};

use cache_core::file::open_regular;

use crate::ImportSourceError;

/// The largest source file read whole (a JSON document), in bytes.
pub const MAX_SOURCE_BYTES: u64 = 1 << 30;

/// The bytes of a regular file, with its modification time (Unix milliseconds).
pub(crate) fn read_text(path: &Path) -> Result<(String, u64), ImportSourceError> {
    let (file, mtime) = open(path)?;
    // A regular file's size is known before it is read: one past the bound is refused
    // without reading a byte (the bounded read below still holds if it grows meanwhile).
    let size = file.metadata().map_or(0, |m| m.len());
    if size > MAX_SOURCE_BYTES {
        return Err(ImportSourceError::whole(
            path,
            format!("is larger than {MAX_SOURCE_BYTES} bytes"),
        ));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    file.take(MAX_SOURCE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ImportSourceError::whole(path, format!("cannot be read: {e}")))?;
    if bytes.len() as u64 > MAX_SOURCE_BYTES {
        return Err(ImportSourceError::whole(
            path,
            format!("is larger than {MAX_SOURCE_BYTES} bytes"),
        ));
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        let line = 1 + e.as_bytes()[..e.utf8_error().valid_up_to()]
            .iter()
            .filter(|b| **b == b'\n')
            .count();
        ImportSourceError::at(path, line, "is not UTF-8 text")
    })?;
    Ok((text, mtime))
}

/// A regular file opened for reading, with its modification time (Unix milliseconds).
pub(crate) fn open(path: &Path) -> Result<(std::fs::File, u64), ImportSourceError> {
    let file = open_regular(path)
        .map_err(|e| ImportSourceError::whole(path, format!("cannot be read: {e}")))?
        .ok_or_else(|| ImportSourceError::whole(path, "does not exist"))?;
    let mtime = file
        .metadata()
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    Ok((
        file,
        known_time(mtime, cache_core::cache_format::now_millis()),
    ))
}

/// A modification time later than `now` (a wrong clock where the file was made) is unknown,
/// 0: clamping it to the present instead would give other entries at every import, so the
/// same files would not give the same entries.
fn known_time(mtime: u64, now: u64) -> u64 {
    if mtime > now { 0 } else { mtime }
}

/// The files under `root` (itself if it is a file) whose names `wanted` accepts, looking
/// `depth` levels of directories down, sorted by path. A directory with none is an error.
pub(crate) fn find(
    root: &Path,
    depth: usize,
    wanted: &dyn Fn(&str) -> bool,
    describe: &str,
) -> Result<Vec<PathBuf>, ImportSourceError> {
    let meta = std::fs::metadata(root)
        .map_err(|e| ImportSourceError::whole(root, format!("cannot be read: {e}")))?;
    if !meta.is_dir() {
        return Ok(vec![root.to_owned()]);
    }
    let mut found = Vec::new();
    walk(root, depth, wanted, &mut found)?;
    if found.is_empty() {
        return Err(ImportSourceError::whole(
            root,
            format!("holds no {describe}"),
        ));
    }
    found.sort();
    Ok(found)
}

fn walk(
    dir: &Path,
    depth: usize,
    wanted: &dyn Fn(&str) -> bool,
    found: &mut Vec<PathBuf>,
) -> Result<(), ImportSourceError> {
    let list = std::fs::read_dir(dir)
        .map_err(|e| ImportSourceError::whole(dir, format!("cannot be listed: {e}")))?;
    for item in list {
        let item =
            item.map_err(|e| ImportSourceError::whole(dir, format!("cannot be listed: {e}")))?;
        let path = item.path();
        let name = item.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        // A directory is walked only through real directories (no symlink loops).
        let is_dir = item.file_type().is_ok_and(|t| t.is_dir());
        if is_dir {
            if depth > 0 {
                walk(&path, depth - 1, wanted, found)?;
            }
        } else if wanted(name) {
            found.push(path);
        }
    }
    Ok(())
}

/// `path` relative to `root` with `/` separators (`path`'s name when `root` is the file).
pub(crate) fn relative(root: &Path, path: &Path) -> String {
    let rel = path
        .strip_prefix(root)
        .ok()
        .filter(|r| !r.as_os_str().is_empty());
    let rel = rel.unwrap_or_else(|| Path::new(path.file_name().unwrap_or_default()));
    rel.components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}
