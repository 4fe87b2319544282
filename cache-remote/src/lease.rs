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

use crate::store::RemoteError;

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

/// The lease operations as one script, atomic on the server: the key's type is checked
/// first, a string is compared whole, and only `acquire` creates.
pub(crate) const LEASE_SCRIPT: &str = r"
local k = KEYS[1]
local t = redis.call('TYPE', k)['ok']
if t ~= 'none' and t ~= 'string' then return {'foreign', t} end
local op, v, ttl = ARGV[1], ARGV[2], ARGV[3]
local cur = redis.call('GET', k)
if cur == false then
  if op == 'acquire' then
    redis.call('SET', k, v, 'PX', ttl)
    return {'done'}
  end
  return {'absent'}
end
if cur == v and op ~= 'peek' then
  if op == 'release' then redis.call('DEL', k) else redis.call('PEXPIRE', k, ttl) end
  return {'done'}
end
return {'held', cur, redis.call('PTTL', k)}
";

/// The script's arguments for `op`: the operation's name, the value, the time to live (ms).
pub(crate) fn script_args<'a>(op: &LeaseOp<'a>) -> (&'static str, &'a [u8], u64) {
    let ms = |d: &Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1);
    match op {
        LeaseOp::Acquire { value, ttl } => ("acquire", value, ms(ttl)),
        LeaseOp::Renew { value, ttl } => ("renew", value, ms(ttl)),
        LeaseOp::Release { value } => ("release", value, 0),
        LeaseOp::Peek => ("peek", &[], 0),
    }
}

/// The script's reply as a [`LeaseReply`].
pub(crate) fn parse_reply(reply: &redis::Value) -> Result<LeaseReply, RemoteError> {
    let bad = || RemoteError::Protocol(format!("a lease script answered {reply:?}"));
    let redis::Value::Array(items) = reply else {
        return Err(bad());
    };
    let text = |i: usize| match items.get(i) {
        Some(redis::Value::BulkString(b)) => Some(b.clone()),
        Some(redis::Value::SimpleString(s)) => Some(s.clone().into_bytes()),
        _ => None,
    };
    match text(0).as_deref() {
        Some(b"done") => Ok(LeaseReply::Done),
        Some(b"absent") => Ok(LeaseReply::Absent),
        Some(b"foreign") => Ok(LeaseReply::Foreign(
            String::from_utf8_lossy(&text(1).unwrap_or_default()).into_owned(),
        )),
        Some(b"held") => {
            let value = text(1).ok_or_else(bad)?;
            let ttl = match items.get(2) {
                Some(redis::Value::Int(ms)) if *ms >= 0 => Some(Duration::from_millis(*ms as u64)),
                _ => None,
            };
            Ok(LeaseReply::Held { value, ttl })
        }
        _ => Err(bad()),
    }
}

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
        host()
    )
    .into_bytes()
}

/// This machine's name, read once (a process keeps its host across a fork).
fn host() -> &'static str {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| {
                h.trim()
                    .chars()
                    .filter(|c| c.is_ascii_graphic())
                    .take(64)
                    .collect()
            })
            .unwrap_or_else(|_| "?".to_owned())
    })
}

/// Whether `value` is a lease value tunecache writes (else someone else's).
pub(crate) fn is_ours(value: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(value) else {
        return false;
    };
    let mut parts = text.split(' ');
    parts.next() == Some(VALUE_TAG)
        && parts
            .next()
            .is_some_and(|t| t.len() == 32 && t.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Who holds a lease, for messages.
pub(crate) fn holder(value: &[u8]) -> String {
    let text = String::from_utf8_lossy(value);
    text.split(' ').skip(2).collect::<Vec<_>>().join(" ")
}

/// The `EVAL` of `op` on the lease key `key`.
pub(crate) fn command(key: &str, op: &LeaseOp<'_>) -> redis::Cmd {
    let (name, value, ttl) = script_args(op);
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(LEASE_SCRIPT)
        .arg(1)
        .arg(key)
        .arg(name)
        .arg(value)
        .arg(ttl);
    cmd
}

/// One reply of a backend to a lease command: a server error (a script refused, a
/// read-only replica) is classified like any other.
pub(crate) fn reply_of(reply: Option<&redis::Value>) -> Result<LeaseReply, RemoteError> {
    match reply {
        Some(redis::Value::ServerError(e)) => Err(crate::server::classify_server_error(e)),
        Some(v) => parse_reply(v),
        None => Err(RemoteError::Protocol(
            "no reply to a lease script".to_owned(),
        )),
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
    }

    #[test]
    fn the_lease_key_shares_the_entry_keys_cluster_slot() {
        assert_eq!(lease_key("tc1:a:1:s:n:f"), "{tc1:a:1:s:n:f}:lease");
    }

    #[test]
    fn script_replies_are_read_and_bad_ones_refused() {
        let s = |t: &str| redis::Value::BulkString(t.as_bytes().to_vec());
        assert_eq!(
            parse_reply(&redis::Value::Array(vec![s("done")])),
            Ok(LeaseReply::Done)
        );
        assert_eq!(
            parse_reply(&redis::Value::Array(vec![
                s("held"),
                s("v"),
                redis::Value::Int(1500)
            ])),
            Ok(LeaseReply::Held {
                value: b"v".to_vec(),
                ttl: Some(Duration::from_millis(1500))
            })
        );
        assert_eq!(
            parse_reply(&redis::Value::Array(vec![
                s("held"),
                s("v"),
                redis::Value::Int(-1)
            ])),
            Ok(LeaseReply::Held {
                value: b"v".to_vec(),
                ttl: None
            })
        );
        assert!(parse_reply(&redis::Value::Int(1)).is_err());
        assert!(parse_reply(&redis::Value::Array(vec![s("what")])).is_err());
    }
}
