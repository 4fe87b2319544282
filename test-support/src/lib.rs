//! Test helpers shared by every tunecache crate's tests (a dev-dependency only, never
//! published; `cargo xtask layering` fails if a crate depends on it normally).
//!
//! - [`child`]: the test binary re-executed as a child process in a named role, killed when
//!   its guard drops, speaking a line protocol on stdout;
//! - [`cli`]: runs the `tunecache` binary with a clean environment;
//! - [`craft`]: hostile tables written by hand from FORMAT.md (a DAG, a node naming itself);
//! - [`skip`]: the rule for tests that need something the machine may lack (a GPU library,
//!   Python): skip loudly on a developer's machine, fail in CI;
//! - [`env`](mod@env): an environment with no `TUNECACHE_*` variable, for every process a test starts;
//! - [`fake_http`]: a hostile HTTP server (endless listings, names a URL rewrites, silence);
//! - [`redis_server`]: a real `redis-server` on a free loopback port, stopped by pid;
//! - [`browser`]: Debian's `chromium`, headless, for the DOM, a screenshot and the console
//!   of a page a person looks at;
//! - [`hold_lock`], [`temp_dir`], [`wait_until`].

use std::fs::{File, OpenOptions};
use std::path::Path;
use std::time::{Duration, Instant};

pub mod browser;
pub mod child;
pub mod cli;
pub mod craft;
pub mod env;
pub mod example;
pub mod fake_http;
pub mod redis_server;
pub mod s3_server;
pub mod skip;

/// A temporary directory whose name says it belongs to a tunecache test.
pub fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("tunecache-test-")
        .tempdir()
        .expect("temp dir")
}

/// Polls `cond` until it holds or `timeout` passes; returns its last value.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// Holds an exclusive `flock` on `path` (as a cache's saver or a tuner's claim does) until the
/// returned file is dropped: for tests that make a lock busy.
pub fn hold_lock(path: &Path) -> File {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .expect("open the lock file");
    file.lock().expect("take the lock");
    file
}
