//! The connection pool both Redis backends share: a call takes a pooled connection (or makes
//! one within the time left), sets the time left until its deadline as the socket timeouts,
//! and gives the connection back only if the call succeeded (a failed one is dropped: a
//! timed-out reply could still arrive on it). A pooled connection found dead (the server
//! restarted since) empties the pool, and the call runs once more on a fresh connection:
//! every command sent is safe to repeat (reads, and a compare-and-set that fails if the first
//! attempt did land).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::reply::{classify, left};
use crate::store::RemoteError;

/// Connections kept for reuse.
const POOL: usize = 8;

/// A connection whose socket timeouts can be set.
pub(crate) trait Timed {
    /// Sets `time` as the read and write timeouts.
    fn set_timeouts(&mut self, time: Duration) -> redis::RedisResult<()>;
}

impl Timed for redis::Connection {
    fn set_timeouts(&mut self, time: Duration) -> redis::RedisResult<()> {
        self.set_read_timeout(Some(time))?;
        self.set_write_timeout(Some(time))
    }
}

#[cfg(feature = "cluster")]
impl Timed for redis::cluster::ClusterConnection {
    fn set_timeouts(&mut self, time: Duration) -> redis::RedisResult<()> {
        self.set_read_timeout(Some(time))?;
        self.set_write_timeout(Some(time))
    }
}

/// Idle connections.
#[derive(Debug)]
pub(crate) struct Pool<C> {
    idle: Mutex<Vec<C>>,
}

impl<C> Default for Pool<C> {
    fn default() -> Self {
        Pool {
            idle: Mutex::new(Vec::new()),
        }
    }
}

impl<C> Pool<C> {
    /// Whether a connection is waiting to be reused.
    pub(crate) fn has_idle(&self) -> bool {
        !crate::lock(&self.idle).is_empty()
    }
}

impl<C: Timed> Pool<C> {
    /// Runs `f` within `deadline` on a pooled connection, or on one `connect` makes with the
    /// time left (see the module docs). `reads` is how many replies `f` may wait for with
    /// the socket timeout set here: a client that reads every reply of a pipeline even after
    /// one timed out (the cluster client) gets that share of the time left per read, so the
    /// call still ends by the deadline.
    pub(crate) fn run<T>(
        &self,
        deadline: Instant,
        reads: usize,
        connect: impl FnOnce(Duration) -> redis::RedisResult<C>,
        mut f: impl FnMut(&mut C) -> redis::RedisResult<T>,
    ) -> Result<T, RemoteError> {
        let pooled = crate::lock(&self.idle).pop();
        if let Some(conn) = pooled {
            match self.run_on(conn, deadline, reads, &mut f) {
                Err(RemoteError::Unreachable(_)) => crate::lock(&self.idle).clear(),
                other => return other,
            }
        }
        let conn = connect(left(deadline, "connect")?).map_err(|e| classify(&e))?;
        self.run_on(conn, deadline, reads, &mut f)
    }

    fn run_on<T>(
        &self,
        mut conn: C,
        deadline: Instant,
        reads: usize,
        f: &mut impl FnMut(&mut C) -> redis::RedisResult<T>,
    ) -> Result<T, RemoteError> {
        let time = left(deadline, "send the command")?;
        let share = u32::try_from(reads.max(1)).unwrap_or(u32::MAX);
        let per_read = (time / share).max(Duration::from_millis(1));
        conn.set_timeouts(per_read).map_err(|e| classify(&e))?;
        let result = f(&mut conn).map_err(|e| classify(&e));
        if result.is_ok() {
            let mut idle = crate::lock(&self.idle);
            if idle.len() < POOL {
                idle.push(conn);
            }
        }
        result
    }
}
