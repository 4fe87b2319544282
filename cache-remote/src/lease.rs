//! Leases: one measurer per key across a fleet (FORMAT.md, "Leases"). A lease is a string
//! under `{<entry key>}:lease` (the braces put it on the entry's Redis Cluster slot) holding
//! `tclease1 <token> <holder>`, set only if absent, with a time to live that its holder renews
//! while it measures; renewing and releasing compare the whole value first, so a late or
//! foreign holder changes nothing. A key of another type, or a value not in this form, is
//! someone else's: never written, never deleted.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use cache_core::Namespace;
use cache_format::Fingerprint;

/// One operation on a lease key.
#[derive(Debug, Clone, Copy)]
pub enum LeaseOp<'a> {
    /// Sets `value` with `ttl` if the key is absent (or already holds `value`: renewed).
    Acquire {
        /// The holder's lease value.
        value: &'a [u8],
        /// Its time to live.
        ttl: Duration,
    },
    /// Gives the key `ttl` again if it still holds `value`.
    Renew {
        /// The holder's lease value.
        value: &'a [u8],
        /// Its time to live.
        ttl: Duration,
    },
    /// Deletes the key if it still holds `value`.
    Release {
        /// The holder's lease value.
        value: &'a [u8],
    },
    /// Reads the key without changing it.
    Peek,
}

/// What a lease operation found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseReply {
    /// Acquired, renewed or released.
    Done,
    /// The key holds another value (`ttl`: its time left; `None` if it has none).
    Held {
        /// The value it holds.
        value: Vec<u8>,
        /// Its time to live left.
        ttl: Option<Duration>,
    },
    /// The key is absent (a renew or release found the lease gone: it expired).
    Absent,
    /// The key holds something that is not a string (its type): someone else's.
    Foreign(String),
}

/// A key whose lease this process holds ([`crate::LeaseGuard`]): what its publications are
/// fenced by (see [`crate::Fence`]), and what they found.
#[derive(Debug)]
pub(crate) struct HeldLease {
    /// The lease key.
    pub(crate) key: String,
    /// This holder's value.
    pub(crate) value: Vec<u8>,
    /// The entry as the server held it when the lease was taken (as read: at most the value
    /// cap and one byte).
    pub(crate) seen: Option<Vec<u8>>,
    /// The holder has finished measuring: the publication that writes the key releases the
    /// lease in the same step.
    pub(crate) finishing: AtomicBool,
    /// A publication released it.
    pub(crate) released: AtomicBool,
    /// A publication was refused: the lease had been lost (another took the key over).
    pub(crate) fenced: AtomicBool,
}

/// The keys whose lease this process holds, by namespace and key fingerprint.
pub(crate) type Fences = HashMap<(Namespace, Fingerprint), Arc<HeldLease>>;

/// The lease key of the entry key `key`.
pub fn lease_key(key: &str) -> String {
    format!("{{{key}}}:lease")
}

const VALUE_TAG: &str = "tclease1";

/// A new lease value: the tag, a fresh 128-bit token, and who holds it.
pub(crate) fn new_value() -> Vec<u8> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut halves = [0u64; 2];
    for (i, half) in halves.iter_mut().enumerate() {
        // RandomState is seeded from the OS once per process; the counter and time make each
        // token of the process distinct.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.write_u32(std::process::id());
        h.write_usize(i);
        *half = h.finish();
    }
    format!(
        "{VALUE_TAG} {:016x}{:016x} pid={} host={}",
        halves[0],
        halves[1],
        std::process::id(),
        cache_core::host_name()
    )
    .into_bytes()
}

/// Whether `value` is a lease value tunecache writes (else someone else's).
pub(crate) fn is_ours(value: &[u8]) -> bool {
    // tunecache's own values are under 200 bytes: a longer one is someone else's.
    if value.len() > MAX_VALUE_BYTES {
        return false;
    }
    let Ok(text) = std::str::from_utf8(value) else {
        return false;
    };
    let mut parts = text.split(' ');
    parts.next() == Some(VALUE_TAG)
        && parts
            .next()
            .is_some_and(|t| t.len() == 32 && t.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The longest lease value tunecache takes for one of its own.
const MAX_VALUE_BYTES: usize = 1024;

/// Who holds a lease, for messages: what the lease says (its writer's choice: never a reason
/// to decide anything), at most 120 characters, control characters escaped.
pub(crate) fn holder(value: &[u8]) -> String {
    let text = String::from_utf8_lossy(&value[..value.len().min(MAX_VALUE_BYTES)]);
    let said = text.split(' ').skip(2).collect::<Vec<_>>().join(" ");
    let said: String = said
        .chars()
        .take(120)
        .flat_map(char::escape_default)
        .collect();
    if said.is_empty() {
        "an unnamed holder".to_owned()
    } else {
        said
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_values_are_distinct_and_recognised() {
        let (a, b) = (new_value(), new_value());
        assert_ne!(a, b);
        assert!(is_ours(&a) && is_ours(&b));
        assert!(holder(&a).starts_with(&format!("pid={}", std::process::id())));
        for foreign in [&b"tclease1"[..], b"tclease1 xyz", b"lock", b"\xff\xfe", b""] {
            assert!(!is_ours(foreign), "{foreign:?}");
        }
        // A holder text empty or huge: named plainly and briefly; a huge value is not ours.
        let empty = format!("tclease1 {:032x}", 7).into_bytes();
        assert!(is_ours(&empty));
        assert_eq!(holder(&empty), "an unnamed holder");
        let mut huge = format!("tclease1 {:032x} pid=1 host=", 7).into_bytes();
        huge.extend(std::iter::repeat_n(b'x', 10 << 20));
        assert!(!is_ours(&huge));
        assert!(holder(&huge).len() <= 120);
        let control = format!("tclease1 {:032x} pid=1 host=\x1b[2J", 7).into_bytes();
        assert!(!holder(&control).contains('\x1b'));
    }

    #[test]
    fn the_lease_key_shares_the_entry_keys_cluster_slot() {
        assert_eq!(lease_key("tc1:a:1:s:n:f"), "{tc1:a:1:s:n:f}:lease");
    }
}
