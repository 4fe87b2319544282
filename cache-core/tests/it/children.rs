//! The code child processes run. The parent starts this test binary filtered to
//! `child_process_entry` with `TUNECACHE_TEST_CHILD` naming a role; in a normal test run the
//! variable is absent and the entry point returns at once (it is a harness hook, not a test).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cache_core::{Cache, Store, StoreError};

use crate::support::{MARK, builder, entry, ns, registry};

/// Prints one protocol line for the parent (see `support::MARK`).
macro_rules! say {
    ($($arg:tt)*) => {
        println!("{MARK}{}", format_args!($($arg)*))
    };
}

#[test]
fn child_process_entry() {
    let Some((role, path, args)) = test_support::child::role() else {
        return;
    };
    let num = |i: usize| -> u64 { args[i].parse().expect("numeric child argument") };
    match role.as_str() {
        "writer" => writer(path, num(0), num(1), num(2)),
        "killable" => killable(path, num(0), num(1), num(2)),
        "hold-lock" => hold_lock(path, num(0)),
        "fsize" => fsize(path, num(0), &args[1]),
        "migrate-fsize" => migrate_fsize(path, num(0)),
        "env-open" => env_open(),
        "system-reader" => system_reader(path, &args),
        "opener" => opener(path, num(0)),
        "folder" => folder(path, num(0), &args[1]),
        other => panic!("unknown child role {other}"),
    }
}

/// Flushes until it succeeds: a busy lock only delays durability, it never loses a result.
fn flush_until_ok(cache: &Cache) {
    let start = Instant::now();
    loop {
        match cache.flush() {
            Ok(()) => return,
            Err(e @ (StoreError::LockTimeout { .. } | StoreError::FlushTimeout(_)))
                if start.elapsed() < Duration::from_secs(300) =>
            {
                eprintln!("child {}: retrying flush after: {e}", std::process::id());
            }
            Err(e) => panic!("flush failed: {e}"),
        }
    }
}

/// Records `count` results as `writer`, flushing every `every`.
fn writer(path: PathBuf, writer: u64, count: u64, every: u64) {
    let cache = builder(&path).compaction(0.5, 16 << 10).open();
    for i in 0..count {
        cache.put(ns(), entry(writer, i));
        if (i + 1) % every == 0 {
            flush_until_ok(&cache);
            say!("flushed {i}");
        }
    }
    flush_until_ok(&cache);
    say!("done");
}

/// Records results one at a time as `writer`, each flushed (a journal record) and folded into
/// the table every few kilobytes, appending each id to `acks` once its flush returned: what a
/// reader opened after that line must see.
fn folder(path: PathBuf, writer: u64, acks: &str) {
    use std::io::Write as _;
    let cache = builder(&path).compaction(1e9, 1 << 10).open();
    let mut log = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(acks)
        .expect("acks");
    for i in 0.. {
        cache.put(ns(), entry(writer, i));
        flush_until_ok(&cache);
        writeln!(log, "{i}").expect("ack");
    }
}

/// Records batches forever, printing the last id of each batch once it is durable; the parent
/// kills it with SIGKILL at a random moment. Tiny compaction thresholds make many kills land
/// in the middle of a compaction.
fn killable(path: PathBuf, writer: u64, start: u64, batch: u64) {
    let cache = builder(&path)
        .compaction(0.05, 2 << 10)
        .save_delay(Duration::from_millis(1))
        .open();
    let mut next = start;
    loop {
        for _ in 0..batch {
            cache.put(ns(), entry(writer, next));
            next += 1;
        }
        flush_until_ok(&cache);
        say!("flushed {}", next - 1);
    }
}

/// Holds the cache lock for `secs` seconds.
fn hold_lock(path: PathBuf, secs: u64) {
    let lock_path = PathBuf::from(format!("{}.lock", path.display()));
    let _lock = test_support::hold_lock(&lock_path);
    say!("locked");
    std::thread::sleep(Duration::from_secs(secs));
}

/// Records results with a file-size limit (RLIMIT_FSIZE) that makes the write fail as a full
/// disk would; checks the files are intact, lifts the limit and saves again.
fn fsize(path: PathBuf, limit: u64, how: &str) {
    let journal = PathBuf::from(format!("{}.journal", path.display()));
    let read = |p: &PathBuf| std::fs::read(p).unwrap_or_default();
    // Only the explicit flushes write: a save the saver started on its own while results are
    // recorded could succeed for the first few (they fit under the limit) and change the
    // journal this test checks is left as it was.
    let quiet = builder(&path).save_delay(Duration::from_secs(3600));
    let cache = match how {
        "compact" => quiet.compaction(0.0, 0).open(),
        _ => quiet.open(),
    };
    // SAFETY: plain libc calls with valid arguments; SIGXFSZ would otherwise kill us.
    let old = unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        let mut old = std::mem::zeroed::<libc::rlimit>();
        assert_eq!(libc::getrlimit(libc::RLIMIT_FSIZE, &mut old), 0);
        old
    };
    let (snap_before, journal_before) = (read(&path), read(&journal));
    let limited = libc::rlimit {
        rlim_cur: limit as libc::rlim_t,
        rlim_max: old.rlim_max,
    };
    // The limit is set before the results are recorded.
    // SAFETY: valid pointer to a valid rlimit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &limited) }, 0);
    for i in 0..300 {
        cache.put(ns(), entry(2, i));
    }
    match cache.flush() {
        Ok(()) => say!("flush-unexpectedly-ok"),
        Err(e) => say!("flush-failed {e}"),
    }
    // The snapshot is untouched, and the journal holds exactly the records it held (a new,
    // empty journal may have been started; no partial record may remain).
    let limits = cache_core::cache_format::Limits::default();
    let records = |bytes: &[u8]| -> Option<(usize, bool)> {
        if bytes.is_empty() {
            return Some((0, true));
        }
        let (_, _, start) = cache_core::cache_format::read_journal_header(bytes, &limits).ok()?;
        let scan = cache_core::cache_format::scan_records(bytes, start, &limits);
        Some((
            scan.records.len(),
            scan.tail == cache_core::cache_format::Tail::Clean && scan.damaged.is_empty(),
        ))
    };
    let intact = read(&path) == snap_before && records(&read(&journal)) == records(&journal_before);
    say!("intact {intact}");
    // SAFETY: raising the soft limit back to the (unchanged) hard limit is always allowed.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &old) }, 0);
    match cache.flush() {
        Ok(()) => say!("flush-ok"),
        Err(e) => say!("flush-still-failing {e}"),
    }
}

/// Migrates `path` (schema 1 → 2) with a backup, under a file-size limit that makes writing
/// the new snapshot fail as a full disk would.
fn migrate_fsize(path: PathBuf, limit: u64) {
    use cache_core::cache_migrate::{Migrations, Step};
    use cache_core::{MigrateOptions, migrate_file};
    let registry = Migrations::new(crate::support::APP, 2)
        .with(Step::declarative(1, 2, "nothing to change", vec![]))
        .expect("valid registry");
    let options = MigrateOptions {
        backup: true,
        ..MigrateOptions::default()
    };
    limit_file_size(limit);
    match migrate_file(&path, &registry, &options) {
        Ok(outcome) => say!("migrate-unexpectedly-ok {outcome:?}"),
        Err(e) => say!("migrate-failed {e}"),
    }
}

/// Sets RLIMIT_FSIZE's soft limit to `limit` bytes, with SIGXFSZ ignored so that a write past
/// it fails with EFBIG instead of killing the process.
fn limit_file_size(limit: u64) {
    // SAFETY: plain libc calls with valid arguments.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        let mut old = std::mem::zeroed::<libc::rlimit>();
        assert_eq!(libc::getrlimit(libc::RLIMIT_FSIZE, &mut old), 0);
        let limited = libc::rlimit {
            rlim_cur: limit as libc::rlim_t,
            rlim_max: old.rlim_max,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &limited), 0);
    }
}

/// Opens a cache configured only by the environment, records one result and reports.
fn env_open() {
    let cache = Cache::builder(registry(1))
        .save_delay(Duration::from_millis(10))
        .open();
    cache.put(ns(), entry(9, 9));
    let flushed = cache.flush();
    let health = cache.health();
    say!("mode {:?}", health.mode);
    say!(
        "path {}",
        health
            .path
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "none".into())
    );
    say!("flush {}", if flushed.is_ok() { "ok" } else { "err" });
}

/// Opens `path` with the system files `args[1..]` (in the directory `args[0]`), says whether it
/// may create a file in that directory, which shipped entries hit, then records and flushes one
/// result of its own.
fn system_reader(path: PathBuf, args: &[String]) {
    let probe = std::path::Path::new(&args[0]).join("probe");
    match std::fs::File::create(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            say!("writable");
        }
        Err(e) => say!("read-only {:?}", e.kind()),
    }
    let cache = builder(&path).system_files(&args[1..]).open();
    let hits = (0..5)
        .filter(|id| crate::support::has(&cache, 7, *id))
        .count()
        + usize::from(crate::support::has(&cache, 8, 1));
    say!("hits {hits}");
    cache.put(ns(), entry(1, 1));
    cache.flush().expect("the user's own file");
    say!("done");
}

/// Opens the cache read-only again and again for `millis` ms while others write, compact and
/// are killed: each open must read the file (no error, nothing quarantined), and every entry it
/// lists must read back. Prints how many opens it made; panics (a non-zero exit) otherwise.
fn opener(path: PathBuf, millis: u64) {
    let until = Instant::now() + Duration::from_millis(millis);
    let mut opens = 0u64;
    while Instant::now() < until {
        let cache = builder(&path).read_only(true).refresh_interval(None).open();
        let health = cache.health();
        assert_eq!(health.mode, cache_core::Mode::ReadOnly, "{health:?}");
        assert!(
            health.quarantined.is_empty() && health.last_error.is_none(),
            "{health:?}"
        );
        for (n, e) in cache.entries() {
            assert!(
                cache.get(n, &e.fingerprint()).is_some(),
                "an entry listed does not read back"
            );
        }
        opens += 1;
    }
    say!("opens {opens}");
}
