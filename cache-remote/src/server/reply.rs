//! What both Redis backends (single server, cluster) send and how they read the replies, so
//! they cannot drift: the commands of a read and of a compare-and-set, the one policy for a
//! batch's replies, and how a client error is sorted.

use std::time::{Duration, Instant};

use crate::store::RemoteError;

/// Compare-and-set of one key: ARGV = has-expected (`1`/`0`), expected, new value, time to
/// live in ms (`0`: none). Returns 1 if it set the value. Lua strings are binary-safe.
pub(crate) const CAS_SCRIPT: &str = r"
local cur = redis.call('GET', KEYS[1])
if ARGV[1] == '1' then
  if cur ~= ARGV[2] then return 0 end
elseif cur then
  return 0
end
if ARGV[4] == '0' then
  redis.call('SET', KEYS[1], ARGV[3])
else
  redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[4])
end
return 1
";

/// The read of one key: `GET`, or `GETEX … PX` to refresh its time to live.
pub(crate) fn read_command(key: &str, touch: Option<Duration>) -> redis::Cmd {
    match touch {
        Some(ttl) => {
            let mut cmd = redis::cmd("GETEX");
            cmd.arg(key).arg("PX").arg(millis(ttl));
            cmd
        }
        None => {
            let mut cmd = redis::cmd("GET");
            cmd.arg(key);
            cmd
        }
    }
}

/// The compare-and-set of one swap (see [`CAS_SCRIPT`]); `ttl` in ms, 0 for none.
pub(crate) fn swap_command(swap: &crate::Swap<'_>, ttl: u64) -> redis::Cmd {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(CAS_SCRIPT)
        .arg(1)
        .arg(swap.key)
        .arg(if swap.expected.is_some() { "1" } else { "0" })
        .arg(swap.expected.unwrap_or_default())
        .arg(swap.value)
        .arg(ttl);
    cmd
}

/// One reply of a batch of reads.
pub(crate) type ReadReply = redis::RedisResult<Option<Vec<u8>>>;

/// The values of a batch of `asked` reads from their replies, one per key: an error for one
/// key (a value of another type someone put there: `WRONGTYPE`) reads as an empty value,
/// which every check refuses, so it fails neither the other keys nor the batch; a full server
/// (it refuses `GETEX`, a write, for every key alike) fails the batch.
pub(crate) fn values(
    replies: Vec<ReadReply>,
    asked: usize,
) -> Result<Vec<Option<Vec<u8>>>, RemoteError> {
    if replies.len() != asked {
        return Err(RemoteError::Protocol(format!(
            "{} replies to {asked} reads",
            replies.len()
        )));
    }
    let mut out = Vec::with_capacity(asked);
    for reply in replies {
        match reply {
            Ok(v) => out.push(v),
            Err(e) => match classify(&e) {
                full @ RemoteError::Full(_) => return Err(full),
                _ => out.push(Some(Vec::new())),
            },
        }
    }
    Ok(out)
}

/// Whether each swap was made, from the scripts' answers.
pub(crate) fn swapped(done: Vec<i64>, asked: usize) -> Result<Vec<bool>, RemoteError> {
    if done.len() != asked {
        return Err(RemoteError::Protocol(format!(
            "{} replies to {asked} writes",
            done.len()
        )));
    }
    Ok(done.into_iter().map(|d| d == 1).collect())
}

/// The answer to `PING`.
pub(crate) fn pong(answer: String) -> Result<(), RemoteError> {
    if answer == "PONG" {
        Ok(())
    } else {
        Err(RemoteError::Protocol(format!("PING answered {answer:?}")))
    }
}

/// The time left until `deadline`, or a timeout if none is.
pub(crate) fn left(deadline: Instant, what: &str) -> Result<Duration, RemoteError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(RemoteError::Timeout(format!("no time left to {what}")))
    } else {
        Ok(left)
    }
}

/// The error a listing gives when its deadline passes between two `SCAN` pages.
pub(crate) fn listing_timed_out() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "listing the keys did not finish in time",
    ))
}

/// Milliseconds of a duration, at least 1 (Redis refuses `PX 0`).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// Sorts a client error into what the tier does about it.
pub(crate) fn classify(e: &redis::RedisError) -> RemoteError {
    let text = e.to_string();
    if e.is_timeout() {
        RemoteError::Timeout(text)
    } else if e.is_io_error() || e.is_connection_refusal() || e.is_connection_dropped() {
        RemoteError::Unreachable(text)
    } else if e.code() == Some("OOM") || text.contains("OOM") {
        RemoteError::Full(text)
    } else if e.code().is_some() {
        RemoteError::Refused(text)
    } else {
        RemoteError::Protocol(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server's error reply, as the client parses it off the wire.
    fn server_error(text: &str) -> redis::RedisError {
        match redis::parse_redis_value(format!("-{text}\r\n").as_bytes()) {
            Ok(redis::Value::ServerError(e)) => redis::RedisError::from(e),
            other => panic!("not an error reply: {other:?}"),
        }
    }

    #[test]
    fn one_foreign_value_fails_neither_its_neighbours_nor_the_batch() {
        let replies = vec![
            Ok(Some(b"v".to_vec())),
            Err(server_error(
                "WRONGTYPE Operation against a key holding the wrong kind of value",
            )),
            Ok(None),
        ];
        assert_eq!(
            values(replies, 3),
            Ok(vec![Some(b"v".to_vec()), Some(Vec::new()), None])
        );
    }

    #[test]
    fn a_full_server_fails_the_batch_and_a_short_batch_is_a_protocol_error() {
        let replies = vec![
            Ok(None),
            Err(server_error(
                "OOM command not allowed when used memory > 'maxmemory'",
            )),
        ];
        assert!(matches!(values(replies, 2), Err(RemoteError::Full(_))));
        assert!(matches!(
            values(vec![Ok(None)], 2),
            Err(RemoteError::Protocol(_))
        ));
        assert!(matches!(swapped(vec![1], 2), Err(RemoteError::Protocol(_))));
        assert_eq!(swapped(vec![1, 0], 2), Ok(vec![true, false]));
    }
}
