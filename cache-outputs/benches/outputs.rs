//! Benchmarks of the output cache, each beside a baseline measured in the same run (this
//! machine is shared and noisy: compare ratios):
//! - hashing a 64×3×224×224 f32 batch (38.5 MB) into a key, against copying the same bytes
//!   (`memcpy`: the memory bandwidth of this run) and reading them once (a sum);
//! - a hit on a 1 MB value from the directory (mapped) and from memory, against reading the
//!   same bytes from a plain file with `std::fs::read`;
//! - batch mode with half of 64 items cached, against all 64 cached.
//!
//! Run with `cargo bench -p cache-outputs`; throughput is printed as GB/s by criterion.

use std::hint::black_box;

use cache_outputs::{Arg, DType, KeyBuilder, OutputCache, Tensor, TensorRef};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};

fn data(len: usize) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn hashing(c: &mut Criterion) {
    let shape = [64u64, 3, 224, 224];
    let bytes = data(64 * 3 * 224 * 224 * 4);
    let mut g = c.benchmark_group("hash_64x3x224x224_f32");
    g.throughput(Throughput::Bytes(bytes.len() as u64));
    g.sample_size(20);
    g.bench_function("key", |b| {
        b.iter(|| {
            KeyBuilder::new("backbone", "1")
                .arg(Arg::Tensor(TensorRef::new(
                    DType::F32,
                    &shape,
                    black_box(&bytes),
                )))
                .finish()
        });
    });
    g.bench_function("batch_keys", |b| {
        let base = KeyBuilder::new("backbone", "1");
        b.iter(|| base.batch_keys(TensorRef::new(DType::F32, &shape, black_box(&bytes))));
    });
    let mut copy = vec![0u8; bytes.len()];
    g.bench_function("baseline_memcpy", |b| {
        b.iter(|| copy.copy_from_slice(black_box(&bytes)));
    });
    g.bench_function("baseline_sum", |b| {
        b.iter(|| {
            black_box(&bytes)
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
                .fold(0u64, u64::wrapping_add)
        });
    });
    g.finish();
}

fn hits(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("dir");
    let value = Tensor::bytes(data(1_000_000));
    let key = KeyBuilder::new("f", "1").arg(Arg::UInt(1)).finish();
    let disk = OutputCache::builder(dir.path().join("disk"))
        .memory_bytes(0)
        .open()
        .expect("open");
    disk.put(&key, value.clone());
    let memory = OutputCache::builder(dir.path().join("mem"))
        .open()
        .expect("open");
    memory.put(&key, value.clone());
    let plain = dir.path().join("plain.bin");
    std::fs::write(&plain, &value.data).expect("write");
    let mut g = c.benchmark_group("hit_1mb");
    g.throughput(Throughput::Bytes(1_000_000));
    g.bench_function("directory_mapped", |b| {
        b.iter(|| disk.get(&key).map(|v| v.bytes()[999_999]));
    });
    g.bench_function("memory", |b| {
        b.iter(|| memory.get(&key).map(|v| v.bytes()[999_999]));
    });
    g.bench_function("baseline_fs_read", |b| {
        b.iter(|| std::fs::read(&plain).map(|v| v[999_999]));
    });
    g.finish();
}

fn batch(c: &mut Criterion) {
    let item = 3 * 32 * 32 * 4;
    let n = 64usize;
    let shape = [n as u64, 3, 32, 32];
    let input = data(n * item);
    let base = KeyBuilder::new("double", "1");
    let keys = base
        .batch_keys(TensorRef::new(DType::F32, &shape, &input))
        .expect("keys");
    let compute = |missing: &[usize]| -> Result<Vec<Tensor>, ()> {
        Ok(missing
            .iter()
            .map(|i| Tensor::bytes(input[i * item..(i + 1) * item].to_vec()))
            .collect())
    };
    let mut g = c.benchmark_group("batch_64_items");
    g.bench_function("half_cached", |b| {
        b.iter_batched(
            || {
                let dir = tempfile::tempdir().expect("dir");
                let cache = OutputCache::builder(dir.path()).open().expect("open");
                let half: Vec<_> = keys.iter().step_by(2).copied().collect();
                cache.get_or_compute_batch(&half, compute).expect("fill");
                (dir, cache)
            },
            |(dir, cache)| {
                let out = cache.get_or_compute_batch(&keys, compute).expect("batch");
                (dir, out)
            },
            BatchSize::PerIteration,
        );
    });
    let dir = tempfile::tempdir().expect("dir");
    let cache = OutputCache::builder(dir.path()).open().expect("open");
    cache.get_or_compute_batch(&keys, compute).expect("fill");
    g.bench_function("all_cached_baseline", |b| {
        b.iter(|| cache.get_or_compute_batch(&keys, compute).expect("batch"));
    });
    g.bench_function("keys_only", |b| {
        b.iter(|| base.batch_keys(TensorRef::new(DType::F32, &shape, black_box(&input))));
    });
    g.finish();
}

criterion_group!(benches, hashing, hits, batch);
criterion_main!(benches);
