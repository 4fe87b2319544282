//! The shared tier of tunecache on Redis: [`RedisRemote`] implements
//! [`cache_core::Remote`] with the `redis` crate's synchronous client (no async runtime).
//!
//! Every call is bounded by its deadline, connecting included: the connection is made with
//! the remaining time as its timeout, the library-name handshake (`CLIENT SETINFO`, a second
//! round trip that could cost a second timeout) is skipped, and each command gets the
//! remaining time as its socket read and write timeout. Connections are pooled; one that
//! failed is dropped, never reused (a timed-out reply could still arrive on it).
//!
//! Only single-key commands are used, so the layout works on Redis Cluster (no `CROSSSLOT`):
//! reads are one pipeline of `GET` (or `GETEX … PX` to refresh the time to live in
//! read-write mode), writes one pipeline of a single-key compare-and-set script. What is
//! stored, and the checks a read value must pass, are cache-core's (FORMAT.md, "Shared
//! tier").
//!
//! ```no_run
//! use std::sync::Arc;
//! # fn f(registry: cache_core::cache_migrate::Migrations) -> Result<(), String> {
//! let remote = cache_remote::RedisRemote::open("redis://cache.internal:6379/0")?;
//! let cache = cache_core::Cache::builder(registry).remote(Arc::new(remote)).open();
//! # Ok(()) }
//! ```

use std::sync::{Arc, Mutex};

#[cfg(feature = "cluster")]
mod cluster;
#[cfg(feature = "cluster")]
pub use cluster::RedisClusterRemote;
use std::time::{Duration, Instant};

use cache_core::{CacheBuilder, Remote, RemoteError, Swap};
use redis::IntoConnectionInfo;

/// The environment variable that names the server: `redis://[user:password@]host:port/db`,
/// `rediss://…` (TLS, with the `tls` feature) or `redis+unix:///path/to/socket`.
pub const ENV_REMOTE: &str = "TUNECACHE_REMOTE";

/// A PEM file of the certificate authorities to trust for `rediss://` (instead of the
/// system's), e.g. a private CA.
pub const ENV_REMOTE_CA: &str = "TUNECACHE_REMOTE_CA";

/// Connections kept for reuse.
pub(crate) const POOL: usize = 8;

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

/// A Redis server as a [`Remote`].
pub struct RedisRemote {
    client: redis::Client,
    describe: String,
    pool: Mutex<Vec<redis::Connection>>,
}

impl std::fmt::Debug for RedisRemote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisRemote")
            .field("server", &self.describe)
            .finish()
    }
}

impl RedisRemote {
    /// A client for the server at `url`; checks the address but does not connect (the first
    /// call does, within its deadline). The error never contains the password.
    pub fn open(url: &str) -> Result<Self, String> {
        let describe = redact(url);
        let tls = url
            .trim_start()
            .to_ascii_lowercase()
            .starts_with("rediss://");
        if tls && !cfg!(feature = "tls") {
            return Err(format!(
                "{ENV_REMOTE}: {describe} needs TLS, and this build has none (cache-remote's `tls` feature)"
            ));
        }
        let info = url.into_connection_info().map_err(|e| {
            format!(
                "{ENV_REMOTE}: cannot use {describe} ({:?}): expected redis://[USER:PASSWORD@]HOST:PORT/DB, rediss://… (TLS) or redis+unix:///PATH",
                e.kind()
            )
        })?;
        let settings = info.redis_settings().clone().set_skip_set_lib_name();
        let info = info.set_redis_settings(settings);
        let client = if tls {
            tls_client(info, &describe)?
        } else {
            redis::Client::open(info)
                .map_err(|e| format!("{ENV_REMOTE}: cannot use {describe}: {:?}", e.kind()))?
        };
        Ok(RedisRemote {
            client,
            describe,
            pool: Mutex::new(Vec::new()),
        })
    }

    /// The server named by `TUNECACHE_REMOTE`, if it is set and not empty.
    pub fn from_env() -> Result<Option<Self>, String> {
        match std::env::var(ENV_REMOTE) {
            Ok(url) if !url.trim().is_empty() => Self::open(url.trim()).map(Some),
            _ => Ok(None),
        }
    }

    fn pool(&self) -> std::sync::MutexGuard<'_, Vec<redis::Connection>> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on a pooled (or new) connection with the time left until `deadline` as its
    /// socket timeouts. A pooled connection that turns out dead (the server restarted since)
    /// is dropped with the rest of the pool, and `f` runs once more on a fresh one: every
    /// command sent here is safe to repeat (reads, and a compare-and-set that fails if the
    /// first attempt did land).
    fn run<T>(
        &self,
        deadline: Instant,
        mut f: impl FnMut(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T, RemoteError> {
        let pooled = self.pool().pop();
        if let Some(conn) = pooled {
            match self.run_on(conn, deadline, &mut f) {
                Err(RemoteError::Unreachable(_)) => self.pool().clear(),
                other => return other,
            }
        }
        let conn = self
            .client
            .get_connection_with_timeout(left(deadline, "connect")?)
            .map_err(|e| classify(&e))?;
        self.run_on(conn, deadline, &mut f)
    }

    fn run_on<T>(
        &self,
        mut conn: redis::Connection,
        deadline: Instant,
        f: &mut impl FnMut(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T, RemoteError> {
        let time = left(deadline, "send the command")?;
        conn.set_read_timeout(Some(time))
            .and_then(|()| conn.set_write_timeout(Some(time)))
            .map_err(|e| classify(&e))?;
        let result = f(&mut conn).map_err(|e| classify(&e));
        if result.is_ok() {
            let mut pool = self.pool();
            if pool.len() < POOL {
                pool.push(conn);
            }
        }
        result
    }

    /// Runs `INFO section` and returns its text (for `tunecache remote stats`).
    pub fn info(&self, section: &str, deadline: Instant) -> Result<String, RemoteError> {
        self.run(deadline, |c| redis::cmd("INFO").arg(section).query(c))
    }
}

impl Remote for RedisRemote {
    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn get_many(
        &self,
        keys: &[String],
        touch: Option<Duration>,
        deadline: Instant,
    ) -> Result<Vec<Option<Vec<u8>>>, RemoteError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        // Errors are taken per key, so one key of another type (a value someone else put
        // there) does not fail the others.
        let replies: Vec<redis::RedisResult<Option<Vec<u8>>>> = self.run(deadline, |c| {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for key in keys {
                match touch {
                    Some(ttl) => pipe.cmd("GETEX").arg(key).arg("PX").arg(millis(ttl)),
                    None => pipe.cmd("GET").arg(key),
                };
            }
            pipe.query(c)
        })?;
        let mut values = Vec::with_capacity(replies.len());
        for reply in replies {
            match reply {
                Ok(v) => values.push(v),
                // A full server refuses GETEX (a write) for every key alike.
                Err(e) if matches!(classify(&e), RemoteError::Full(_)) => return Err(classify(&e)),
                // Not a string (WRONGTYPE): an empty value, which the checks refuse.
                Err(_) => values.push(Some(Vec::new())),
            }
        }
        if values.len() != keys.len() {
            return Err(RemoteError::Protocol(format!(
                "{} replies to {} reads",
                values.len(),
                keys.len()
            )));
        }
        Ok(values)
    }

    fn compare_and_set_many(
        &self,
        swaps: &[Swap<'_>],
        ttl: Option<Duration>,
        deadline: Instant,
    ) -> Result<Vec<bool>, RemoteError> {
        if swaps.is_empty() {
            return Ok(Vec::new());
        }
        let ttl = ttl.map_or(0, millis);
        let done: Vec<i64> = self.run(deadline, |c| {
            let mut pipe = redis::pipe();
            for s in swaps {
                pipe.cmd("EVAL")
                    .arg(CAS_SCRIPT)
                    .arg(1)
                    .arg(s.key)
                    .arg(if s.expected.is_some() { "1" } else { "0" })
                    .arg(s.expected.unwrap_or_default())
                    .arg(s.value)
                    .arg(ttl);
            }
            pipe.query(c)
        })?;
        if done.len() != swaps.len() {
            return Err(RemoteError::Protocol(format!(
                "{} replies to {} writes",
                done.len(),
                swaps.len()
            )));
        }
        Ok(done.into_iter().map(|d| d == 1).collect())
    }

    fn scan(&self, pattern: &str, deadline: Instant) -> Result<Vec<String>, RemoteError> {
        self.run(deadline, |c| {
            let mut cursor: u64 = 0;
            let mut keys = Vec::new();
            loop {
                let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .query(c)?;
                keys.extend(batch);
                cursor = next;
                if cursor == 0 {
                    return Ok(keys);
                }
                if Instant::now() >= deadline {
                    return Err(redis::RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "listing the keys did not finish in time",
                    )));
                }
            }
        })
    }

    fn ping(&self, deadline: Instant) -> Result<(), RemoteError> {
        let pong: String = self.run(deadline, |c| redis::cmd("PING").query(c))?;
        if pong == "PONG" {
            Ok(())
        } else {
            Err(RemoteError::Protocol(format!("PING answered {pong:?}")))
        }
    }
}

/// A client for `rediss://`: rustls with the ring provider, trusting the system's
/// certificate authorities or those of the PEM file `TUNECACHE_REMOTE_CA`.
#[cfg(feature = "tls")]
fn tls_client(info: redis::ConnectionInfo, describe: &str) -> Result<redis::Client, String> {
    // The process-wide provider, if the program has not chosen one (then its choice stands).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let root_cert = match std::env::var_os(ENV_REMOTE_CA) {
        Some(path) => Some(std::fs::read(&path).map_err(|e| {
            format!(
                "{ENV_REMOTE_CA}: cannot read {}: {e}",
                std::path::Path::new(&path).display()
            )
        })?),
        None => None,
    };
    redis::Client::build_with_tls(
        info,
        redis::TlsCertificates {
            client_tls: None,
            root_cert,
        },
    )
    .map_err(|e| format!("{ENV_REMOTE}: cannot use {describe} over TLS: {e}"))
}

#[cfg(not(feature = "tls"))]
fn tls_client(_: redis::ConnectionInfo, describe: &str) -> Result<redis::Client, String> {
    Err(format!(
        "{ENV_REMOTE}: {describe} needs TLS, and this build has none"
    ))
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

/// The address without its password: `redis://user:***@host:6379/0`, and `pass=***` in a
/// query string.
pub fn redact(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((s, r)) => (s, r),
        None => return "(not a URL)".to_owned(),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None => format!("***@{host}"),
        },
        None => authority.to_owned(),
    };
    let path = match path.split_once('?') {
        Some((p, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _))
                        if k.eq_ignore_ascii_case("pass") || k.eq_ignore_ascii_case("password") =>
                    {
                        format!("{k}=***")
                    }
                    _ => kv.to_owned(),
                })
                .collect();
            format!("{p}?{}", query.join("&"))
        }
        None => path.to_owned(),
    };
    format!("{scheme}://{authority}{path}")
}

/// Extends a [`CacheBuilder`] with the server named by `TUNECACHE_REMOTE`.
pub trait RemoteFromEnv: Sized {
    /// Gives the builder the server named by `TUNECACHE_REMOTE`, if set. A value that is not
    /// a usable address is an error naming the variable (the password left out).
    fn remote_from_env(self) -> Result<Self, String>;
}

impl RemoteFromEnv for CacheBuilder {
    fn remote_from_env(self) -> Result<Self, String> {
        Ok(match from_env()? {
            Some(remote) => self.remote(remote),
            None => self,
        })
    }
}

/// The shared store at `address`: one server (`redis://…`, `rediss://…`,
/// `redis+unix://…`), or a Redis Cluster given as some of its nodes separated by commas
/// (the `cluster` feature).
pub fn connect(address: &str) -> Result<Arc<dyn Remote>, String> {
    let nodes: Vec<&str> = address
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect();
    if nodes.len() > 1 {
        return cluster(&nodes);
    }
    Ok(Arc::new(RedisRemote::open(address.trim())?))
}

#[cfg(feature = "cluster")]
fn cluster(nodes: &[&str]) -> Result<Arc<dyn Remote>, String> {
    Ok(Arc::new(RedisClusterRemote::open(nodes)?))
}

#[cfg(not(feature = "cluster"))]
fn cluster(nodes: &[&str]) -> Result<Arc<dyn Remote>, String> {
    let describe = nodes
        .iter()
        .map(|u| redact(u))
        .collect::<Vec<_>>()
        .join(",");
    Err(format!(
        "{ENV_REMOTE}: {describe} lists several nodes (a Redis Cluster), and this build has no cluster support (cache-remote's `cluster` feature)"
    ))
}

/// The shared store named by `TUNECACHE_REMOTE` (see [`connect`]), if it is set and not
/// empty.
pub fn from_env() -> Result<Option<Arc<dyn Remote>>, String> {
    match std::env::var(ENV_REMOTE) {
        Ok(address) if !address.trim().is_empty() => connect(&address).map(Some),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_never_shown() {
        assert_eq!(
            redact("redis://alice:s3cret@db.internal:6379/2"),
            "redis://alice:***@db.internal:6379/2"
        );
        assert_eq!(redact("redis://:s3cret@h/0"), "redis://:***@h/0");
        assert_eq!(redact("rediss://s3cret@h"), "rediss://***@h");
        assert_eq!(
            redact("redis+unix:///run/redis.sock?db=1&pass=s3cret"),
            "redis+unix:///run/redis.sock?db=1&pass=***"
        );
        assert_eq!(redact("redis://h:6379"), "redis://h:6379");
        let e = RedisRemote::open("redis://alice:s3cret@[::1").expect_err("bad address");
        assert!(!e.contains("s3cret"), "{e}");
        let ok = RedisRemote::open("redis://alice:s3cret@127.0.0.1:1/0").expect("parses");
        assert!(!format!("{ok:?} {}", ok.describe()).contains("s3cret"));
    }
}
