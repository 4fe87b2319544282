//! One Redis server as a [`Remote`].

use std::time::{Duration, Instant};

use redis::IntoConnectionInfo;

use super::pool::Pool;
use super::reply;
use cache_core::settings::Settings;

use super::{ConfigError, redact};
use crate::store::{Read, Remote, RemoteError, Swap, Swapped};

/// A Redis server as a [`Remote`].
pub struct RedisRemote {
    client: redis::Client,
    describe: String,
    /// `rediss://`: connecting includes a TLS handshake.
    tls: bool,
    pool: Pool<redis::Connection>,
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
    /// call does, within its deadline). The error never contains the password. A `rediss://`
    /// server's authorities are those `TUNECACHE_REMOTE_CA` names in the environment as read
    /// now ([`RedisRemote::open_with`] takes the settings).
    pub fn open(url: &str) -> Result<Self, ConfigError> {
        Self::open_with(url, &Settings::from_env())
    }

    /// [`RedisRemote::open`] with `settings` in force (`TUNECACHE_REMOTE_CA`).
    pub fn open_with(url: &str, settings: &Settings) -> Result<Self, ConfigError> {
        let describe = redact(url);
        let tls = url
            .trim_start()
            .to_ascii_lowercase()
            .starts_with("rediss://");
        if tls && !cfg!(feature = "tls") {
            return Err(ConfigError::NoTls { address: describe });
        }
        let info = url
            .into_connection_info()
            .map_err(|e| ConfigError::BadAddress {
                address: describe.clone(),
                detail: format!("{:?}", e.kind()),
            })?;
        let redis_settings = info.redis_settings().clone().set_skip_set_lib_name();
        let info = info.set_redis_settings(redis_settings);
        let client = if tls {
            tls_client(info, &describe, settings)?
        } else {
            redis::Client::open(info).map_err(|e| ConfigError::BadAddress {
                address: describe.clone(),
                detail: format!("{:?}", e.kind()),
            })?
        };
        Ok(RedisRemote {
            client,
            describe,
            tls,
            pool: Pool::default(),
        })
    }

    /// Runs `f` on a pooled or new connection within `deadline` (see `pool`).
    fn run<T>(
        &self,
        deadline: Instant,
        f: impl FnMut(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T, RemoteError> {
        // One read's timeout: `bounded` sets each read's own as it goes.
        let connect = |time| self.client.get_connection_with_timeout(time);
        let fresh = !self.pool.has_idle();
        match self.pool.run(deadline, 1, connect, f) {
            // A `rediss://` connection that never answers is, most often, a server that does
            // not speak TLS on that port: it waits for a command and never answers the
            // handshake. Said so, instead of a bare timeout.
            Err(RemoteError::Timeout(text)) if self.tls && fresh => {
                Err(RemoteError::Timeout(format!(
                    "{text}: no answer to the TLS handshake; does the server speak TLS on this \
                     port? (rediss:// needs one that does; redis:// is plain)"
                )))
            }
            other => other,
        }
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
        read: Read,
        deadline: Instant,
    ) -> Result<Vec<Option<Vec<u8>>>, RemoteError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let groups = self.run(deadline, |c| {
            reply::per_group(keys.len(), 2, |some| {
                let cmds: Vec<redis::Cmd> = some
                    .iter()
                    .flat_map(|&i| reply::read_commands(&keys[i], read))
                    .collect();
                bounded(c, &cmds, deadline)
            })
        })?;
        let replies = groups.into_iter().map(reply::read_value).collect();
        reply::values(replies, keys.len())
    }

    fn compare_and_set_many(
        &self,
        swaps: &[Swap<'_>],
        ttl: Option<Duration>,
        deadline: Instant,
    ) -> Result<Vec<Swapped>, RemoteError> {
        if swaps.is_empty() {
            return Ok(Vec::new());
        }
        let ttl = ttl.map_or(0, reply::millis);
        let groups = self.run(deadline, |c| {
            reply::per_group(swaps.len(), 1, |some| {
                let cmds: Vec<redis::Cmd> = some
                    .iter()
                    .map(|&i| reply::swap_command(&swaps[i], ttl))
                    .collect();
                bounded(c, &cmds, deadline)
            })
        })?;
        reply::swapped(groups, swaps.len())
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
                    return Err(reply::listing_timed_out());
                }
            }
        })
    }

    fn lease(
        &self,
        key: &str,
        op: crate::LeaseOp<'_>,
        deadline: Instant,
    ) -> Result<crate::LeaseReply, RemoteError> {
        let cmd = super::lease::command(key, &op);
        let replies = self.run(deadline, |c| {
            bounded(c, std::slice::from_ref(&cmd), deadline)
        })?;
        super::lease::reply_of(replies.first())
    }

    /// One pipeline: the lease script, then the entry's read.
    fn lease_and_read(
        &self,
        key: &str,
        op: crate::LeaseOp<'_>,
        entry: &str,
        read: Read,
        deadline: Instant,
    ) -> Result<(crate::LeaseReply, Option<Vec<u8>>), RemoteError> {
        let mut cmds = vec![super::lease::command(key, &op)];
        cmds.extend(reply::read_commands(entry, read));
        let replies = self.run(deadline, |c| bounded(c, &cmds, deadline))?;
        let lease = super::lease::reply_of(replies.first())?;
        let group: reply::Group = match replies.get(1..) {
            Some(rest) => match rest.iter().find_map(|v| match v {
                redis::Value::ServerError(e) => Some(e.clone()),
                _ => None,
            }) {
                Some(e) => Err(redis::RedisError::from(e)),
                None => Ok(rest.to_vec()),
            },
            None => Ok(Vec::new()),
        };
        let value = reply::values(vec![reply::read_value(group)], 1)?;
        Ok((lease, value.into_iter().next().flatten()))
    }

    fn ping(&self, deadline: Instant) -> Result<(), RemoteError> {
        reply::pong(self.run(deadline, |c| redis::cmd("PING").query(c))?)
    }
}

/// Sends `cmds` as one pipeline (one write) and reads their replies one at a time, each read
/// waiting at most the time left until `deadline`, stopping at the first that fails. The
/// client's own pipeline reads every reply even after one timed out, so a frozen server cost
/// a call one timeout per command; this costs it the deadline. A server's error for one
/// command is that command's reply.
fn bounded(
    conn: &mut redis::Connection,
    cmds: &[redis::Cmd],
    deadline: Instant,
) -> redis::RedisResult<Vec<redis::Value>> {
    let mut packed = Vec::new();
    for cmd in cmds {
        packed.extend_from_slice(&cmd.get_packed_command());
    }
    conn.send_packed_command(&packed)?;
    let mut replies = Vec::with_capacity(cmds.len());
    for _ in cmds {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the replies did not come in time",
            )));
        }
        conn.set_read_timeout(Some(left))?;
        replies.push(conn.recv_response()?);
    }
    Ok(replies)
}

/// A client for `rediss://`: rustls with the ring provider, trusting the system's
/// certificate authorities or those of the PEM file `TUNECACHE_REMOTE_CA`.
#[cfg(feature = "tls")]
fn tls_client(
    info: redis::ConnectionInfo,
    describe: &str,
    settings: &Settings,
) -> Result<redis::Client, ConfigError> {
    // The process-wide provider, if the program has not chosen one (then its choice stands).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let root_cert = super::read_ca(settings)?;
    redis::Client::build_with_tls(
        info,
        redis::TlsCertificates {
            client_tls: None,
            root_cert,
        },
    )
    .map_err(|e| ConfigError::Tls {
        address: describe.to_owned(),
        detail: e.to_string(),
    })
}

#[cfg(not(feature = "tls"))]
fn tls_client(
    _: redis::ConnectionInfo,
    describe: &str,
    _: &Settings,
) -> Result<redis::Client, ConfigError> {
    Err(ConfigError::NoTls {
        address: describe.to_owned(),
    })
}
