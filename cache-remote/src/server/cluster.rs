//! Redis Cluster (the `cluster` feature): the same commands as [`crate::RedisRemote`], with
//! the same reply policy (`reply`), routed by the `redis` crate's cluster client (it follows
//! `MOVED`/`ASK`). Every command touches one key, so nothing can fail with `CROSSSLOT`;
//! pipelines are split per node by the client. A key listing scans every primary.

use std::time::{Duration, Instant};

use redis::cluster::{ClusterClient, ClusterConnection};
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

use super::pool::Pool;
use super::reply;
use super::{ConfigError, redact};
use crate::store::{Remote, RemoteError, Swap};

/// How long connecting to one node may take (the cluster client's connections are made with
/// this fixed timeout, not the call's deadline).
const CONNECT_TIMEOUT: Duration = Duration::from_millis(100);

/// A Redis Cluster as a [`Remote`]: `TUNECACHE_REMOTE` lists some of its nodes, separated by
/// commas (`redis://n1:7000,redis://n2:7001`).
pub struct RedisClusterRemote {
    client: ClusterClient,
    describe: String,
    pool: Pool<ClusterConnection>,
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
    pub fn open(urls: &[&str]) -> Result<Self, ConfigError> {
        let describe = urls.iter().map(|u| redact(u)).collect::<Vec<_>>().join(",");
        // No retries of its own: a call has one deadline, and the tier's breaker decides
        // when to try again.
        // The cluster client connects with a timeout fixed when it is built (not the call's
        // deadline): keep it short.
        let client = ClusterClient::builder(urls.iter().map(|u| u.trim().to_owned()))
            .retries(0)
            .connection_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(|e| ConfigError::BadCluster {
                address: describe.clone(),
                detail: format!("{:?}", e.kind()),
            })?;
        Ok(RedisClusterRemote {
            client,
            describe,
            pool: Pool::default(),
        })
    }

    /// Runs `f` on a pooled or new cluster connection within `deadline` (see `pool`; the
    /// cluster client connects with its own fixed timeout).
    fn run<T>(
        &self,
        deadline: Instant,
        f: impl FnMut(&mut ClusterConnection) -> redis::RedisResult<T>,
    ) -> Result<T, RemoteError> {
        self.pool.run(deadline, |_| self.client.get_connection(), f)
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
        let replies = self.run(deadline, |c| read_each(c, keys, touch))?;
        reply::values(replies, keys.len())
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
        let ttl = ttl.map_or(0, reply::millis);
        let done: Vec<i64> = self.run(deadline, |c| {
            let mut pipe = redis::cluster::cluster_pipe();
            for s in swaps {
                pipe.add_command(reply::swap_command(s, ttl));
            }
            pipe.query(c)
        })?;
        reply::swapped(done, swaps.len())
    }

    fn ping(&self, deadline: Instant) -> Result<(), RemoteError> {
        reply::pong(self.run(deadline, |c| redis::cmd("PING").query(c))?)
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
                        return Err(reply::listing_timed_out());
                    }
                }
            }
            Ok(keys)
        })
    }
}

/// The replies to reading `keys`, one per key, as a single server's pipeline with
/// `ignore_errors` gives them (the cluster pipeline has no such mode): when some keys fail
/// with a server error (a value of another type), the others are read again in a second
/// pipeline, so one foreign value costs a round trip, not the batch.
fn read_each(
    c: &mut ClusterConnection,
    keys: &[String],
    touch: Option<Duration>,
) -> redis::RedisResult<Vec<reply::ReadReply>> {
    let pipeline = |keys: &mut dyn Iterator<Item = &String>| {
        let mut pipe = redis::cluster::cluster_pipe();
        for key in keys {
            pipe.add_command(reply::read_command(key, touch));
        }
        pipe
    };
    let first = pipeline(&mut keys.iter()).query::<Vec<Option<Vec<u8>>>>(c);
    let failed = match first {
        Ok(values) => return Ok(values.into_iter().map(Ok).collect()),
        Err(e) => match e.clone().into_server_errors() {
            Some(failed) => failed,
            None => return Err(e),
        },
    };
    let is_failed = |i: usize| failed.iter().any(|(at, _)| *at == i);
    let mut rest = keys
        .iter()
        .enumerate()
        .filter(|(i, _)| !is_failed(*i))
        .map(|(_, k)| k);
    let asked = keys.len() - failed.len();
    let values = if asked > 0 {
        pipeline(&mut rest).query::<Vec<Option<Vec<u8>>>>(c)?
    } else {
        Vec::new()
    };
    if values.len() != asked {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "short reply",
            format!("{} replies to {asked} reads", values.len()),
        )));
    }
    let mut values = values.into_iter();
    Ok((0..keys.len())
        .map(|i| match failed.iter().find(|(at, _)| *at == i) {
            Some((_, e)) => Err(redis::RedisError::from(e.clone())),
            None => Ok(values.next().flatten()),
        })
        .collect())
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
