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
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

const OWNER: &str = "owner.lock";

/// A directory without its owner's lock file younger than this is still being created.
const STARTING: Duration = Duration::from_secs(60);

static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static COUNTER: AtomicU64 = AtomicU64::new(0);
static AT_EXIT: std::sync::Once = std::sync::Once::new();

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
        lock_live().push(dir.clone());
        AT_EXIT.call_once(|| {
            // SAFETY: registering a function with no arguments that only touches our own
            // statics; atexit has no other preconditions.
            unsafe {
                libc::atexit(remove_live_sessions);
            }
        });
        Ok(Session { dir, _owner: owner })
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
        lock_live().retain(|d| d != &self.dir);
    }
}

fn lock_live() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

extern "C" fn remove_live_sessions() {
    // At exit: never block on a poisoned or held lock.
    if let Ok(live) = LIVE.try_lock() {
        for dir in live.iter() {
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
