//! Caches a real expensive computation: each item of a batch (a 192×192 f32 matrix) is
//! multiplied by a fixed weight matrix, as a frozen layer would be. The first pass computes
//! every item; the second finds them all; a batch that mixes old and new items computes only
//! the new ones.
//!
//! `cargo run --release -p cache-outputs --example matmul_batches [DIR]` (default: a session
//! cache, removed at exit).
#![allow(clippy::print_stdout, reason = "an example reports what it did")]

use std::time::Instant;

use cache_outputs::{Arg, DType, KeyBuilder, OutputCache, Tensor, TensorRef};

const N: usize = 192;

fn matrix(seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..N * N)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 1000) as f32 / 1000.0
        })
        .collect()
}

/// `a · w`, ikj order.
fn matmul(a: &[f32], w: &[f32]) -> Vec<f32> {
    let mut c = vec![0f32; N * N];
    for i in 0..N {
        for k in 0..N {
            let aik = a[i * N + k];
            for j in 0..N {
                c[i * N + j] += aik * w[k * N + j];
            }
        }
    }
    c
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cache = match std::env::args_os().nth(1) {
        Some(dir) => OutputCache::builder(dir).max_bytes(1 << 30).open()?,
        None => OutputCache::session(None, |b| b.max_bytes(1 << 30))?,
    };
    let weights = matrix(42);
    let w_bytes = bytes(&weights);
    let w_shape = [N as u64, N as u64];
    // The weights are an argument of the key: new weights, new keys.
    let base = KeyBuilder::new("example.frozen_layer", "1").named(
        "weight",
        Arg::Tensor(TensorRef::new(DType::F32, &w_shape, &w_bytes)),
    );

    let run = |label: &str, seeds: &[u64]| -> Result<(), Box<dyn std::error::Error>> {
        let items: Vec<Vec<f32>> = seeds.iter().map(|s| matrix(*s)).collect();
        let batch: Vec<u8> = items.iter().flat_map(|m| bytes(m)).collect();
        let shape = [seeds.len() as u64, N as u64, N as u64];
        let keys = base
            .batch_keys(TensorRef::new(DType::F32, &shape, &batch))
            .ok_or("inconsistent batch")?;
        let start = Instant::now();
        let mut computed = 0;
        let outs = cache
            .get_or_compute_batch(&keys, |missing| -> Result<_, String> {
                computed = missing.len();
                missing
                    .iter()
                    .map(|i| {
                        Tensor::from_f32(vec![N as u64, N as u64], &matmul(&items[*i], &weights))
                            .ok_or_else(|| "shape".to_owned())
                    })
                    .collect()
            })
            .map_err(|e| format!("{e}"))?;
        let check = matmul(&items[0], &weights);
        assert_eq!(outs[0].to_f32_vec().as_deref(), Some(check.as_slice()));
        println!(
            "{label}: {} items, {computed} computed, {:.1} ms",
            seeds.len(),
            start.elapsed().as_secs_f64() * 1e3
        );
        Ok(())
    };
    run("cold", &(0..16).collect::<Vec<_>>())?;
    run("warm", &(0..16).collect::<Vec<_>>())?;
    run("half new", &(8..24).collect::<Vec<_>>())?;
    println!("cache: {} ({:?})", cache.dir().display(), cache.stats());
    Ok(())
}
