//! The byte store a shared tier sits on: [`Remote`], one compare-and-set ([`Swap`]), and how
//! a call failed ([`RemoteError`]).

use std::fmt;
use std::time::{Duration, Instant};

/// A shared store of byte values under string keys. Implementations must return (with
/// [`RemoteError::Timeout`] if need be) by the deadline, connecting included, and must not
/// panic on any reply.
pub trait Remote: Send + Sync + fmt::Debug {
    /// Where it is, for messages: never a password.
    fn describe(&self) -> String;

    /// The values of `keys`, in order, in one round trip, as `read` says: a value longer than
    /// its limit comes back cut to `limit + 1` bytes, the rest never crossing the network.
    fn get_many(
        &self,
        keys: &[String],
        read: Read,
        deadline: Instant,
    ) -> Result<Vec<Option<Vec<u8>>>, RemoteError>;

    /// For each swap, in one round trip: sets `value` (with `ttl`, if any) if the key still
    /// holds `expected` (`None`: the key is absent) and its [`Fence`], if any, lets it,
    /// atomically per key. Returns what each swap did.
    fn compare_and_set_many(
        &self,
        swaps: &[Swap<'_>],
        ttl: Option<Duration>,
        deadline: Instant,
    ) -> Result<Vec<Swapped>, RemoteError>;

    /// One round trip that changes nothing, to check the connection.
    fn ping(&self, deadline: Instant) -> Result<(), RemoteError>;

    /// The options a tier on this store starts from (before `TUNECACHE_REMOTE_*`): Redis
    /// answers in microseconds and has leases and times to live; an object store answers in
    /// milliseconds and has neither, so it says so here rather than failing at each call.
    fn default_options(&self) -> crate::RemoteOptions {
        crate::RemoteOptions::default()
    }

    /// How many keys of a batch one round trip covers: `None` for a store that answers a
    /// whole batch in one round trip (Redis pipelines it), `Some(n)` for one that answers a key
    /// a request, `n` requests at once (an object store). A batch's read budget grows with the
    /// rounds it takes (see [`crate::RemoteOptions::budget`]).
    fn keys_per_round(&self) -> Option<usize> {
        None
    }

    /// One lease operation on the lease key `key` (see [`crate::LeaseOp`]), atomic on the
    /// server, in one round trip. A backend without leases refuses.
    fn lease(
        &self,
        key: &str,
        op: crate::LeaseOp<'_>,
        deadline: Instant,
    ) -> Result<crate::LeaseReply, RemoteError> {
        let _ = (key, op, deadline);
        Err(RemoteError::Refused(
            "this shared store has no leases".to_owned(),
        ))
    }

    /// A lease operation and a read of the entry key `entry` (see [`Remote::get_many`]), on
    /// one cluster slot: in one round trip where the backend can pipeline them (the default
    /// takes two). The entry is `None` when absent.
    fn lease_and_read(
        &self,
        key: &str,
        op: crate::LeaseOp<'_>,
        entry: &str,
        read: Read,
        deadline: Instant,
    ) -> Result<(crate::LeaseReply, Option<Vec<u8>>), RemoteError> {
        let lease = self.lease(key, op, deadline)?;
        let value = self.get_many(&[entry.to_owned()], read, deadline)?;
        Ok((lease, value.into_iter().next().flatten()))
    }

    /// The keys matching `pattern` (a glob where only `*` is special), for tools that pull or
    /// count (`tunecache remote`); never on a cache's path. A backend that cannot list keys
    /// refuses.
    fn scan(&self, pattern: &str, deadline: Instant) -> Result<Vec<String>, RemoteError> {
        let _ = (pattern, deadline);
        Err(RemoteError::Refused(
            "this shared store cannot list its keys".to_owned(),
        ))
    }
}

/// How [`Remote::get_many`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    /// With `Some(ttl)`, each key found gets that time to live from now (a write: only in
    /// read-write mode).
    pub touch: Option<Duration>,
    /// The longest value wanted: one longer comes back as its first `limit + 1` bytes (so the
    /// caller sees it was too long), and the rest is never sent.
    pub limit: usize,
}

/// One compare-and-set of [`Remote::compare_and_set_many`].
#[derive(Debug, Clone, Copy)]
pub struct Swap<'a> {
    /// The key.
    pub key: &'a str,
    /// The value it must hold for the swap to happen (`None`: it must be absent).
    pub expected: Option<&'a [u8]>,
    /// The new value.
    pub value: &'a [u8],
    /// The lease this write is made under, if any.
    pub fence: Option<Fence<'a>>,
}

/// The lease a [`Swap`] is made under (FORMAT.md, "Leases"): the write happens only while the
/// lease key still holds the holder's value, or is absent (it expired) and the entry is still
/// what it was when the lease was taken (`unchanged`: nobody took the key over and published).
/// Otherwise the swap is [`Swapped::Fenced`]: a holder that lost its lease writes nothing.
#[derive(Debug, Clone, Copy)]
pub struct Fence<'a> {
    /// The lease key (on the entry's cluster slot).
    pub lease: &'a str,
    /// The holder's lease value.
    pub value: &'a [u8],
    /// Whether the swap's `expected` is the entry as it was when the lease was taken.
    pub unchanged: bool,
    /// Deletes the lease (if it still holds `value`) in the same step as the write: the
    /// holder's publication and its release in one round trip.
    pub release: bool,
}

/// What one [`Swap`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Swapped {
    /// The value was set.
    Set,
    /// The key no longer held `expected` (a lost race), or could not be written: nothing set.
    Changed,
    /// Its fence refused it (the lease was lost): nothing set, and not worth retrying.
    Fenced,
}

/// Why a call to the shared store failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemoteError {
    /// The deadline passed (a server that accepts but does not answer, a slow network).
    #[error("timed out: {0}")]
    Timeout(String),
    /// No connection could be made or it broke.
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// The server refuses writes because its memory is full.
    #[error("server full: {0}")]
    Full(String),
    /// The server refused the command (a missing bucket, a bad script).
    #[error("refused: {0}")]
    Refused(String),
    /// The store refuses this caller's writes (permissions, a read-only replica or bucket): a
    /// tier that meets it reads only from then on.
    #[error("denied: {0}")]
    Denied(String),
    /// A reply that does not fit the request.
    #[error("unexpected reply: {0}")]
    Protocol(String),
}

impl RemoteError {
    /// Whether this is an outage (the breaker opens) rather than a refusal.
    pub fn is_outage(&self) -> bool {
        matches!(self, RemoteError::Timeout(_) | RemoteError::Unreachable(_))
    }
}
