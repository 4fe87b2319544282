//! One conformance suite for the [`Remote`] trait, run against every store a shared tier can
//! sit on: the in-process `MemoryRemote`, a real `redis-server`, a real Redis Cluster of three
//! primaries, and a real S3 API server (moto's). Each store runs every case of
//! [`cases::CASES`] in order on one server (each case on keys of its own), so a backend that
//! drifts from the contract fails the case that names the drift, whatever store it is.
//!
//! What differs between stores stays in the store's own tests: the bytes a lease is kept as
//! (FORMAT.md), values of another type (a Redis list), the commands a call sends.

mod cases;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cache_core::Cache;
use cache_remote::{MemoryRemote, RedisRemote, Remote, RemoteBuilder as _, RemoteError};
use cache_remote::{RemoteOptions, lease_key};
use test_support::redis_server::Server;

use crate::{registry, remote_key, scope};

/// One store under test, and what a case needs of it beyond the trait.
pub(crate) struct Store {
    /// Its name, for messages.
    pub(crate) name: &'static str,
    held: Held,
}

/// What keeps a store alive: the server processes (stopped by pid when dropped).
enum Held {
    Memory(Arc<MemoryRemote>),
    Redis(Server),
    #[cfg(feature = "cluster")]
    Cluster(test_support::redis_server::Cluster),
    #[cfg(feature = "s3")]
    S3(test_support::s3_server::S3Server),
}

#[cfg(feature = "s3")]
const BUCKET: &str = "conformance";

/// A loopback address nothing listens on.
fn dead_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("address").port()
}

impl Store {
    /// A client of this store, as another process would open it (the in-process store has
    /// one map, which every client shares).
    pub(crate) fn client(&self) -> Arc<dyn Remote> {
        match &self.held {
            Held::Memory(m) => Arc::clone(m) as Arc<dyn Remote>,
            Held::Redis(server) => Arc::new(RedisRemote::open(&server.url()).expect("address")),
            #[cfg(feature = "cluster")]
            Held::Cluster(cluster) => {
                let url = cluster.url();
                let urls: Vec<&str> = url.split(',').collect();
                Arc::new(cache_remote::RedisClusterRemote::open(&urls).expect("addresses"))
            }
            #[cfg(feature = "s3")]
            Held::S3(server) => {
                let env = server.env();
                Arc::new(s3(&env))
            }
        }
    }

    /// A client of this kind of store where nothing answers (a port nobody listens on; for
    /// the in-process store, one made to fail as an unreachable one would).
    pub(crate) fn unreachable(&self) -> Arc<dyn Remote> {
        let port = dead_port();
        match &self.held {
            Held::Memory(_) => {
                let m = MemoryRemote::named("unreachable");
                m.fail_with(Some(RemoteError::Unreachable("injected".into())));
                Arc::new(m)
            }
            Held::Redis(_) => {
                Arc::new(RedisRemote::open(&format!("redis://127.0.0.1:{port}")).expect("address"))
            }
            #[cfg(feature = "cluster")]
            Held::Cluster(_) => Arc::new(
                cache_remote::RedisClusterRemote::open(&[&format!("redis://127.0.0.1:{port}")])
                    .expect("address"),
            ),
            #[cfg(feature = "s3")]
            Held::S3(server) => {
                let mut env = server.env();
                env[0].1 = format!("http://127.0.0.1:{port}");
                Arc::new(s3(&env))
            }
        }
    }

    /// Freezes the store (SIGSTOP to every server process; the in-process store fails every
    /// call as a timed-out one) until the guard is dropped.
    pub(crate) fn freeze(&self) -> Thaw<'_> {
        match &self.held {
            Held::Memory(m) => m.fail_with(Some(RemoteError::Timeout("injected".into()))),
            Held::Redis(server) => server.signal(libc::SIGSTOP),
            #[cfg(feature = "cluster")]
            Held::Cluster(cluster) => {
                for node in &cluster.nodes {
                    node.signal(libc::SIGSTOP);
                }
            }
            #[cfg(feature = "s3")]
            Held::S3(server) => {
                return Thaw {
                    store: self,
                    s3: Some(server.freeze()),
                };
            }
        }
        Thaw {
            store: self,
            #[cfg(feature = "s3")]
            s3: None,
        }
    }

    /// A cache on `path` whose shared tier is this store, leases of `lease_ms`.
    pub(crate) fn cache(&self, path: &Path, lease_ms: u64) -> Cache {
        let options = RemoteOptions {
            budget: Duration::from_secs(2),
            lease_ttl: Some(Duration::from_millis(lease_ms)),
            ..RemoteOptions::default()
        };
        Cache::builder(registry())
            .file(path)
            .ignore_env()
            .scope(scope())
            .save_delay(Duration::from_millis(20))
            .refresh_interval(None)
            .remote_with(self.client(), options)
            .open()
    }
}

#[cfg(feature = "s3")]
fn s3(env: &[(&'static str, String)]) -> cache_remote::S3Remote {
    cache_remote::S3Remote::open(&format!("s3://{BUCKET}/suite"), |name| {
        env.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone())
    })
    .expect("a valid address")
}

/// A frozen store ([`Store::freeze`]), thawed when dropped.
pub(crate) struct Thaw<'a> {
    store: &'a Store,
    /// moto's server, thawed by its own guard.
    #[cfg(feature = "s3")]
    s3: Option<test_support::s3_server::Frozen<'a>>,
}

impl Drop for Thaw<'_> {
    fn drop(&mut self) {
        match &self.store.held {
            Held::Memory(m) => m.fail_with(None),
            Held::Redis(server) => server.signal(libc::SIGCONT),
            #[cfg(feature = "cluster")]
            Held::Cluster(cluster) => {
                for node in &cluster.nodes {
                    node.signal(libc::SIGCONT);
                }
            }
            #[cfg(feature = "s3")]
            Held::S3(_) => drop(self.s3.take()),
        }
    }
}

/// The remote key of entry `id` and its lease key.
pub(crate) fn keys(id: u64) -> (String, String) {
    let k = remote_key(id);
    let l = lease_key(&k);
    (k, l)
}

/// Runs every case against `store`, saying which one runs (a failure names its case).
fn run(store: Option<Store>) {
    let Some(store) = store else {
        return;
    };
    for (name, case) in cases::CASES {
        eprintln!("conformance: {} / {name}", store.name);
        case(&store);
    }
}

#[test]
fn the_in_process_store_keeps_the_contract() {
    run(Some(Store {
        name: "memory",
        held: Held::Memory(Arc::new(MemoryRemote::named("suite"))),
    }));
}

#[test]
fn redis_keeps_the_contract() {
    run(Server::start().map(|s| Store {
        name: "redis",
        held: Held::Redis(s),
    }));
}

#[cfg(feature = "cluster")]
#[test]
fn a_redis_cluster_keeps_the_contract() {
    run(test_support::redis_server::Cluster::start().map(|c| Store {
        name: "redis cluster",
        held: Held::Cluster(c),
    }));
}

#[cfg(feature = "s3")]
#[test]
fn an_s3_bucket_keeps_the_contract() {
    run(
        test_support::s3_server::S3Server::start(BUCKET).map(|s| Store {
            name: "s3",
            held: Held::S3(s),
        }),
    );
}
