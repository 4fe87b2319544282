//! Small durable-file helpers: atomic replace, directory sync, bounded reads, file identity.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};

use cache_format::FormatError;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::StoreError;

mod atomic;
mod sweep;

pub use atomic::{AtomicFile, write_atomic};
pub use sweep::remove_abandoned_temporaries;
pub(crate) use sweep::{remove_stale_temporaries, temporary_of};

/// Identifies one version of a file: a replaced file (rename over it) gets a new inode, an
/// appended one a new length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileId {
    dev: u64,
    ino: u64,
    pub(crate) len: u64,
    mtime_ns: i128,
    /// The inode's change time: moves with every write as the modification time does, and,
    /// unlike it, cannot be set back (`touch -d` moves it forward).
    ctime_ns: i128,
}

impl FileId {
    pub(crate) fn of(meta: &fs::Metadata) -> Self {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            FileId {
                dev: meta.dev(),
                ino: meta.ino(),
                len: meta.len(),
                mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
                ctime_ns: i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
            }
        }
        #[cfg(not(unix))]
        {
            let mtime_ns = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_nanos() as i128)
                .unwrap_or(0);
            FileId {
                dev: 0,
                ino: 0,
                len: meta.len(),
                mtime_ns,
                ctime_ns: mtime_ns,
            }
        }
    }

    /// Whether both describe the same inode (content may have grown).
    pub(crate) fn same_file(&self, other: &FileId) -> bool {
        self.dev == other.dev && self.ino == other.ino && (self.dev, self.ino) != (0, 0)
    }
}

/// Metadata of `path`, or `None` if it does not exist.
pub(crate) fn stat(path: &Path) -> Result<Option<fs::Metadata>, StoreError> {
    match fs::metadata(path) {
        Ok(m) => Ok(Some(m)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StoreError::io("inspect", path, e)),
    }
}

/// Syncs a directory so a rename in it is durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    #[cfg(unix)]
    {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| StoreError::io("sync the directory", dir, e))
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

pub(super) static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A number no other call (in this process or another) is likely to give: a journal's nonce,
/// which tells it from the next journal a folder may create with the same inode number.
pub(crate) fn nonce() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut bytes = Vec::with_capacity(32);
    bytes.extend_from_slice(&nanos.to_le_bytes());
    bytes.extend_from_slice(&std::process::id().to_le_bytes());
    bytes.extend_from_slice(&TMP_COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    let digest = cache_format::Fingerprint::digest(b"tunecache/journal-nonce/1\0", &bytes);
    digest.low_u64() | 1
}

/// The prefix of every temporary file tunecache creates beside `target`: `.<name>.tmp.`, with
/// a long name shortened (as by [`aside`]) so that the prefix, a pid and a counter fit in a
/// file name.
pub(crate) fn tmp_prefix(target: &Path) -> String {
    // ".", ".tmp.", a pid and a counter of up to 20 digits each, and a dot: 47 bytes.
    let fitted = aside(target, &".".repeat(47));
    let name = fitted
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!(".{}.tmp.", name.trim_end_matches('.'))
}

/// The directory holding `path` (`.` for a bare file name).
pub(crate) fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    }
}

/// `path` with `suffix` appended to its file name.
/// The name of a copy or a file moved aside: `path` with `suffix` appended, shortened to fit
/// the 255 bytes a file name may have (the end of a long name gives way to a hash of the whole
/// name), so a cache with a long name can still be moved aside.
pub(crate) fn aside(path: &Path, suffix: &str) -> PathBuf {
    const NAME_MAX: usize = 255;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if name.len() + suffix.len() <= NAME_MAX {
        return with_suffix(path, suffix);
    }
    let hash = format!("~{:08x}", crc32fast::hash(name.as_bytes()));
    let mut keep = NAME_MAX.saturating_sub(suffix.len() + hash.len());
    while keep > 0 && !name.is_char_boundary(keep) {
        keep -= 1;
    }
    path.with_file_name(format!("{}{hash}{suffix}", &name[..keep]))
}

pub(crate) fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(suffix);
    path.with_file_name(name)
}

/// A file read whole, with its identity: `None` if it does not exist; its bytes, or
/// `TooLarge` if it is over the limit (then nothing is read).
pub(crate) type WholeFile = Option<(Result<Vec<u8>, FormatError>, FileId)>;

/// Reads a whole file of at most `limit` bytes, with its identity.
pub(crate) fn read_with_id(path: &Path, limit: u64) -> Result<WholeFile, StoreError> {
    Ok(read_keeping_file(path, limit)?.map(|(bytes, id, _)| (bytes, id)))
}

/// At most the first `len` bytes of the regular file at `path` (empty if it is gone).
pub(crate) fn read_prefix(path: &Path, len: usize) -> Result<Vec<u8>, StoreError> {
    use std::io::Read;
    let Some(file) = open_regular(path)? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(len);
    file.take(len as u64)
        .read_to_end(&mut out)
        .map_err(|e| StoreError::io("read", path, e))?;
    Ok(out)
}

/// The bytes of the regular file at `path` (an input: a migration file, a policy), refused
/// before anything is read when it is over `limit` bytes, and never read past it.
pub fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, StoreError> {
    match read_with_id(path, limit)? {
        None => Err(StoreError::io(
            "read",
            path,
            std::io::ErrorKind::NotFound.into(),
        )),
        Some((Ok(bytes), _)) => Ok(bytes),
        Some((Err(source), _)) => Err(StoreError::Format {
            path: path.to_owned(),
            source,
        }),
    }
}

/// [`read_with_id`], also returning the open file (to read parts of it again later).
#[allow(clippy::type_complexity)]
pub(crate) fn read_keeping_file(
    path: &Path,
    limit: u64,
) -> Result<Option<(Result<Vec<u8>, FormatError>, FileId, File)>, StoreError> {
    let Some(mut file) = open_regular(path)? else {
        return Ok(None);
    };
    let meta = file
        .metadata()
        .map_err(|e| StoreError::io("inspect", path, e))?;
    let id = FileId::of(&meta);
    if meta.len() > limit {
        return Ok(Some((
            Err(FormatError::TooLarge {
                what: "file",
                len: meta.len(),
                limit,
            }),
            id,
            file,
        )));
    }
    let mut buf = Vec::with_capacity(meta.len() as usize);
    (&mut file)
        .take(limit)
        .read_to_end(&mut buf)
        .map_err(|e| StoreError::io("read", path, e))?;
    Ok(Some((Ok(buf), id, file)))
}

/// Reads the first `head` bytes and the bytes from `from` to the end.
pub(crate) fn read_range(
    path: &Path,
    head: u64,
    from: u64,
    limit: u64,
) -> Result<(Vec<u8>, Vec<u8>), StoreError> {
    let mut file = open_regular(path)?
        .ok_or_else(|| StoreError::io("open", path, io::ErrorKind::NotFound.into()))?;
    let mut first = vec![0u8; head as usize];
    file.read_exact(&mut first)
        .map_err(|e| StoreError::io("read", path, e))?;
    file.seek(SeekFrom::Start(from))
        .map_err(|e| StoreError::io("read", path, e))?;
    let mut rest = Vec::new();
    file.take(limit)
        .read_to_end(&mut rest)
        .map_err(|e| StoreError::io("read", path, e))?;
    Ok((first, rest))
}

/// What a file type is, in words.
fn kind_of(t: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        "a folder"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// Fails with `NotAFile` if `path` exists (following symlinks) and is not a regular file.
/// A missing path is fine.
pub(crate) fn check_regular(path: &Path) -> Result<(), StoreError> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(m) => Err(StoreError::NotAFile {
            path: path.to_owned(),
            kind: kind_of(m.file_type()),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StoreError::io("inspect", path, e)),
    }
}

/// Opens a regular file for reading; `None` if it does not exist. Anything else (a FIFO, a
/// device) is `NotAFile` and is never read: it is checked before opening (opening a FIFO
/// blocks) and, against a swap in between, opened without blocking and checked again.
pub fn open_regular(path: &Path) -> Result<Option<File>, StoreError> {
    use std::os::unix::fs::OpenOptionsExt;
    check_regular(path)?;
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StoreError::io("open", path, e)),
    };
    let meta = file
        .metadata()
        .map_err(|e| StoreError::io("inspect", path, e))?;
    if !meta.is_file() {
        return Err(StoreError::NotAFile {
            path: path.to_owned(),
            kind: kind_of(meta.file_type()),
        });
    }
    if on_pseudo_filesystem(&file) {
        return Err(StoreError::NotAFile {
            path: path.to_owned(),
            kind: "a kernel pseudo-file (procfs, sysfs), whose size says nothing of its bytes",
        });
    }
    Ok(Some(file))
}

/// Whether `file` lies on a kernel pseudo-filesystem (procfs, sysfs and their kin): its files
/// claim size 0 and produce bytes as they are read, so no size check bounds them.
#[cfg(target_os = "linux")]
fn on_pseudo_filesystem(file: &File) -> bool {
    use std::os::fd::AsRawFd;
    // The magic numbers of <linux/magic.h>.
    const PSEUDO: [u64; 11] = [
        0x9fa0,      // proc
        0x6265_6572, // sysfs
        0x6462_6720, // debugfs
        0x7472_6163, // tracefs
        0x0027_e0eb, // cgroup
        0x6367_7270, // cgroup2
        0x7363_6673, // securityfs
        0x6265_6570, // configfs
        0xcafe_4a11, // bpf
        0x6165_676c, // pstore
        0xde5e_81e4, // efivarfs
    ];
    // SAFETY: `statfs` is plain data, zeroed is a valid value, and `fstatfs` fills it from a
    // descriptor that `file` keeps open for the duration of the call.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut fs) } != 0 {
        return false;
    }
    // `f_type` is signed on some targets: its low 32 bits are the magic.
    #[allow(clippy::unnecessary_cast)]
    let magic = (fs.f_type as u64) & 0xffff_ffff;
    PSEUDO.contains(&magic)
}

/// Elsewhere no pseudo-filesystem is known to claim size 0 for its files.
#[cfg(not(target_os = "linux"))]
fn on_pseudo_filesystem(_: &File) -> bool {
    false
}

/// `path` with symbolic links in its last component followed (a chain of at most 40), to the
/// target the link names, which need not exist yet. Anything that is not a link is returned
/// as it is.
pub(crate) fn resolve_link(path: &Path) -> PathBuf {
    let mut current = path.to_owned();
    for _ in 0..40 {
        let is_link = std::fs::symlink_metadata(&current).is_ok_and(|m| m.file_type().is_symlink());
        if !is_link {
            return current;
        }
        let Ok(target) = std::fs::read_link(&current) else {
            return current;
        };
        current = if target.is_absolute() {
            target
        } else {
            parent_dir(&current).join(target)
        };
    }
    current
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileTypeExt;

    #[test]
    fn an_atomic_write_leaves_nothing_behind_and_never_replaces_a_fifo() {
        let dir = tempfile::tempdir().expect("dir");
        let target = dir.path().join("out.bin");
        write_atomic(&target, b"one").expect("written");
        write_atomic(&target, b"two").expect("replaced");
        assert_eq!(fs::read(&target).expect("read"), b"two");
        let abandoned = AtomicFile::create(&target, false).expect("started");
        drop(abandoned);
        let names: Vec<_> = fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["out.bin"], "no temporary left");
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(matches!(
            write_atomic(&fifo, b"x"),
            Err(StoreError::NotAFile { .. })
        ));
        assert!(
            fs::symlink_metadata(&fifo)
                .expect("still there")
                .file_type()
                .is_fifo()
        );
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_procfs_or_sysfs_file_is_never_read() {
        // Size 0, and bytes without end for some: the size bound cannot hold them.
        for path in [
            "/proc/self/status",
            "/proc/self/maps",
            "/sys/kernel/mm/transparent_hugepage/enabled",
        ] {
            let path = Path::new(path);
            if !path.exists() {
                assert!(
                    !path.starts_with("/proc"),
                    "{path:?}: procfs is always there"
                );
                continue;
            }
            match open_regular(path) {
                Err(StoreError::NotAFile { kind, .. }) => {
                    assert!(kind.contains("procfs"), "{kind}")
                }
                other => panic!("{path:?} must not be read: {other:?}"),
            }
        }
    }

    #[test]
    fn names_set_aside_fit_in_255_bytes_and_stay_distinct() {
        let short = Path::new("/c/cache.tcache");
        assert_eq!(
            aside(short, ".bak.1"),
            PathBuf::from("/c/cache.tcache.bak.1")
        );
        let long_a = PathBuf::from(format!("/c/{}a.tcache", "é".repeat(120)));
        let long_b = PathBuf::from(format!("/c/{}b.tcache", "é".repeat(120)));
        let (a, b) = (
            aside(&long_a, ".unusable-1795352693050"),
            aside(&long_b, ".unusable-1795352693050"),
        );
        for p in [&a, &b] {
            let name = p.file_name().expect("name").to_string_lossy().into_owned();
            assert!(name.len() <= 255, "{} bytes", name.len());
            assert!(name.ends_with(".unusable-1795352693050"));
        }
        assert_ne!(a, b, "two long names keep distinct copies");
    }
}
