//! Runs the `tunecache` binary of the crate under test, on one cache file, with a clean
//! environment.

use std::path::Path;
use std::process::{Command, Output, Stdio};

/// `tunecache --cache-file FILE ARGS...`, with no `TUNECACHE_*` variable and no stdin.
/// `exe` is the binary (`env!("CARGO_BIN_EXE_tunecache")` in cache-cli's tests).
pub fn run(exe: &str, file: &Path, args: &[&str]) -> Output {
    command(exe, file, args)
        .stdin(Stdio::null())
        .output()
        .expect("run tunecache")
}

/// The command [`run`] runs, to add stdin, environment or pipes.
pub fn command(exe: &str, file: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(exe);
    crate::env::clean(&mut cmd);
    cmd.arg("--cache-file").arg(file).args(args);
    cmd
}

/// Standard output as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Standard error as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
