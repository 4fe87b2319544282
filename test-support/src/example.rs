//! Runs an example program of the crate under test, as the docs show it: the examples the
//! documentation quotes are run by tests, not only compiled.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// The example binary `name`, which `cargo test` builds beside the test binaries
/// (`target/<profile>/examples/<name>`).
pub fn path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // target/<profile>/deps/it-<hash> → target/<profile>/examples/<name>
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let path = profile.join("examples").join(name);
    assert!(
        path.is_file(),
        "{} is not built: run the whole `cargo test` (it builds the examples), or `cargo build \
         --examples` first",
        path.display()
    );
    path
}

/// Runs example `name` with `TMPDIR` set to `tmp` (the examples keep their caches under the
/// temporary folder) and a clean environment; panics, with its output, unless it succeeds.
pub fn run(name: &str, tmp: &std::path::Path) -> Output {
    let mut cmd = Command::new(path(name));
    crate::env::clean(&mut cmd);
    let out = cmd
        .env("TMPDIR", tmp)
        .stdin(Stdio::null())
        .output()
        .expect("run the example");
    assert!(
        out.status.success(),
        "example {name} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
