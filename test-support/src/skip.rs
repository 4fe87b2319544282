//! Tests that need something a machine may lack decide at run time, and say so: on a
//! developer's machine they skip with a loud line on stderr; in CI (`CI=true`), where the
//! project's `.ci/run` installs everything, a missing part is a failure, not a skip.

/// Whether this is a CI run (`CI` is `true` or `1`).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Called when `what` is missing: panics in CI, otherwise prints why the test is skipped.
/// The caller returns right after.
pub fn missing(what: &str, why: &str) {
    assert!(
        !in_ci(),
        "{what} is required in CI ({why}); .ci/run installs it"
    );
    eprintln!("SKIPPED (not in CI): {what} is not available here: {why}");
}
