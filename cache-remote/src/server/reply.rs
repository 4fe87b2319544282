//! What both Redis backends (single server, cluster) send and how they read the replies, so
//! they cannot drift: the commands of a read and of a compare-and-set, the one policy for a
//! batch's replies, and how a client error is sorted.

use std::time::{Duration, Instant};

use crate::store::{Read, RemoteError};

/// Compare-and-set of one key: ARGV = has-expected (`1`/`0`), expected, new value, time to
/// live in ms (`0`: none). Returns 1 if it set the value, 0 if the key held something else.
/// With a second key (a [`crate::Fence`]'s lease, on the same cluster slot), ARGV 5 to 7 are
/// the holder's lease value, `unchanged` and `release` (`1`/`0`): the write happens only if
/// the lease holds that value, or is absent with `unchanged`; otherwise it returns 2
/// (fenced). With `release`, the lease is deleted in the same step. A lease key of another
/// type is someone else's: fenced, never touched. Lua strings are binary-safe.
pub(crate) const CAS_SCRIPT: &str = r"
local fenced = #KEYS == 2
if fenced then
  local t = redis.call('TYPE', KEYS[2])['ok']
  if t ~= 'none' and t ~= 'string' then return 2 end
  local l = redis.call('GET', KEYS[2])
  if l == false then
    if ARGV[6] ~= '1' then return 2 end
  elseif l ~= ARGV[5] then
    return 2
  end
end
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
if fenced and ARGV[7] == '1' and redis.call('GET', KEYS[2]) == ARGV[5] then
  redis.call('DEL', KEYS[2])
end
return 1
";

/// The commands that read one key: whether it exists (`EXISTS`,
/// or `PEXPIRE` to refresh its time to live, which says the same), then its first
/// `limit + 1` bytes (`GETRANGE`): a value too long to be used never crosses the network
/// whole.
pub(crate) fn read_commands(key: &str, read: Read) -> [redis::Cmd; 2] {
    let first = match read.touch {
        Some(ttl) => {
            let mut cmd = redis::cmd("PEXPIRE");
            cmd.arg(key).arg(millis(ttl));
            cmd
        }
        None => {
            let mut cmd = redis::cmd("EXISTS");
            cmd.arg(key);
            cmd
        }
    };
    let mut range = redis::cmd("GETRANGE");
    range.arg(key).arg(0).arg(read.limit);
    [first, range]
}

/// The compare-and-set of one swap (see [`CAS_SCRIPT`]); `ttl` in ms, 0 for none.
pub(crate) fn swap_command(swap: &crate::Swap<'_>, ttl: u64) -> redis::Cmd {
    let flag = |b: bool| if b { "1" } else { "0" };
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(CAS_SCRIPT);
    match &swap.fence {
        Some(fence) => cmd.arg(2).arg(swap.key).arg(fence.lease),
        None => cmd.arg(1).arg(swap.key),
    };
    cmd.arg(flag(swap.expected.is_some()))
        .arg(swap.expected.unwrap_or_default())
        .arg(swap.value)
        .arg(ttl);
    if let Some(fence) = &swap.fence {
        cmd.arg(fence.value)
            .arg(flag(fence.unchanged))
            .arg(flag(fence.release));
    }
    cmd
}

/// What one group of a pipeline (one key's commands) got: its replies, or the server error
/// that failed one of them.
pub(crate) type Group = Result<Vec<redis::Value>, redis::RedisError>;

/// Runs a pipeline of `groups` groups of `size` commands each (one group per key) and returns
/// each group's replies, by both backends alike. `query(groups)` runs the pipeline of the
/// given groups and returns every reply in order; a server's error for one command comes
/// back either as that reply (`Value::ServerError`: the single server, read reply by reply)
/// or as a pipeline error naming the failed commands (the cluster client): then the groups it
/// names are left out and the others asked again, once. So a key holding someone else's
/// value of another type costs at most a round trip, never the batch.
pub(crate) fn per_group(
    groups: usize,
    size: usize,
    mut query: impl FnMut(&[usize]) -> redis::RedisResult<Vec<redis::Value>>,
) -> redis::RedisResult<Vec<Group>> {
    let all: Vec<usize> = (0..groups).collect();
    let (asked, replies, mut failed) = match query(&all) {
        Ok(replies) => (all, replies, Vec::new()),
        Err(e) => match e.clone().into_server_errors() {
            Some(errors) => {
                let failed: Vec<(usize, redis::ServerError)> = errors
                    .iter()
                    .map(|(at, err)| (at / size, err.clone()))
                    .collect();
                let rest: Vec<usize> = all
                    .into_iter()
                    .filter(|g| failed.iter().all(|(at, _)| at != g))
                    .collect();
                let replies = if rest.is_empty() {
                    Vec::new()
                } else {
                    query(&rest)?
                };
                (rest, replies, failed)
            }
            None => return Err(e),
        },
    };
    if replies.len() != asked.len() * size {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "short reply",
            format!(
                "{} replies to {} commands",
                replies.len(),
                asked.len() * size
            ),
        )));
    }
    let mut out: Vec<Group> = (0..groups).map(|_| Ok(Vec::new())).collect();
    for (g, chunk) in asked.iter().zip(replies.chunks(size)) {
        out[*g] = match chunk.iter().find_map(|v| match v {
            redis::Value::ServerError(e) => Some(e.clone()),
            _ => None,
        }) {
            Some(e) => Err(redis::RedisError::from(e)),
            None => Ok(chunk.to_vec()),
        };
    }
    for (g, e) in failed.drain(..) {
        out[g] = Err(redis::RedisError::from(e));
    }
    Ok(out)
}

/// A read group's value: absent (the first reply `0`) is no value, whatever the range said.
pub(crate) fn read_value(group: Group) -> redis::RedisResult<Option<Vec<u8>>> {
    let replies = group?;
    let value = |i: usize| replies.get(i).cloned().unwrap_or(redis::Value::Nil);
    let exists: i64 = redis::from_redis_value(value(0)).map_err(redis::RedisError::from)?;
    let bytes: Option<Vec<u8>> =
        redis::from_redis_value(value(1)).map_err(redis::RedisError::from)?;
    Ok((exists > 0).then(|| bytes.unwrap_or_default()))
}

/// One reply of a batch of reads.
pub(crate) type ReadReply = redis::RedisResult<Option<Vec<u8>>>;

/// The values of a batch of `asked` reads from their replies, one per key: an error for one
/// key (a value of another type someone put there: `WRONGTYPE`) reads as an empty value,
/// which every check refuses (and publishing leaves alone), so it fails neither the other
/// keys nor the batch; a full server (refusing a write for every key alike) fails the batch.
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
                // Refused for every key alike: the batch fails (a full server; a replica or
                // an account that may not write).
                all @ (RemoteError::Full(_) | RemoteError::Denied(_)) => return Err(all),
                _ => out.push(Some(Vec::new())),
            },
        }
    }
    Ok(out)
}

/// Whether each swap was made, from each group's answer: a swap its server refused (a value
/// of another type at the key) was not made; a full server fails the batch.
pub(crate) fn swapped(
    groups: Vec<Group>,
    asked: usize,
) -> Result<Vec<crate::Swapped>, RemoteError> {
    if groups.len() != asked {
        return Err(RemoteError::Protocol(format!(
            "{} replies to {asked} writes",
            groups.len()
        )));
    }
    let mut out = Vec::with_capacity(asked);
    for group in groups {
        let done = group.and_then(|replies| {
            redis::from_redis_value::<i64>(replies.first().cloned().unwrap_or(redis::Value::Nil))
                .map_err(redis::RedisError::from)
        });
        match done {
            Ok(1) => out.push(crate::Swapped::Set),
            Ok(2) => out.push(crate::Swapped::Fenced),
            Ok(_) => out.push(crate::Swapped::Changed),
            Err(e) => match classify(&e) {
                // Refused for every key alike: the batch fails (a full server; a replica or
                // an account that may not write).
                all @ (RemoteError::Full(_) | RemoteError::Denied(_)) => return Err(all),
                _ => out.push(crate::Swapped::Changed),
            },
        }
    }
    Ok(out)
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

/// Sorts a client error into what the tier does about it. A pipeline's errors are said once,
/// with how many commands failed, not once per command: a full server refusing 2,000 writes
/// makes one short message.
pub(crate) fn classify(e: &redis::RedisError) -> RemoteError {
    let text = match e.clone().into_server_errors() {
        Some(errors) if !errors.is_empty() => {
            let first = &errors[0].1;
            let text = format!("{} {}", first.code(), first.details().unwrap_or_default());
            match errors.len() {
                1 => text.trim().to_owned(),
                n => format!("{n} commands failed, the first with: {}", text.trim()),
            }
        }
        _ => e.to_string(),
    };
    let oom = e.code() == Some("OOM") || text.contains("OOM");
    if e.is_timeout() {
        RemoteError::Timeout(text)
    } else if e.is_io_error() || e.is_connection_refusal() || e.is_connection_dropped() {
        RemoteError::Unreachable(text)
    } else if oom {
        RemoteError::Full(text)
    } else if ["READONLY", "NOPERM"]
        .iter()
        .any(|c| e.code() == Some(c) || text.starts_with(c))
    {
        RemoteError::Denied(text)
    } else if e.code().is_some() || e.clone().into_server_errors().is_some() {
        RemoteError::Refused(text)
    } else {
        RemoteError::Protocol(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Swapped;

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
    fn a_pipeline_of_failures_is_said_once_with_how_many() {
        // A pipeline error as the client makes one: the failures of 2,000 commands.
        let replies = (0..2000)
            .map(|_| {
                Err(server_error(
                    "OOM command not allowed when used memory > 'maxmemory'.",
                ))
            })
            .collect::<Vec<ReadReply>>();
        let e = values(replies, 2000).expect_err("full");
        assert!(matches!(e, RemoteError::Full(_)));
        assert!(e.to_string().len() < 200, "{e}");
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
        let done = |d: i64| Ok(vec![redis::Value::Int(d)]);
        assert!(matches!(
            swapped(vec![done(1)], 2),
            Err(RemoteError::Protocol(_))
        ));
        let refused = Err(server_error(
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ));
        assert_eq!(
            swapped(vec![done(1), done(0), done(2), refused], 4),
            Ok(vec![
                Swapped::Set,
                Swapped::Changed,
                Swapped::Fenced,
                Swapped::Changed
            ])
        );
    }
}
