//! Tests that need something a machine may lack decide at run time, and say so: on a
//! developer's machine they skip with a loud line on stderr; in CI (`CI=true`), where the
//! project's `.ci/run` installs everything, a missing part is a failure, not a skip.

/// Whether this is a CI run (`CI` is `true` or `1`).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Called when `what` is missing: panics in CI, otherwise prints why the test is skipped and,
/// when `TUNECACHE_SKIP_LOG` names a file (`cargo xtask test` sets it), appends a line there,
/// so the run can fail on a skip the test harness would otherwise hide. The caller returns
/// right after.
pub fn missing(what: &str, why: &str) {
    assert!(
        !in_ci(),
        "{what} is required in CI ({why}); cargo xtask test installs it"
    );
    eprintln!("SKIPPED (not in CI): {what} is not available here: {why}");
    if let Some(log) = std::env::var_os("TUNECACHE_SKIP_LOG") {
        use std::io::Write;
        let line = format!("{what}: {why}\n");
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        assert!(
            written.is_ok(),
            "cannot record the skip of {what} in {}: {written:?}",
            std::path::Path::new(&log).display()
        );
    }
}
