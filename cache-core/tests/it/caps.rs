//! A file at the format's caps (4,096 scopes): no write takes it past them, so no reader
//! ever refuses it. An import that a fold would take past them keeps its entries in the
//! journal, readable there; a rewrite (`gc`) that would is refused with the file unchanged.
//! (A fold once wrote a table with 4,097 scopes: every entry was lost to readers.)

use cache_core::cache_format::{CacheData, Limits, Scope};
use cache_core::{AppendOptions, GcPolicy, gc_file, merge_into_file};

use crate::support::{entry, path_in, path_in_journal, registry, scope, temp_dir};

/// Every entry of the file at `path` as a reader reads it, and what it could not read.
fn read(path: &std::path::Path) -> (usize, Vec<String>) {
    let found = cache_core::inspect(path, &Limits::default(), None).expect("inspect");
    let mut walk = found.in_key_order();
    let n = walk.by_ref().count();
    let mut problems = found.problems.clone();
    problems.extend(walk.problems().iter().cloned());
    (n, problems)
}

#[test]
fn no_write_takes_a_file_past_the_scope_cap() {
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let max = Limits::default().max_scopes;
    let mut full = CacheData::new();
    for s in 0..max {
        full.insert(&scope(&format!("d{s}")), "matmul", entry(1, s));
    }
    let options = AppendOptions::default();
    merge_into_file(&path, &registry(1), full, &options).expect("merged");
    assert_eq!(read(&path), (max as usize, Vec::new()));
    // More entries in one new scope than the journal takes: a fold would give the table one
    // scope too many.
    let mut more = CacheData::new();
    let extra = Scope::default();
    for i in 0..5000 {
        more.insert(&extra, "matmul", entry(2, i));
    }
    let merged = merge_into_file(&path, &registry(1), more, &options);
    let (n, problems) = read(&path);
    assert!(problems.is_empty(), "{merged:?}: {problems:?}");
    match merged {
        // Kept: in the journal, readable.
        Ok(_) => assert_eq!(n, max as usize + 5000),
        // Refused: nothing written.
        Err(e) => {
            assert_eq!(n, max as usize, "{e}");
            assert!(e.to_string().contains("scopes"), "{e}");
        }
    }
    // A rewrite of the whole file would hold them all in one table: refused, the file as it
    // was, still read whole.
    let before = (
        std::fs::read(&path).expect("file"),
        std::fs::read(path_in_journal(&path)).ok(),
    );
    let policy = GcPolicy {
        max_age: Some(std::time::Duration::from_secs(100 * 365 * 86_400)),
        ..GcPolicy::default()
    };
    let gc = gc_file(&path, &registry(1), &policy);
    let after = (
        std::fs::read(&path).expect("file"),
        std::fs::read(path_in_journal(&path)).ok(),
    );
    if after != before {
        // A rewrite that went through must be readable whole.
        assert!(gc.is_ok(), "{gc:?}");
    }
    assert_eq!(read(&path), (n, Vec::new()), "{gc:?}");
}
