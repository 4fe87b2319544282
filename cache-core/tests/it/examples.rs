//! The example docs/rust.md quotes runs, and a second run finds what the first recorded.

#[test]
fn the_quickstart_records_then_hits() {
    let tmp = test_support::temp_dir();
    let first = test_support::example::run("quickstart", tmp.path());
    let first = String::from_utf8_lossy(&first.stdout);
    assert!(first.starts_with("miss: recorded in "), "{first}");
    let again = test_support::example::run("quickstart", tmp.path());
    let again = String::from_utf8_lossy(&again.stdout);
    assert!(again.starts_with("hit: Some(\"tiled\")"), "{again}");
}
