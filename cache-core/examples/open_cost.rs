//! What opening a cache file costs the library: CPU seconds of `Cache::open` (this thread's
//! `getrusage`), and the heap it keeps per entry (a counting allocator), then the cost of a
//! first and a second hit. Usage: `cargo run --release -p cache-core --example open_cost --
//! FILE APP` (a file from `cargo xtask bench-gen`, app `bench`).

#![allow(clippy::print_stdout)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Instant;

use cache_core::cache_format::{Fields, Key, Scope, Value};
use cache_core::cache_migrate::Migrations;
use cache_core::{Cache, Namespace, Store};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - layout.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn cpu_seconds() -> f64 {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, u.as_mut_ptr()) };
    // SAFETY: filled above (or left zeroed on failure).
    let u = unsafe { u.assume_init() };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// The key `cargo xtask bench-gen` writes for `m = i`.
fn bench_key(i: i64) -> Key {
    Key::new(Fields::from([
        ("m".to_owned(), Value::Int(i)),
        ("n".to_owned(), Value::Int(i % 97 + 1)),
        ("k".to_owned(), Value::Int(64)),
        ("dtype".to_owned(), Value::from("f16")),
    ]))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, file, app] = &args[..] else {
        eprintln!("usage: open_cost FILE APP");
        std::process::exit(2);
    };
    let file_len = std::fs::metadata(file).expect("the file").len();
    // The scope `cargo xtask bench-gen` writes.
    let scope = Scope::new(Fields::from([
        ("device".to_owned(), Value::from("bench device")),
        ("backend".to_owned(), Value::from("cpu")),
    ]));
    let open = || {
        Cache::builder(Migrations::new(app, 1))
            .file(file)
            .ignore_env()
            .read_only(true)
            .refresh_interval(None)
            .scope(scope.clone())
            .open()
    };
    for round in 0..3 {
        let heap0 = LIVE.load(Ordering::Relaxed);
        let cpu0 = cpu_seconds();
        let wall = Instant::now();
        let cache = open();
        let wall = wall.elapsed().as_secs_f64();
        let cpu = cpu_seconds() - cpu0;
        let heap = LIVE.load(Ordering::Relaxed) - heap0;
        let n = cache.len().max(1);
        // A key `cargo xtask bench-gen` writes, not looked up before.
        let fp = bench_key(50_000 + round as i64).fingerprint();
        let ns = Namespace::new("matmul").expect("a valid name");
        let t = Instant::now();
        let hit = cache.get(ns, &fp).is_some();
        let first_hit = t.elapsed();
        let t = Instant::now();
        for _ in 0..1000 {
            std::hint::black_box(cache.get(ns, &fp));
        }
        let later = t.elapsed() / 1000;
        let t = Instant::now();
        for j in 0..100 {
            let key = bench_key(60_000 + 100 * round as i64 + j);
            assert!(cache.get(ns, &key.fingerprint()).is_some());
        }
        let first_of_100 = t.elapsed() / 100;
        println!(
            "round {round}: {n} entries, open {:.0} ms wall, {:.0} ms cpu; heap {} B/entry \
             (file {} B/entry); hit {hit}: first {first_hit:?}, then {later:?}; first hits of 100 other keys {first_of_100:?} each (key built too)",
            wall * 1e3,
            cpu * 1e3,
            heap / n as isize,
            file_len / n as u64,
        );
        let t = Instant::now();
        drop(cache);
        println!("  drop {:?}", t.elapsed());
        let t = Instant::now();
        let all = {
            let cache = open();
            let t = Instant::now();
            let n = cache.entries().len();
            (n, t.elapsed())
        };
        println!(
            "  open + entries(): {:?} ({} entries; entries() {:?})",
            t.elapsed(),
            all.0,
            all.1
        );
    }
}
