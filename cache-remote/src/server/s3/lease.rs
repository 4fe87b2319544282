//! Fleet leases on a bucket (FORMAT.md, "Leases on S3"). A lease is an object beside its
//! entry's, `tcs3lease1 <ttl ms>\n<lease value>`: created only if absent (`If-None-Match: *`);
//! renewed, taken over and released only by a compare-and-swap on the ETag just read
//! (`If-Match`), so two takers never both win. Releasing writes `tcs3lease1 released\n` (a
//! conditional write: a DELETE cannot be made conditional on every S3-compatible store).
//!
//! Expiry is read on the store's clock alone: the object's `Last-Modified` against the reply's
//! `Date`, both whole seconds. A lease is expired only once that age reaches `ttl + 1 s`, and
//! its holder counts at most `ttl - age - 1 s` left from before its read, so a holder's window
//! ends before any taker's begins whatever the machines' clocks say.
//!
//! A publication under a lease (a [`Fence`]) reads the lease first and writes the entry only
//! while the lease is this holder's, with a deadline that ends before the lease could expire
//! (renewing it first when little is left); with the lease gone, only if the entry is still as
//! it was when the lease was taken (the entry's own compare-and-swap checks that). That is two
//! steps where Redis has one script; what closes the gap is time, not atomicity: a write the
//! store applies after its client gave up on it could land past the lease (ARCHITECTURE.md).

use std::time::{Duration, Instant};

use super::S3Remote;
use crate::lease::{LeaseOp, LeaseReply};
use crate::store::{Fence, RemoteError, Swap, Swapped};

/// The first word of a lease object.
const MAGIC: &str = "tcs3lease1";

/// A released lease.
const RELEASED: &[u8] = b"tcs3lease1 released\n";

/// The most of a lease object read (a lease value is under 200 bytes).
const MAX_LEASE_BYTES: u64 = 4096;

/// Compare-and-swap rounds one lease operation makes before it answers with what it read.
const ROUNDS: usize = 4;

/// A fenced write goes ahead on a lease with at least this long left; a shorter one is
/// renewed first.
const FENCE_LEFT: Duration = Duration::from_millis(500);

/// A lease object as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Found {
    /// No object.
    Absent,
    /// Released, or expired whoever held it: taken by compare-and-swap.
    Free,
    /// Held by `value`, for at most `left` more; written with `ttl`.
    Held {
        value: Vec<u8>,
        left: Duration,
        ttl: Duration,
    },
    /// An object in another form: someone else's, never written.
    Foreign(String),
}

/// What a lease operation does about what it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Writes this body if the object is still absent.
    Create(Vec<u8>),
    /// Writes this body if the object is still the one read.
    Replace(Vec<u8>),
    /// Answers without writing.
    Answer(LeaseReply),
}

/// The body of a lease held by `value` for `ttl`.
pub(crate) fn body(value: &[u8], ttl: Duration) -> Vec<u8> {
    let mut out = format!("{MAGIC} {}\n", ttl.as_millis().max(1)).into_bytes();
    out.extend_from_slice(value);
    out
}

/// What the lease object `bytes` is, `age` whole seconds after it was written (the store's
/// clock; `None` if it gave no dates: then never expired, since nothing says it is).
pub(crate) fn read(bytes: &[u8], age: Option<u64>) -> Found {
    if bytes == RELEASED {
        return Found::Free;
    }
    let foreign = || Found::Foreign("an object that is not a tunecache lease".to_owned());
    let Some(newline) = bytes.iter().position(|&b| b == b'\n') else {
        return foreign();
    };
    let head = String::from_utf8_lossy(&bytes[..newline]);
    let Some(ms) = head
        .strip_prefix(MAGIC)
        .and_then(|rest| rest.strip_prefix(' '))
        .and_then(|ms| ms.parse::<u64>().ok())
        .filter(|ms| *ms > 0)
    else {
        return foreign();
    };
    let ttl = Duration::from_millis(ms);
    let value = bytes[newline + 1..].to_vec();
    let Some(age) = age else {
        return Found::Held {
            value,
            left: ttl,
            ttl,
        };
    };
    let age = Duration::from_secs(age);
    if age >= ttl + Duration::from_secs(1) {
        return Found::Free;
    }
    let left = ttl.saturating_sub(age + Duration::from_secs(1));
    Found::Held { value, left, ttl }
}

/// What `op` does on a lease object found as `found`.
pub(crate) fn decide(op: &LeaseOp<'_>, found: &Found) -> Step {
    let mine = |v: &[u8]| matches!(found, Found::Held { value, .. } if value == v);
    match *op {
        LeaseOp::Acquire { value, ttl } => match found {
            Found::Absent => Step::Create(body(value, ttl)),
            Found::Free => Step::Replace(body(value, ttl)),
            _ if mine(value) => Step::Replace(body(value, ttl)),
            _ => Step::Answer(peek(found)),
        },
        LeaseOp::Renew { value, ttl } if mine(value) => Step::Replace(body(value, ttl)),
        LeaseOp::Release { value } if mine(value) => Step::Replace(RELEASED.to_vec()),
        LeaseOp::Renew { .. } | LeaseOp::Release { .. } | LeaseOp::Peek => {
            Step::Answer(peek(found))
        }
    }
}

/// What a look at `found` answers.
fn peek(found: &Found) -> LeaseReply {
    match found {
        Found::Absent | Found::Free => LeaseReply::Absent,
        Found::Held { value, left, .. } => LeaseReply::Held {
            value: value.clone(),
            ttl: Some(*left),
        },
        Found::Foreign(what) => LeaseReply::Foreign(what.clone()),
    }
}

impl S3Remote {
    /// The lease object `object` as found, and its ETag.
    fn read_lease(
        &self,
        object: &str,
        deadline: Instant,
    ) -> Result<(Found, Option<String>), RemoteError> {
        Ok(match self.objects.get(object, MAX_LEASE_BYTES, deadline)? {
            None => (Found::Absent, None),
            Some(f) => (read(&f.bytes, f.age), f.etag),
        })
    }

    /// A conditional write of a lease object: create-only, or over the ETag read.
    fn write_lease(
        &self,
        object: &str,
        step_body: &[u8],
        etag: Option<&str>,
        create: bool,
        deadline: Instant,
    ) -> Result<(Swapped, Option<String>), RemoteError> {
        match (create, etag) {
            (true, _) => self.objects.put(object, step_body, None, deadline),
            (false, Some(etag)) => self.objects.put(object, step_body, Some(etag), deadline),
            (false, None) => Err(RemoteError::Protocol(
                "a lease read gave no ETag to write over".to_owned(),
            )),
        }
    }

    /// One lease operation (see [`crate::Remote::lease`]): read, decide, write
    /// conditionally; a lost race reads again, up to [`ROUNDS`] times.
    pub(super) fn lease_op(
        &self,
        key: &str,
        op: LeaseOp<'_>,
        deadline: Instant,
    ) -> Result<LeaseReply, RemoteError> {
        let object = self.object(key);
        let mut last = Found::Absent;
        for _ in 0..ROUNDS {
            let (found, etag) = self.read_lease(&object, deadline)?;
            let (bytes, create) = match decide(&op, &found) {
                Step::Answer(reply) => return Ok(reply),
                Step::Create(bytes) => (bytes, true),
                Step::Replace(bytes) => (bytes, false),
            };
            let (swapped, _) =
                self.write_lease(&object, &bytes, etag.as_deref(), create, deadline)?;
            if swapped == Swapped::Set {
                return Ok(LeaseReply::Done);
            }
            last = found;
        }
        // Contended all along: say what was last seen.
        Ok(peek(&last))
    }

    /// A compare-and-swap under `fence` (see the module's documentation).
    pub(super) fn fenced_swap(
        &self,
        swap: &Swap<'_>,
        fence: &Fence<'_>,
        deadline: Instant,
    ) -> Result<Swapped, RemoteError> {
        let object = self.object(fence.lease);
        let before = Instant::now();
        let (found, etag) = self.read_lease(&object, deadline)?;
        let (held_etag, until) = match found {
            Found::Held { value, left, ttl } if value == fence.value => {
                if left >= FENCE_LEFT {
                    (etag, before + left)
                } else {
                    let before = Instant::now();
                    let body = body(fence.value, ttl);
                    match self.write_lease(&object, &body, etag.as_deref(), false, deadline)? {
                        (Swapped::Set, etag) => (etag, before + ttl),
                        // Changed meanwhile: the next round reads it again.
                        _ => return Ok(Swapped::Changed),
                    }
                }
            }
            // Lost to expiry, nobody took it: the entry's own swap checks it is unchanged.
            Found::Absent | Found::Free if fence.unchanged => (None, deadline),
            _ => return Ok(Swapped::Fenced),
        };
        let swapped = match self.plain_swap(swap, deadline.min(until)) {
            // The lease's window closed first: the next round reads the lease again.
            Err(RemoteError::Timeout(_)) if until < deadline && Instant::now() >= until => {
                return Ok(Swapped::Changed);
            }
            other => other?,
        };
        if swapped == Swapped::Set
            && fence.release
            && let Some(etag) = held_etag
        {
            // Released after the write; a failure here leaves it to expire.
            let _ = self.write_lease(&object, RELEASED, Some(&etag), false, deadline);
        }
        Ok(swapped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(10);

    fn held(value: &[u8], left: u64) -> Found {
        Found::Held {
            value: value.to_vec(),
            left: Duration::from_secs(left),
            ttl: TTL,
        }
    }

    #[test]
    fn a_lease_object_is_read_on_the_stores_clock_alone() {
        let b = body(b"tclease1 ab pid=1 host=x", TTL);
        assert_eq!(b, b"tcs3lease1 10000\ntclease1 ab pid=1 host=x");
        assert_eq!(read(&b, Some(0)), held(b"tclease1 ab pid=1 host=x", 9));
        assert_eq!(read(&b, Some(8)), held(b"tclease1 ab pid=1 host=x", 1));
        // Nine to ten seconds old: nothing left to its holder, not yet free to a taker.
        assert_eq!(read(&b, Some(9)), held(b"tclease1 ab pid=1 host=x", 0));
        assert_eq!(read(&b, Some(10)), held(b"tclease1 ab pid=1 host=x", 0));
        assert_eq!(read(&b, Some(11)), Found::Free);
        // No dates: never taken as expired.
        assert_eq!(
            read(&b, None),
            Found::Held {
                value: b"tclease1 ab pid=1 host=x".to_vec(),
                left: TTL,
                ttl: TTL
            }
        );
        assert_eq!(read(RELEASED, Some(0)), Found::Free);
        for foreign in [
            &b""[..],
            b"locked by cron",
            b"tcs3lease1 0\nv",
            b"tcs3lease1 -5\nv",
            b"tcs3lease10 100\nv",
            b"tcs3lease1 soon\nv",
        ] {
            assert!(
                matches!(read(foreign, Some(0)), Found::Foreign(_)),
                "{foreign:?}"
            );
        }
    }

    #[test]
    fn each_operation_writes_only_what_it_may() {
        let (mine, theirs) = (&b"mine"[..], &b"theirs"[..]);
        let acquire = LeaseOp::Acquire {
            value: mine,
            ttl: TTL,
        };
        let renew = LeaseOp::Renew {
            value: mine,
            ttl: TTL,
        };
        let release = LeaseOp::Release { value: mine };
        let foreign = Found::Foreign("x".into());
        let held_by_them = LeaseReply::Held {
            value: theirs.to_vec(),
            ttl: Some(Duration::from_secs(4)),
        };
        assert_eq!(
            decide(&acquire, &Found::Absent),
            Step::Create(body(mine, TTL))
        );
        assert_eq!(
            decide(&acquire, &Found::Free),
            Step::Replace(body(mine, TTL))
        );
        assert_eq!(
            decide(&acquire, &held(mine, 2)),
            Step::Replace(body(mine, TTL))
        );
        assert_eq!(
            decide(&acquire, &held(theirs, 4)),
            Step::Answer(held_by_them.clone())
        );
        assert_eq!(
            decide(&acquire, &foreign),
            Step::Answer(LeaseReply::Foreign("x".into()))
        );
        assert_eq!(
            decide(&renew, &held(mine, 1)),
            Step::Replace(body(mine, TTL))
        );
        for lost in [Found::Absent, Found::Free] {
            assert_eq!(decide(&renew, &lost), Step::Answer(LeaseReply::Absent));
            assert_eq!(decide(&release, &lost), Step::Answer(LeaseReply::Absent));
            assert_eq!(
                decide(&LeaseOp::Peek, &lost),
                Step::Answer(LeaseReply::Absent)
            );
        }
        assert_eq!(
            decide(&renew, &held(theirs, 4)),
            Step::Answer(held_by_them.clone())
        );
        assert_eq!(
            decide(&release, &held(mine, 3)),
            Step::Replace(RELEASED.to_vec())
        );
        assert_eq!(
            decide(&release, &held(theirs, 4)),
            Step::Answer(held_by_them.clone())
        );
        assert_eq!(
            decide(&release, &foreign),
            Step::Answer(LeaseReply::Foreign("x".into()))
        );
        assert_eq!(
            decide(&LeaseOp::Peek, &held(theirs, 4)),
            Step::Answer(held_by_them)
        );
    }
}
