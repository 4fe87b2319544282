//! The byte-key memo: a byte key's fingerprint is SHA-256 over its canonical form, which costs
//! more than the lookup itself, so each namespace handle remembers the keys (canonical fields
//! and fingerprint) of the byte keys it has seen, under a fast hash of the raw bytes: a lookup
//! takes the fingerprint, a record a copy of the key.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use cache_core::cache_format::{Fingerprint, Key};
use rustc_hash::FxBuildHasher;

use crate::fields::byte_key;

const SHARDS: usize = 16;
/// Key bytes remembered per shard (4 MiB: 64 MiB in all, whatever the keys' sizes); a full
/// shard starts over (the memo is only a shortcut). Each key counts its bytes three times (the
/// bytes, and their hex in the key's fields) and [`PER_KEY`] more.
const SHARD_BYTES: usize = 4 << 20;
/// What a remembered key costs beside its bytes (its box, its key's map node and strings,
/// and its table slot).
const PER_KEY: usize = 160;

/// One shard: the keys and the bytes they hold.
#[derive(Default)]
struct Memo {
    map: HashMap<Box<[u8]>, Key, FxBuildHasher>,
    bytes: usize,
}

impl std::fmt::Debug for Memo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memo")
            .field("keys", &self.map.len())
            .field("bytes", &self.bytes)
            .finish()
    }
}

type Shard = Mutex<Memo>;

/// Byte key → key, sharded by a hash of the bytes so threads rarely share a lock.
#[derive(Debug)]
pub(crate) struct ByteMemo {
    shards: Box<[Shard]>,
    /// Bytes a shard may hold.
    capacity: usize,
}

impl ByteMemo {
    pub(crate) fn new() -> Self {
        Self::with_capacity(SHARD_BYTES)
    }

    fn with_capacity(capacity: usize) -> Self {
        ByteMemo {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            capacity,
        }
    }

    /// The fingerprint of the byte key `bytes` (FORMAT.md, "Byte keys").
    pub(crate) fn fingerprint(&self, bytes: &[u8]) -> Fingerprint {
        self.with_key(bytes, Key::fingerprint)
    }

    /// The key of the byte key `bytes`: its canonical fields and fingerprint.
    pub(crate) fn key(&self, bytes: &[u8]) -> Key {
        self.with_key(bytes, Key::clone)
    }

    fn with_key<R>(&self, bytes: &[u8], f: impl FnOnce(&Key) -> R) -> R {
        let shard = &self.shards[xxhash_rust::xxh3::xxh3_64(bytes) as usize % SHARDS];
        if let Some(key) = shard
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .map
            .get(bytes)
        {
            return f(key);
        }
        let key = Key::new(byte_key(bytes));
        let answer = f(&key);
        let cost = 3 * bytes.len() + PER_KEY;
        if cost > self.capacity {
            // A key larger than a shard is not remembered at all.
            return answer;
        }
        let mut memo = shard.lock().unwrap_or_else(PoisonError::into_inner);
        if memo.bytes + cost > self.capacity {
            memo.map.clear();
            memo.bytes = 0;
        }
        if memo.map.insert(bytes.into(), key).is_none() {
            memo.bytes += cost;
        }
        answer
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
        let memo = ByteMemo::with_capacity(64 * (4 + PER_KEY));
        for i in 0..(64 * SHARDS + 1000) as u32 {
            memo.fingerprint(&i.to_le_bytes());
        }
        let total: usize = memo
            .shards
            .iter()
            .map(|s| s.lock().expect("lock").map.len())
            .sum();
        assert!(total <= 64 * SHARDS, "bounded: {total}");
        let key = 7u32.to_le_bytes();
        assert_eq!(memo.fingerprint(&key), Fingerprint::of_key(&byte_key(&key)));
    }

    /// Hardening IV, case 15: the memo was bounded by count, so 8,000 lookups of 64 KiB keys
    /// held 506 MB. It is bounded in bytes: large keys never hold more than the shards'
    /// bytes, and a key larger than a shard is answered without being remembered.
    #[test]
    fn the_memo_is_bounded_in_bytes_whatever_the_keys_sizes() {
        let capacity = 256 << 10;
        let memo = ByteMemo::with_capacity(capacity);
        for i in 0..300u32 {
            let mut key = vec![0u8; 64 << 10];
            key[..4].copy_from_slice(&i.to_le_bytes());
            assert_eq!(memo.fingerprint(&key), Fingerprint::of_key(&byte_key(&key)));
        }
        let held: usize = memo
            .shards
            .iter()
            .map(|s| {
                s.lock()
                    .expect("lock")
                    .map
                    .keys()
                    .map(|k| k.len())
                    .sum::<usize>()
            })
            .sum();
        assert!(held <= SHARDS * capacity, "{held} bytes held");
        let huge = vec![1u8; capacity + 1];
        assert_eq!(
            memo.fingerprint(&huge),
            Fingerprint::of_key(&byte_key(&huge))
        );
    }
}
