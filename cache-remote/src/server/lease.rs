//! The lease operations on Redis (FORMAT.md, "Leases"): one script, atomic on the server,
//! and its replies read as [`LeaseReply`]. Used by both backends.

use std::time::Duration;

use crate::lease::{LeaseOp, LeaseReply};
use crate::store::RemoteError;

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
        Some(redis::Value::ServerError(e)) => Err(super::classify_server_error(e)),
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
