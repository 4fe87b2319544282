//! The CPU backend: real kernels whose best variant depends on the problem's shape, timed with
//! the monotonic clock. It is what `tunecache tune` runs when no GPU is usable.

mod matmul;
mod reduce;

pub use matmul::{Matmul, MatmulKey};
pub use reduce::{Reduce, ReduceKey};

use cache_core::cache_format::{Fields, Scope, Value};

/// The scope of measurements on this machine's CPU: model, core count, architecture, and
/// this library's version (volatile: an upgrade re-times instead of re-tuning).
pub fn scope() -> Scope {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown cpu".to_owned());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as i64;
    Scope::new(Fields::from([
        ("backend".to_owned(), Value::from("cpu")),
        ("device".to_owned(), Value::from(model)),
        ("cores".to_owned(), Value::Int(cores)),
        ("arch".to_owned(), Value::from(std::env::consts::ARCH)),
        (
            "library".to_owned(),
            Value::from(concat!("gpu-tuner ", env!("CARGO_PKG_VERSION"))),
        ),
    ]))
}

/// Deterministic pseudo-random values in [-1, 1), so every process measures the same data.
pub fn fill(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}
