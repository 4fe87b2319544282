//! The example docs/rust.md quotes runs: it tunes a key on the CPU, runs the winner, and a
//! second process gets the same winner from the cache.

#[test]
fn the_tuner_quickstart_tunes_then_reuses() {
    let tmp = test_support::temp_dir();
    let first = test_support::example::run("tune_quickstart", tmp.path());
    let first = String::from_utf8_lossy(&first.stdout).into_owned();
    assert!(
        first.contains("(provisional: false)") && first.contains("ran it"),
        "{first}"
    );
    let again = test_support::example::run("tune_quickstart", tmp.path());
    let again = String::from_utf8_lossy(&again.stdout).into_owned();
    let winner = |out: &str| out.lines().next().unwrap_or_default().to_owned();
    assert_eq!(
        winner(&first),
        winner(&again),
        "the second process reuses the winner"
    );
}
