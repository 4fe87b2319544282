//! Redis Cluster (the `cluster` feature): the same commands as [`crate::RedisRemote`], with
//! the same reply policy (`reply`), routed by the `redis` crate's cluster client (it follows
//! `MOVED`/`ASK`). Every command touches one key, so nothing can fail with `CROSSSLOT`;
//! pipelines are split per node by the client. A key listing scans every primary.

use std::time::{Duration, Instant};

use redis::cluster::{ClusterClient, ClusterConnection};
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

use super::pool::Pool;
use super::reply;
use cache_core::settings::Settings;

use super::{ConfigError, redact};
use crate::store::{Read, Remote, RemoteError, Swap, Swapped};

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
    /// first call. Errors never contain a password. `rediss://` nodes trust the authorities
    /// `TUNECACHE_REMOTE_CA` names in the environment as read now
    /// ([`RedisClusterRemote::open_with`] takes the settings).
    pub fn open(urls: &[&str]) -> Result<Self, ConfigError> {
        Self::open_with(urls, &Settings::from_env())
    }

    /// [`RedisClusterRemote::open`] with `settings` in force (`TUNECACHE_REMOTE_CA`).
    pub fn open_with(urls: &[&str], settings: &Settings) -> Result<Self, ConfigError> {
        let describe = urls.iter().map(|u| redact(u)).collect::<Vec<_>>().join(",");
        // No retries of its own: a call has one deadline, and the tier's breaker decides
        // when to try again.
        // The cluster client connects with a timeout fixed when it is built (not the call's
        // deadline): keep it short.
        #[cfg_attr(not(feature = "tls"), allow(unused_mut, reason = "set only for TLS"))]
        let mut builder = ClusterClient::builder(urls.iter().map(|u| u.trim().to_owned()))
            .retries(0)
            .connection_timeout(CONNECT_TIMEOUT);
        // `rediss://` nodes trust `TUNECACHE_REMOTE_CA`'s authorities, as a single node does.
        #[cfg(feature = "tls")]
        if urls.iter().any(|u| u.trim().starts_with("rediss://"))
            && let Some(root_cert) = super::read_ca(settings)?
        {
            builder = builder.certs(redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(root_cert),
            });
        }
        let client = builder.build().map_err(|e| ConfigError::BadCluster {
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
        reads: usize,
        f: impl FnMut(&mut ClusterConnection) -> redis::RedisResult<T>,
    ) -> Result<T, RemoteError> {
        self.pool
            .run(deadline, reads, |_| self.client.get_connection(), f)
    }
}

impl Remote for RedisClusterRemote {
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
        let groups = self.run(deadline, 2 * keys.len(), |c| {
            reply::per_group(keys.len(), 2, |some| {
                let mut pipe = redis::cluster::cluster_pipe();
                for &i in some {
                    for cmd in reply::read_commands(&keys[i], read) {
                        pipe.add_command(cmd);
                    }
                }
                pipe.query(c)
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
        let groups = self.run(deadline, swaps.len(), |c| {
            reply::per_group(swaps.len(), 1, |some| {
                let mut pipe = redis::cluster::cluster_pipe();
                for &i in some {
                    pipe.add_command(reply::swap_command(&swaps[i], ttl));
                }
                pipe.query(c)
            })
        })?;
        reply::swapped(groups, swaps.len())
    }

    fn lease(
        &self,
        key: &str,
        op: crate::LeaseOp<'_>,
        deadline: Instant,
    ) -> Result<crate::LeaseReply, RemoteError> {
        let cmd = super::lease::command(key, &op);
        let reply: redis::Value = self.run(deadline, 1, |c| cmd.query(c))?;
        super::lease::reply_of(Some(&reply))
    }

    fn ping(&self, deadline: Instant) -> Result<(), RemoteError> {
        reply::pong(self.run(deadline, 1, |c| redis::cmd("PING").query(c))?)
    }

    /// Scans every primary (from `CLUSTER NODES`) in turn.
    fn scan(&self, pattern: &str, deadline: Instant) -> Result<Vec<String>, RemoteError> {
        self.run(deadline, 1, |c| {
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
