//! The byte-key memo: a byte key's fingerprint is SHA-256 over its canonical form, which costs
//! more than the lookup itself, so each namespace handle remembers the fingerprints of the byte
//! keys it has seen, under a fast hash of the raw bytes.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use cache_core::cache_format::Fingerprint;
use rustc_hash::FxBuildHasher;

use crate::fields::byte_key;

const SHARDS: usize = 16;
/// Keys remembered per shard; a full shard starts over (the memo is only a shortcut).
const SHARD_CAPACITY: usize = 1 << 16;

type Shard = Mutex<HashMap<Box<[u8]>, Fingerprint, FxBuildHasher>>;

/// Byte key → fingerprint, sharded by a hash of the bytes so threads rarely share a lock.
#[derive(Debug)]
pub(crate) struct ByteMemo {
    shards: Box<[Shard]>,
    capacity: usize,
}

impl ByteMemo {
    pub(crate) fn new() -> Self {
        Self::with_capacity(SHARD_CAPACITY)
    }

    fn with_capacity(capacity: usize) -> Self {
        ByteMemo {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            capacity,
        }
    }

    /// The fingerprint of the byte key `bytes` (FORMAT.md, "Byte keys").
    pub(crate) fn fingerprint(&self, bytes: &[u8]) -> Fingerprint {
        let shard = &self.shards[xxhash_rust::xxh3::xxh3_64(bytes) as usize % SHARDS];
        if let Some(fp) = shard
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(bytes)
        {
            return *fp;
        }
        let fp = Fingerprint::of_key(&byte_key(bytes));
        let mut map = shard.lock().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= self.capacity {
            map.clear();
        }
        map.insert(bytes.into(), fp);
        fp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remembered_fingerprint_is_the_computed_one() {
        let memo = ByteMemo::new();
        for key in [&b""[..], b"\x00\x01", &[0xff; 100]] {
            let want = Fingerprint::of_key(&byte_key(key));
            assert_eq!(memo.fingerprint(key), want, "first time");
            assert_eq!(memo.fingerprint(key), want, "remembered");
        }
    }

    #[test]
    fn a_full_shard_starts_over_and_stays_right() {
        let memo = ByteMemo::with_capacity(64);
        for i in 0..(64 * SHARDS + 1000) as u32 {
            memo.fingerprint(&i.to_le_bytes());
        }
        let total: usize = memo
            .shards
            .iter()
            .map(|s| s.lock().expect("lock").len())
            .sum();
        assert!(total <= 64 * SHARDS, "bounded: {total}");
        let key = 7u32.to_le_bytes();
        assert_eq!(memo.fingerprint(&key), Fingerprint::of_key(&byte_key(&key)));
    }
}
