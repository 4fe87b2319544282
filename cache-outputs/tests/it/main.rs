//! The output cache: keys that cover every input, limits that hold, damage, kills,
//! concurrency across threads and processes, session caches.

mod children;
mod concurrency;
mod keys;
mod store;
mod warnings;

use cache_outputs::{Arg, DType, KeyBuilder, Tensor, TensorRef};

/// The deterministic content of value `i` (`len` bytes).
pub(crate) fn content(i: u64, len: usize) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub(crate) fn value(i: u64, len: usize) -> Tensor {
    Tensor::bytes(content(i, len))
}

pub(crate) fn key(i: u64) -> cache_outputs::OutputKey {
    KeyBuilder::new("test.fn", "1").arg(Arg::UInt(i)).finish()
}

pub(crate) fn f32_tensor<'a>(shape: &'a [u64], data: &'a [u8]) -> TensorRef<'a> {
    TensorRef::new(DType::F32, shape, data)
}
