//! Decoding hostile shapes: one entry with many candidates, many scopes, many namespaces. For
//! each shape at N, 2N and 4N, criterion times the decode and a counting allocator measures
//! the peak heap it used, printed as a multiple of the input's bytes. Both should grow
//! linearly: the time per byte and the peak multiple stay flat.
//!
//! `cargo bench -p cache-format --bench hostile`
#![allow(
    clippy::print_stdout,
    reason = "the benchmark prints the peak-memory figures"
)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};

use cache_format::{
    CacheData, Candidate, Entry, Fields, Fingerprint, Key, Limits, Origin, Scope, Stats, Value,
    encode_snapshot, raw, read_snapshot,
};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

/// Counts live heap bytes and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; the counters only
// observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the pointer and layout the caller got from alloc.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn stats() -> Stats {
    Stats {
        median_ns: 1.0,
        min_ns: 1.0,
        spread_ns: 0.0,
        samples: 1,
    }
}

fn entry(id: i64, candidates: u64) -> Entry {
    Entry::new(
        Key::new(Fields::from([("id".to_owned(), Value::Int(id))])),
        Fingerprint::default(),
        Origin::Imported("bench".into()),
        1,
        (0..candidates).map(|i| Candidate::measured(format!("c{i}"), Fields::new(), stats())),
    )
}

fn shape(name: &str, n: u64) -> CacheData {
    let mut data = CacheData::new();
    match name {
        "candidates" => data.insert(&Scope::default(), "ns", entry(0, n)),
        "scopes" => {
            for i in 0..n {
                let scope = Scope::new(Fields::from([("d".to_owned(), Value::Int(i as i64))]));
                data.insert(&scope, "ns", entry(0, 1));
            }
        }
        "namespaces" => {
            for i in 0..n {
                data.insert(&Scope::default(), &format!("ns{i}"), entry(0, 1));
            }
        }
        _ => unreachable!("a known shape"),
    }
    data
}

fn decode(bytes: &[u8]) -> usize {
    let snap = read_snapshot(bytes, &Limits::default()).expect("within the caps");
    raw::decode_snapshot(&snap).expect("decodes").len()
}

/// Peak heap while decoding `bytes`, beyond what was live before.
fn peak_of(bytes: &[u8]) -> usize {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    black_box(decode(bytes));
    PEAK.load(Ordering::Relaxed) - base
}

fn hostile(c: &mut Criterion) {
    for (name, base) in [
        ("candidates", 15_000u64),
        ("scopes", 1_000),
        ("namespaces", 15_000),
    ] {
        let mut group = c.benchmark_group(format!("decode_{name}"));
        group.sample_size(10);
        for n in [base, 2 * base, 4 * base] {
            let bytes = encode_snapshot("bench", 1, &shape(name, n));
            let peak = peak_of(&bytes);
            println!(
                "{name} x{n}: {} bytes, peak heap {} bytes = {:.1}x the input",
                bytes.len(),
                peak,
                peak as f64 / bytes.len() as f64
            );
            group.throughput(Throughput::Bytes(bytes.len() as u64));
            group.bench_with_input(BenchmarkId::from_parameter(n), &bytes, |b, bytes| {
                b.iter(|| decode(black_box(bytes)))
            });
        }
        group.finish();
    }
}

/// A JSON key (as `tunecache import` reads it) with N fields in reverse order.
fn json_fields(c: &mut Criterion) {
    let mut group = c.benchmark_group("json_key_fields_reversed");
    group.sample_size(10);
    for n in [25_000u64, 50_000, 100_000] {
        let body: Vec<String> = (0..n).rev().map(|i| format!("\"f{i:07}\":{i}")).collect();
        let text = format!("{{{}}}", body.join(","));
        group.throughput(Throughput::Bytes(text.len() as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &text, |b, text| {
            b.iter(|| serde_json::from_str::<Value>(black_box(text)).expect("a map"))
        });
    }
    group.finish();
}

criterion_group!(benches, hostile, json_fields);
criterion_main!(benches);
