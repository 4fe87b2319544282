//! Randomness for retry backoff: a number that differs in each process and call, so clients
//! that failed together do not retry together.

/// A number from 0 to 1, different in each process and call.
pub(crate) fn jitter() -> f64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}
