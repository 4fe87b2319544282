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

/// An entry of `n` candidates (`first..first + n`) for one key, each with median `median_ns`.
fn wide(first: u64, n: u64, median_ns: f64) -> cache_core::cache_format::Entry {
    use cache_core::cache_format::{Candidate, Entry, Fields, Stats, Value};
    let stats = Stats {
        median_ns,
        min_ns: median_ns,
        spread_ns: 3.0,
        samples: 9,
    };
    let (key, fp, origin, at, _) = entry(1, 1).into_parts();
    let candidates = (first..first + n).map(|i| {
        let params = Fields::from([("i".to_owned(), Value::Int(i as i64))]);
        Candidate::measured("tiled", params, stats)
    });
    Entry::new(key, fp, origin, at, candidates)
}

/// The params `i` of each candidate `path`'s entry `wide` made holds, best first.
fn wide_on_disk(path: &std::path::Path) -> Vec<i64> {
    use cache_core::Store;
    use cache_core::cache_format::Value;
    let cache = crate::support::builder(path).open();
    let found = cache
        .lookup(crate::support::ns(), &crate::support::key(1, 1))
        .expect("the wide entry");
    found
        .candidates()
        .iter()
        .map(|c| match c.id.params.get("i") {
            Some(Value::Int(i)) => *i,
            other => panic!("{other:?}"),
        })
        .collect()
}

/// One entry taken past the format's 65,536 candidates (an import of that many, then one
/// record in this process and one in another that had not read them) once made every later
/// save of this process fail ("candidates of an entry: 65538 is over the limit") and lose
/// what it recorded since: the merge now keeps 65,536 (the winner and the newest), and says so.
#[test]
fn an_entry_merged_past_the_candidate_cap_keeps_its_best_and_the_file_stays_writable() {
    use cache_core::Store;
    crate::support::capture_logs();
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let max = Limits::default().max_candidates;
    let other = crate::support::builder(&path).open();
    let cache = crate::support::builder(&path).open();
    let mut data = CacheData::new();
    data.insert(&Scope::default(), "matmul", wide(0, max, 2000.0));
    let imported = cache.import(data);
    assert_eq!(imported.taken, 1, "{:?}", imported.refused);
    cache.flush().expect("flush");
    // One faster candidate here, one in another process that has not read the full entry.
    cache.put(crate::support::ns(), wide(max, 1, 500.0));
    other.put(crate::support::ns(), wide(max + 1, 1, 400.0));
    other.flush().expect("the other's flush");
    // Later results of both are written, and read back by a new process.
    cache.put(crate::support::ns(), entry(2, 5));
    other.put(crate::support::ns(), entry(3, 5));
    cache.flush().expect("this process's flush");
    other.flush().expect("the other's second flush");
    drop((cache, other));
    let (n, problems) = read(&path);
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(n, 3);
    assert!(crate::support::has(
        &crate::support::builder(&path).open(),
        2,
        5
    ));
    assert!(crate::support::has(
        &crate::support::builder(&path).open(),
        3,
        5
    ));
    let kept = wide_on_disk(&path);
    assert_eq!(kept.len() as u64, max);
    assert_eq!(kept[..2], [max as i64 + 1, max as i64], "the fastest lead");
    let said = crate::support::warnings_about("over the 65536 one entry keeps");
    assert!(!said.is_empty(), "the drop is said");
}

/// An import that takes an entry past the bound says so, as a put does (a review saw
/// `tunecache import` drop candidates without a word).
#[test]
fn an_import_past_the_candidate_cap_says_so() {
    crate::support::capture_logs();
    let dir = temp_dir();
    let path = path_in(&dir, "c.tcache");
    let max = Limits::default().max_candidates;
    let cache = crate::support::builder(&path).open();
    let import = |first: u64, n: u64| {
        let mut data = CacheData::new();
        data.insert(&Scope::default(), "matmul", wide(first, n, 2000.0));
        let imported = cache.import(data);
        assert_eq!(imported.taken, 1, "{:?}", imported.refused);
    };
    import(0, max);
    let said = || crate::support::warnings_about(&format!("would hold {} candidates", max + 3));
    assert!(said().is_empty());
    import(max, 3);
    assert!(!said().is_empty(), "the drop is said");
}
