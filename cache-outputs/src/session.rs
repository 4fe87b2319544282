//! Session caches: a fresh directory under `<temp>/tunecache-sessions-<uid>/` (one root per
//! user, made private: `0700`, owned by the user, never a link), removed when its owner drops
//! it or the process exits normally; one left by a killed process is reaped the next time any
//! session cache opens. Only directories named as sessions are named (`<pid>-<hex>-<n>`) are
//! ever reaped: anything else under the root is left alone.
//!
//! The owner holds an exclusive `flock` on `<session>/owner.lock` for the session's life. The
//! kernel releases it when the process dies however it dies, so a reaper that can take the
//! lock knows the owner is gone (a recycled pid cannot fool it).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use cache_core::GlobalLock;
use std::time::{Duration, SystemTime};

const OWNER: &str = "owner.lock";

/// A directory without its owner's lock file younger than this is still being created.
const STARTING: Duration = Duration::from_secs(60);

/// This process's live sessions, with the pid that made each: a forked child inherits the
/// list, and must never remove its parent's directories (when it drops one or exits).
static LIVE: GlobalLock<Vec<(u32, PathBuf)>> = GlobalLock::new(Vec::new());
static COUNTER: AtomicU64 = AtomicU64::new(0);
/// Whether the exit handler is registered (a flag, not a `Once`: a fork while another thread
/// ran a `Once` would leave the child waiting on it for good).
static AT_EXIT: AtomicBool = AtomicBool::new(false);

/// The directory sessions are made in when none is given: one per user, so users of one
/// machine never share (or lock each other out of) a root.
pub fn default_root() -> PathBuf {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    std::env::temp_dir().join(format!("tunecache-sessions-{uid}"))
}

/// Makes `root` if it is missing (private to this user), and checks that it is a real folder
/// this user owns: a root planted by someone else, or a link, is refused.
fn private_root(root: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(root)
    {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = fs::symlink_metadata(root)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    if !meta.file_type().is_dir() || meta.uid() != uid {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a folder of this user (uid {uid}): sessions are not made there",
                root.display()
            ),
        ));
    }
    Ok(())
}

/// Whether `name` is a session directory's name (`<pid>-<nanos in hex>-<n>`).
fn is_session_name(name: &str) -> bool {
    let mut parts = name.split('-');
    let digits =
        |s: Option<&str>| s.is_some_and(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()));
    let hex = |s: Option<&str>| {
        s.is_some_and(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit()))
    };
    digits(parts.next()) && hex(parts.next()) && digits(parts.next()) && parts.next().is_none()
}

/// A live session directory; removed on drop.
#[derive(Debug)]
pub(crate) struct Session {
    dir: PathBuf,
    /// The process that made it: the only one that removes it.
    pid: u32,
    _owner: fs::File,
}

impl Session {
    /// Reaps the sessions of dead owners under `root`, then makes a new one.
    pub(crate) fn create(root: &Path) -> std::io::Result<Session> {
        private_root(root)?;
        reap(root);
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir = root.join(format!(
            "{}-{nanos:x}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir(&dir)?;
        let owner = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(dir.join(OWNER))
            .and_then(|f| f.try_lock().map(|()| f).map_err(std::io::Error::other));
        let owner = match owner {
            Ok(f) => f,
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        LIVE.lock().push((std::process::id(), dir.clone()));
        if !AT_EXIT.swap(true, Ordering::AcqRel) {
            // SAFETY: registering a function with no arguments that only touches our own
            // statics; atexit has no other preconditions.
            unsafe {
                libc::atexit(remove_live_sessions);
            }
        }
        Ok(Session {
            dir,
            pid: std::process::id(),
            _owner: owner,
        })
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // A forked child dropping its copy leaves the parent's directory alone.
        if self.pid == std::process::id() {
            let _ = fs::remove_dir_all(&self.dir);
        }
        LIVE.lock().retain(|(_, d)| d != &self.dir);
    }
}

extern "C" fn remove_live_sessions() {
    // At exit: never block on a held lock. Only this process's own sessions: a forked child
    // that exits leaves its parent's alone.
    let me = std::process::id();
    if let Some(live) = LIVE.try_lock() {
        for (_, dir) in live.iter().filter(|(pid, _)| *pid == me) {
            let _ = fs::remove_dir_all(dir);
        }
    }
}

/// Removes the session directories under `root` whose owner is gone; returns them.
pub fn reap(root: &Path) -> Vec<PathBuf> {
    let mut reaped = Vec::new();
    let Ok(entries) = fs::read_dir(root) else {
        return reaped;
    };
    for e in entries.flatten() {
        let ours = e.file_name().to_str().is_some_and(is_session_name);
        if !ours || !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let dir = e.path();
        match fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.join(OWNER))
        {
            Ok(f) => {
                if f.try_lock().is_ok() && fs::remove_dir_all(&dir).is_ok() {
                    reaped.push(dir);
                }
            }
            Err(_) => {
                let old = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| SystemTime::now().duration_since(t).ok())
                    .is_some_and(|age| age > STARTING);
                if old && fs::remove_dir_all(&dir).is_ok() {
                    reaped.push(dir);
                }
            }
        }
    }
    reaped
}
