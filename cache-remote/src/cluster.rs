//! Redis Cluster (the `cluster` feature): the same commands as [`crate::RedisRemote`], routed
//! by the `redis` crate's cluster client (it follows `MOVED`/`ASK`). Every command touches one
//! key, so nothing can fail with `CROSSSLOT`; pipelines are split per node by the client. A key
//! listing scans every primary.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use cache_core::{Remote, RemoteError, Swap};
use redis::cluster::{ClusterClient, ClusterConnection};
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

use crate::{CAS_SCRIPT, ENV_REMOTE, POOL, classify, left, millis, redact};

/// How long connecting to one node may take (the cluster client's connections are made with
/// this fixed timeout, not the call's deadline).
const CONNECT_TIMEOUT: Duration = Duration::from_millis(100);

/// A Redis Cluster as a [`Remote`]: `TUNECACHE_REMOTE` lists some of its nodes, separated by
/// commas (`redis://n1:7000,redis://n2:7001`).
pub struct RedisClusterRemote {
    client: ClusterClient,
    describe: String,
    pool: Mutex<Vec<ClusterConnection>>,
}

impl std::fmt::Debug for RedisClusterRemote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisClusterRemote")
            .field("nodes", &self.describe)
            .finish()
    }
}

impl RedisClusterRemote {
    /// A client for the cluster that `urls` (some of its nodes) belong to; connects on the
    /// first call. Errors never contain a password.
    pub fn open(urls: &[&str]) -> Result<Self, String> {
        let describe = urls.iter().map(|u| redact(u)).collect::<Vec<_>>().join(",");
        // No retries of its own: a call has one deadline, and the tier's breaker decides
        // when to try again.
        // The cluster client connects with a timeout fixed when it is built (not the call's
        // deadline): keep it short.
        let client = ClusterClient::builder(urls.iter().map(|u| u.trim().to_owned()))
            .retries(0)
            .connection_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(|e| {
                format!(
                    "{ENV_REMOTE}: cannot use the cluster {describe} ({:?}): expected redis://HOST:PORT,redis://HOST:PORT,…",
                    e.kind()
                )
            })?;
        Ok(RedisClusterRemote {
            client,
            describe,
            pool: Mutex::new(Vec::new()),
        })
    }

    fn pool(&self) -> std::sync::MutexGuard<'_, Vec<ClusterConnection>> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on a pooled (or new) cluster connection with the time left until `deadline`
    /// as its socket timeouts; a failed connection is dropped.
    fn run<T>(
        &self,
        deadline: Instant,
        f: impl FnOnce(&mut ClusterConnection) -> redis::RedisResult<T>,
    ) -> Result<T, RemoteError> {
        let pooled = self.pool().pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => {
                left(deadline, "connect")?;
                self.client.get_connection().map_err(|e| classify(&e))?
            }
        };
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
}

impl Remote for RedisClusterRemote {
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
        let values: Vec<Option<Vec<u8>>> = self.run(deadline, |c| {
            let mut pipe = redis::cluster::cluster_pipe();
            for key in keys {
                match touch {
                    Some(ttl) => pipe.cmd("GETEX").arg(key).arg("PX").arg(millis(ttl)),
                    None => pipe.cmd("GET").arg(key),
                };
            }
            pipe.query(c)
        })?;
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
            let mut pipe = redis::cluster::cluster_pipe();
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

    fn ping(&self, deadline: Instant) -> Result<(), RemoteError> {
        let pong: String = self.run(deadline, |c| redis::cmd("PING").query(c))?;
        if pong == "PONG" {
            Ok(())
        } else {
            Err(RemoteError::Protocol(format!("PING answered {pong:?}")))
        }
    }

    /// Scans every primary (from `CLUSTER NODES`) in turn.
    fn scan(&self, pattern: &str, deadline: Instant) -> Result<Vec<String>, RemoteError> {
        self.run(deadline, |c| {
            let nodes: String = redis::cmd("CLUSTER").arg("NODES").query(c)?;
            let mut keys = Vec::new();
            for (host, port) in primaries(&nodes) {
                let mut cursor: u64 = 0;
                loop {
                    let mut cmd = redis::cmd("SCAN");
                    cmd.arg(cursor)
                        .arg("MATCH")
                        .arg(pattern)
                        .arg("COUNT")
                        .arg(1000);
                    let reply = c.route_command(
                        &cmd,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                            host: host.clone(),
                            port,
                        }),
                    )?;
                    let (next, batch): (u64, Vec<String>) = redis::from_redis_value(reply)?;
                    keys.extend(batch);
                    cursor = next;
                    if cursor == 0 {
                        break;
                    }
                    if Instant::now() >= deadline {
                        return Err(redis::RedisError::from(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "listing the keys did not finish in time",
                        )));
                    }
                }
            }
            Ok(keys)
        })
    }
}

/// The primaries of `CLUSTER NODES` output: `id host:port@cport flags …`, flags with
/// `master` and without `fail`.
fn primaries(nodes: &str) -> Vec<(String, u16)> {
    nodes
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let _id = fields.next()?;
            let addr = fields.next()?;
            let flags = fields.next()?;
            if !flags.split(',').any(|f| f == "master") || flags.contains("fail") {
                return None;
            }
            let addr = addr.split('@').next()?;
            let (host, port) = addr.rsplit_once(':')?;
            Some((host.to_owned(), port.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn primaries_are_read_from_cluster_nodes() {
        let nodes = "a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n\
                     b2 127.0.0.1:7001@17001 master - 0 0 2 connected 5461-10922\n\
                     c3 127.0.0.1:7002@17002 slave b2 0 0 2 connected\n\
                     d4 127.0.0.1:7003@17003 master,fail - 0 0 3 disconnected\n";
        assert_eq!(
            super::primaries(nodes),
            [
                ("127.0.0.1".to_owned(), 7000),
                ("127.0.0.1".to_owned(), 7001)
            ]
        );
    }
}
