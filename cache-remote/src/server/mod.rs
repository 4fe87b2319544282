//! The shared tier on Redis: [`RedisRemote`] (one server), [`RedisClusterRemote`] (the
//! `cluster` feature), chosen from an address by [`connect`] or `TUNECACHE_REMOTE` by
//! [`from_env`]. Both use the `redis` crate's synchronous client and the same commands and
//! reply policy (`reply`).
//!
//! Every call is bounded by its deadline, connecting included: the connection is made with
//! the remaining time as its timeout, the library-name handshake (`CLIENT SETINFO`, a second
//! round trip that could cost a second timeout) is skipped, and each command gets the
//! remaining time as its socket read and write timeout. Connections are pooled; one that
//! failed is dropped, never reused (a timed-out reply could still arrive on it).

use std::path::PathBuf;
use std::sync::Arc;

#[cfg(feature = "cluster")]
mod cluster;
mod lease;
mod pool;
mod reply;
#[cfg(feature = "s3")]
mod s3;
mod single;

#[cfg(feature = "cluster")]
pub use cluster::RedisClusterRemote;
#[cfg(feature = "s3")]
pub use s3::S3Remote;
pub use single::RedisRemote;

/// A server's error reply (`Value::ServerError`) as a [`crate::RemoteError`].
pub(crate) fn classify_server_error(e: &redis::ServerError) -> crate::RemoteError {
    reply::classify(&redis::RedisError::from(e.clone()))
}

use cache_core::settings::Settings;

use crate::store::Remote;

/// The environment variable that names the server: `redis://[user:password@]host:port/db`,
/// `rediss://…` (TLS, with the `tls` feature), `redis+unix:///path/to/socket`, or some nodes
/// of a Redis Cluster separated by commas (the `cluster` feature).
pub const ENV_REMOTE: &str = "TUNECACHE_REMOTE";

/// A PEM file of the certificate authorities to trust for `rediss://` (instead of the
/// system's), e.g. a private CA.
pub(crate) const ENV_REMOTE_CA: &str = "TUNECACHE_REMOTE_CA";

/// Why a shared tier's address cannot be used. No message holds a password.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The address does not parse as a Redis address.
    #[error(
        "{ENV_REMOTE}: cannot use {address} ({detail}): expected redis://[USER:PASSWORD@]HOST:PORT/DB, rediss://… (TLS) or redis+unix:///PATH"
    )]
    BadAddress {
        /// The address, its password left out.
        address: String,
        /// What the client said.
        detail: String,
    },
    /// A list of cluster nodes that does not make a cluster client.
    #[error(
        "{ENV_REMOTE}: cannot use the cluster {address} ({detail}): expected redis://HOST:PORT,redis://HOST:PORT,…"
    )]
    BadCluster {
        /// The nodes, their passwords left out.
        address: String,
        /// What the client said.
        detail: String,
    },
    /// `rediss://` in a build without TLS.
    #[error(
        "{ENV_REMOTE}: {address} needs TLS, and this build has none (cache-remote's `tls` feature)"
    )]
    NoTls {
        /// The address, its password left out.
        address: String,
    },
    /// Several nodes in a build without cluster support.
    #[error(
        "{ENV_REMOTE}: {address} lists several nodes (a Redis Cluster), and this build has no cluster support (cache-remote's `cluster` feature)"
    )]
    NoCluster {
        /// The nodes, their passwords left out.
        address: String,
    },
    /// An `s3://` address that cannot be used, or `s3://` in a build without S3.
    #[error(
        "{ENV_REMOTE}: cannot use {address} ({detail}): expected s3://BUCKET/PREFIX, with AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_REGION as for any S3 client"
    )]
    BadS3 {
        /// The address, any password left out.
        address: String,
        /// What is wrong with it.
        detail: String,
    },
    /// A setting with a value it cannot take.
    #[error("{name}={value:?}: expected {expected}")]
    BadSetting {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What it takes.
        expected: String,
    },
    /// The certificate authorities' file cannot be read.
    #[error("{ENV_REMOTE_CA}: cannot read {}: {source}", path.display())]
    CaUnreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The TLS client cannot be built (a PEM file with no certificate, say).
    #[error("{ENV_REMOTE}: cannot use {address} over TLS: {detail}")]
    Tls {
        /// The address, its password left out.
        address: String,
        /// What the client said.
        detail: String,
    },
}

/// The address without its password: `redis://user:***@host:6379/0`, and `pass=***` in a
/// query string.
pub(crate) fn redact(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((s, r)) => (s, r),
        None => return "(not a URL)".to_owned(),
    };
    // The user information ends at the last `@` before the host: a password may hold `/`,
    // `?`, `#` or `@` (base64 secrets do), so the path is looked for only after it.
    let host_from = rest.rfind('@').map_or(0, |at| at + 1);
    let path_at = rest[host_from..]
        .find(['/', '?', '#'])
        .map_or(rest.len(), |i| host_from + i);
    let (authority, path) = rest.split_at(path_at);
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

/// The shared store at `address`: one server (`redis://…`, `rediss://…`,
/// `redis+unix://…`), or a Redis Cluster given as some of its nodes separated by commas
/// (the `cluster` feature).
///
/// `settings` give an S3 bucket's endpoint and credentials and a TLS server's authorities
/// (`cache_core::settings::Settings::from_env` for the environment's).
pub fn connect(address: &str, settings: &Settings) -> Result<Arc<dyn Remote>, ConfigError> {
    if address.trim().starts_with("s3://") {
        return s3(address.trim(), settings);
    }
    let nodes: Vec<&str> = address
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect();
    if nodes.len() > 1 {
        return cluster(&nodes, settings);
    }
    Ok(Arc::new(RedisRemote::open_with(address.trim(), settings)?))
}

/// The bucket of an `s3://` address (the `s3` feature), configured from the environment.
#[cfg(feature = "s3")]
fn s3(address: &str, settings: &Settings) -> Result<Arc<dyn Remote>, ConfigError> {
    Ok(Arc::new(S3Remote::open(address, |name| {
        settings.get(name).map(str::to_owned)
    })?))
}

#[cfg(not(feature = "s3"))]
fn s3(address: &str, _: &Settings) -> Result<Arc<dyn Remote>, ConfigError> {
    Err(ConfigError::BadS3 {
        address: redact(address),
        detail: "this build has no S3 support (cache-remote's `s3` feature)".to_owned(),
    })
}

/// The largest certificate authorities' file read (a system bundle is about 200 KiB).
const MAX_CA_BYTES: u64 = 4 << 20;

/// What a PEM certificate starts with.
#[cfg_attr(not(feature = "tls"), allow(dead_code, reason = "read only for TLS"))]
const CERTIFICATE: &str = "-----BEGIN CERTIFICATE-----";

/// The PEM bytes of the file `TUNECACHE_REMOTE_CA` names, if it is set: read as every path
/// tunecache reads is (a regular file only, never a FIFO, a device or a procfs file, which
/// could block or never end; at most 4 MiB).
#[cfg_attr(not(feature = "tls"), allow(dead_code, reason = "read only for TLS"))]
fn read_ca(settings: &Settings) -> Result<Option<Vec<u8>>, ConfigError> {
    use std::io::Read as _;
    let Some(path) = settings.get_os(ENV_REMOTE_CA) else {
        return Ok(None);
    };
    let path = PathBuf::from(path);
    let unreadable = |source: std::io::Error| ConfigError::CaUnreadable {
        path: path.clone(),
        source,
    };
    let file = match cache_core::file::open_regular(&path) {
        Ok(Some(file)) => file,
        Ok(None) => return Err(unreadable(std::io::ErrorKind::NotFound.into())),
        Err(e) => return Err(unreadable(std::io::Error::other(e.to_string()))),
    };
    let mut bytes = Vec::new();
    file.take(MAX_CA_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(unreadable)?;
    if bytes.len() as u64 > MAX_CA_BYTES {
        return Err(unreadable(std::io::Error::other(format!(
            "larger than {} MiB: not a file of certificates",
            MAX_CA_BYTES >> 20
        ))));
    }
    // Said now, not as an unknown issuer at the first connection.
    if !bytes
        .windows(CERTIFICATE.len())
        .any(|w| w == CERTIFICATE.as_bytes())
    {
        return Err(unreadable(std::io::Error::other(
            "it holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
        )));
    }
    Ok(Some(bytes))
}

#[cfg(feature = "cluster")]
fn cluster(nodes: &[&str], settings: &Settings) -> Result<Arc<dyn Remote>, ConfigError> {
    Ok(Arc::new(RedisClusterRemote::open_with(nodes, settings)?))
}

#[cfg(not(feature = "cluster"))]
fn cluster(nodes: &[&str], _: &Settings) -> Result<Arc<dyn Remote>, ConfigError> {
    let address = nodes
        .iter()
        .map(|u| redact(u))
        .collect::<Vec<_>>()
        .join(",");
    Err(ConfigError::NoCluster { address })
}

/// The shared store `TUNECACHE_REMOTE` names in `settings` (see [`connect`]), if it is set
/// and not empty.
pub fn from_settings(settings: &Settings) -> Result<Option<Arc<dyn Remote>>, ConfigError> {
    match settings.get(ENV_REMOTE) {
        Some(address) if !address.trim().is_empty() => connect(address, settings).map(Some),
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
        // Base64 secrets hold `/`, `+` and `=`; some hold `@` or `?` too.
        for secret in ["ab/cd+ef==", "a/b/c", "p@ss/w?rd#x"] {
            let url = format!("redis://alice:{secret}@db.internal:6379/2");
            assert_eq!(
                redact(&url),
                "redis://alice:***@db.internal:6379/2",
                "{url}"
            );
        }
        assert_eq!(redact("redis://:a/b@h:1"), "redis://:***@h:1");
        let e = RedisRemote::open("redis://alice:s3cret@[::1").expect_err("bad address");
        assert!(matches!(e, ConfigError::BadAddress { .. }), "{e:?}");
        assert!(!e.to_string().contains("s3cret"), "{e}");
        let ok = RedisRemote::open("redis://alice:s3cret@127.0.0.1:1/0").expect("parses");
        assert!(!format!("{ok:?} {}", ok.describe()).contains("s3cret"));
    }
}
