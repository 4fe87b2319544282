//! Child processes: the test binary re-executed to run one role (a writer, a tuner, a lock
//! holder), so concurrency and crash tests use real processes that can really be killed.
//!
//! The parent calls [`spawn`]; the child's test binary runs only the test named
//! `children::child_process_entry`, which calls [`role`] and dispatches on it. The child speaks
//! to the parent in lines starting with [`MARK`] on stdout (libtest's own output shares the
//! pipe).

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};

/// Marks the lines of the parent-child protocol.
pub const MARK: &str = "TC> ";

const ROLE: &str = "TUNECACHE_TEST_CHILD";
const PATH: &str = "TUNECACHE_TEST_PATH";
const ARGS: &str = "TUNECACHE_TEST_ARGS";

/// A child process that is killed when dropped, so a failing test never leaves one behind.
#[derive(Debug)]
pub struct ChildGuard(pub Child);

impl std::ops::Deref for ChildGuard {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for ChildGuard {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Starts this test binary as a child in `role`, on the cache file `path`, with `args` and
/// extra environment variables. Its environment has no `TUNECACHE_*` variable of the parent.
pub fn spawn(role: &str, path: &Path, args: &[&str], extra_env: &[(&str, &str)]) -> ChildGuard {
    let mut cmd = command(role, path, args, extra_env);
    ChildGuard(cmd.spawn().expect("spawn child process"))
}

/// The command [`spawn`] runs, for a caller that changes it first (e.g. runs it as another
/// user).
pub fn command(role: &str, path: &Path, args: &[&str], extra_env: &[(&str, &str)]) -> Command {
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = Command::new(exe);
    crate::env::clean(&mut cmd);
    cmd.args([
        "children::child_process_entry",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(ROLE, role)
    .env(PATH, path)
    .env(ARGS, args.join(" "))
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    cmd
}

/// In a child: its role, cache file and arguments; `None` in a normal test run.
pub fn role() -> Option<(String, PathBuf, Vec<String>)> {
    let role = std::env::var(ROLE).ok()?;
    let path = PathBuf::from(std::env::var_os(PATH).expect("children get a path"));
    let args = std::env::var(ARGS)
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    Some((role, path, args))
}

/// The protocol message in a line of child output, if it has one.
pub fn message(line: &str) -> Option<&str> {
    line.find(MARK).map(|at| &line[at + MARK.len()..])
}

/// Reads the child's protocol messages until it exits.
pub fn lines(child: &mut Child) -> Vec<String> {
    let out = child.stdout.take().expect("piped stdout");
    BufReader::new(out)
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| message(&l).map(str::to_owned))
        .collect()
}

/// Waits for the message `line`; returns the reader for what follows.
pub fn wait_for(child: &mut Child, line: &str) -> BufReader<ChildStdout> {
    let out = child.stdout.take().expect("piped stdout");
    let mut reader = BufReader::new(out);
    let mut buf = String::new();
    loop {
        buf.clear();
        let n = reader.read_line(&mut buf).expect("read child stdout");
        assert!(n > 0, "child exited before printing {line:?}");
        if message(buf.trim_end()) == Some(line) {
            return reader;
        }
    }
}

/// `key value` messages as a map (the last value of a key wins).
pub fn as_map(lines: &[String]) -> HashMap<String, String> {
    lines
        .iter()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}
