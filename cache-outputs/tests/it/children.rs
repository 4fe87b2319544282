//! The code child processes run (see test-support's `child`); in a normal test run the entry
//! point returns at once.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use cache_outputs::OutputCache;
use test_support::child::MARK;

use crate::{content, key, value};

macro_rules! say {
    ($($arg:tt)*) => {{
        println!("{MARK}{}", format_args!($($arg)*));
        let _ = std::io::stdout().flush();
    }};
}

#[test]
fn child_process_entry() {
    let Some((role, path, args)) = test_support::child::role() else {
        return;
    };
    match role.as_str() {
        "putter" => putter(&path, args[0].parse().expect("round")),
        "computer" => computer(&path, Path::new(&args[0]), args[1].parse().expect("n")),
        "session-exit" => {
            let cache = OutputCache::session(Some(&path), |b| b).expect("session");
            cache.put(&key(1), value(1, 1000));
            say!("dir {}", cache.dir().display());
            // Leak it: only the exit hook can remove the directory now.
            std::mem::forget(cache);
            std::process::exit(0);
        }
        "session-wait" => {
            let cache = OutputCache::session(Some(&path), |b| b).expect("session");
            cache.put(&key(1), value(1, 1000));
            say!("ready");
            std::thread::sleep(Duration::from_secs(600));
        }
        other => panic!("unknown child role {other}"),
    }
}

/// Puts values of several sizes, over and over, until killed.
fn putter(dir: &Path, round: u64) {
    let cache = OutputCache::builder(dir)
        .memory_bytes(0)
        .max_bytes(64 << 20)
        .open()
        .expect("open");
    say!("started");
    let mut i = round * 37 % 2000;
    loop {
        cache.put(&key(i), value(i, crate::store::size_of(i)));
        i = (i + 1) % 2000;
    }
}

/// Asks for keys 0..n (each computation logged, slow enough to overlap), checking each value.
fn computer(dir: &Path, log: &Path, n: u64) {
    let cache = OutputCache::builder(dir).open().expect("open");
    for i in 0..n {
        let v = cache
            .get_or_compute(&key(i), || -> Result<_, std::io::Error> {
                let mut f = std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(log)?;
                writeln!(f, "{i}")?;
                std::thread::sleep(Duration::from_millis(30));
                Ok(value(i, 10_000))
            })
            .expect("value");
        assert_eq!(v.bytes(), content(i, 10_000).as_slice());
    }
    say!("done");
}
