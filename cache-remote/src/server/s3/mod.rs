//! The shared store on an S3 (or S3-compatible) bucket: `TUNECACHE_REMOTE=s3://BUCKET/PREFIX`,
//! the endpoint, credentials and region from the standard variables (`AWS_ENDPOINT_URL`,
//! `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`). One object
//! per key, under `PREFIX/`; requests signed with rusty-s3 (sans-IO) and sent with ureq's
//! blocking client, each with the time left to its deadline as its whole timeout.
//!
//! A compare-and-set is a conditional write: create-only (`If-None-Match: *`) for an absent
//! key, and for a present one `If-Match` with the ETag of the value it must still hold (read
//! again if this process has not seen that value); `412 Precondition Failed` (or `409`) is a
//! lost race, as on Redis. Fleet leases are objects too, expiring on the store's clock
//! (`lease.rs`). What S3 cannot give is refused, never imitated: there is no time to live (a
//! bucket's lifecycle rule expires old objects; a read's `touch` writes nothing).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rusty_s3::{Bucket, Credentials, UrlStyle};

use super::ConfigError;
use bucket::Objects;

/// How long one request waits for a connection, and then for the first bytes of its reply.
pub(crate) const ANSWER_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

mod bucket;
mod http;
mod lease;
mod parallel;
use crate::store::{Read, Remote, RemoteError, Swap, Swapped};
use parallel::in_parallel;

/// ETags remembered from reads, at most this many (then forgotten all at once).
const MAX_ETAGS: usize = 100_000;

/// An S3 bucket as the shared store.
pub struct S3Remote {
    objects: Objects,
    prefix: String,
    /// The ETag and a hash of the value last read or written per object key, so a
    /// compare-and-set of a value this process saw needs no second read.
    etags: Mutex<HashMap<String, (String, u64)>>,
    /// Requests in flight at once for a batch (`TUNECACHE_REMOTE_PARALLEL`).
    parallel: usize,
}

impl std::fmt::Debug for S3Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Remote")
            .field("at", &self.objects.describe)
            .finish_non_exhaustive()
    }
}

impl S3Remote {
    /// The bucket of `address` (`s3://BUCKET` or `s3://BUCKET/PREFIX`), with the endpoint,
    /// credentials and region `env` gives (the standard `AWS_*` variables; without an
    /// endpoint, AWS's for the region). Connects to nothing.
    pub fn open(address: &str, env: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        // An address is not where credentials go, but one pasted there is never printed.
        let bad = |detail: &str| ConfigError::BadS3 {
            address: super::redact(address),
            detail: detail.to_owned(),
        };
        let rest = address
            .strip_prefix("s3://")
            .ok_or_else(|| bad("not an s3:// address"))?;
        let (name, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if name.len() < 3
            || name.len() > 63
            || !name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        {
            return Err(bad(
                "a bucket name is 3 to 63 lower-case letters, digits, '-' or '.'",
            ));
        }
        let region = env("AWS_REGION")
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|| "us-east-1".to_owned());
        let endpoint = env("AWS_ENDPOINT_URL_S3")
            .or_else(|| env("AWS_ENDPOINT_URL"))
            .unwrap_or_else(|| format!("https://s3.{region}.amazonaws.com"));
        let url: url::Url = endpoint
            .parse()
            .map_err(|e| bad(&format!("AWS_ENDPOINT_URL {endpoint:?}: {e}")))?;
        let bucket = Bucket::new(url.clone(), UrlStyle::Path, name.to_owned(), region.clone())
            .map_err(|e| bad(&format!("AWS_ENDPOINT_URL {endpoint:?}: {e}")))?;
        let credentials = match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
            (Some(key), Some(secret)) => Some(match env("AWS_SESSION_TOKEN") {
                Some(token) => Credentials::new_with_token(key, secret, token),
                None => Credentials::new(key, secret),
            }),
            (None, None) => None,
            _ => {
                return Err(bad(
                    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY go together",
                ));
            }
        };
        // A store that accepts a connection and sends nothing is not waited for past
        // ANSWER_WITHIN per request (a connection made, and a reply's first bytes), whatever
        // the deadline of the call: a frozen bucket costs a command seconds, not the publish
        // budget; a store that answers keeps every call's whole deadline.
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_connect(Some(ANSWER_WITHIN))
            .timeout_recv_response(Some(ANSWER_WITHIN))
            .build()
            .new_agent();
        let prefix = prefix.trim_matches('/');
        if !prefix.is_empty() && !bucket::addressable(prefix) {
            return Err(bad(
                "a prefix with a `.` or `..` segment names other objects in a URL",
            ));
        }
        let parallel =
            crate::options::parse_parallel(env(crate::options::ENV_REMOTE_PARALLEL).as_deref())?;
        let host = url.host_str().unwrap_or("?").to_owned();
        let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
        Ok(S3Remote {
            objects: Objects {
                bucket,
                credentials,
                agent,
                describe: format!("s3://{name}/{prefix} at {}://{host}{port}", url.scheme()),
            },
            prefix: if prefix.is_empty() {
                String::new()
            } else {
                format!("{prefix}/")
            },
            etags: Mutex::new(HashMap::new()),
            parallel,
        })
    }

    /// The object name of `key`: the prefix, then the key.
    pub(crate) fn object(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The bucket's objects, for the generations kept beside the entries.
    pub(crate) fn objects(&self) -> &Objects {
        &self.objects
    }

    /// The first `limit + 1` bytes of `object`, its ETag remembered; `None` if absent.
    fn get(
        &self,
        object: &str,
        limit: usize,
        deadline: Instant,
    ) -> Result<Option<Vec<u8>>, RemoteError> {
        let Some(fetched) = self.objects.get(object, limit as u64, deadline)? else {
            return Ok(None);
        };
        if let Some(etag) = fetched.etag {
            self.remember(object, etag, &fetched.bytes);
        }
        Ok(Some(fetched.bytes))
    }

    /// A conditional PUT (see [`Objects::put`]), its new ETag remembered.
    fn put(
        &self,
        object: &str,
        value: &[u8],
        etag: Option<&str>,
        deadline: Instant,
    ) -> Result<Swapped, RemoteError> {
        let (swapped, new_etag) = self.objects.put(object, value, etag, deadline)?;
        if let Some(new_etag) = new_etag {
            self.remember(object, new_etag, value);
        }
        Ok(swapped)
    }

    fn remember(&self, object: &str, etag: String, value: &[u8]) {
        let mut etags = crate::lock(&self.etags);
        if etags.len() >= MAX_ETAGS {
            etags.clear();
        }
        etags.insert(object.to_owned(), (etag, hash(value)));
    }

    /// One compare-and-set of `swap`, under its fence if it has one.
    fn swap(&self, swap: &Swap<'_>, deadline: Instant) -> Result<Swapped, RemoteError> {
        match &swap.fence {
            Some(fence) => self.fenced_swap(swap, fence, deadline),
            None => self.plain_swap(swap, deadline),
        }
    }

    /// One compare-and-set of `swap`'s entry, its fence aside.
    fn plain_swap(&self, swap: &Swap<'_>, deadline: Instant) -> Result<Swapped, RemoteError> {
        let object = self.object(swap.key);
        let Some(expected) = swap.expected else {
            return self.put(&object, swap.value, None, deadline);
        };
        let known = crate::lock(&self.etags)
            .get(&object)
            .filter(|(_, h)| *h == hash(expected))
            .map(|(etag, _)| etag.clone());
        let etag = match known {
            Some(etag) => etag,
            None => {
                // Read it again for its ETag; a value other than `expected` is a lost race.
                match self.get(&object, expected.len(), deadline)? {
                    Some(now) if now == expected => crate::lock(&self.etags)
                        .get(&object)
                        .map(|(etag, _)| etag.clone())
                        .ok_or_else(|| RemoteError::Protocol("a read gave no ETag".to_owned()))?,
                    _ => return Ok(Swapped::Changed),
                }
            }
        };
        self.put(&object, swap.value, Some(&etag), deadline)
    }
}

impl Remote for S3Remote {
    fn describe(&self) -> String {
        self.objects.describe.clone()
    }

    fn get_many(
        &self,
        keys: &[String],
        read: Read,
        deadline: Instant,
    ) -> Result<Vec<Option<Vec<u8>>>, RemoteError> {
        let objects: Vec<String> = keys.iter().map(|k| self.object(k)).collect();
        in_parallel(&objects, self.parallel, |object| {
            self.get(object, read.limit, deadline)
        })
    }

    fn compare_and_set_many(
        &self,
        swaps: &[Swap<'_>],
        _ttl: Option<Duration>,
        deadline: Instant,
    ) -> Result<Vec<Swapped>, RemoteError> {
        in_parallel(swaps, self.parallel, |swap| self.swap(swap, deadline))
    }

    fn keys_per_round(&self) -> Option<usize> {
        Some(self.parallel)
    }

    /// An object store answers in milliseconds: a read-through waits up to a second, a
    /// publication up to 30 s. No time to live (a bucket lifecycle rule expires old objects).
    fn default_options(&self) -> crate::RemoteOptions {
        crate::RemoteOptions {
            budget: Duration::from_secs(1),
            publish_budget: Duration::from_secs(30),
            ttl: None,
            ..crate::RemoteOptions::default()
        }
    }

    fn lease(
        &self,
        key: &str,
        op: crate::LeaseOp<'_>,
        deadline: Instant,
    ) -> Result<crate::LeaseReply, RemoteError> {
        self.lease_op(key, op, deadline)
    }

    fn ping(&self, deadline: Instant) -> Result<(), RemoteError> {
        self.objects.ping(deadline)
    }

    fn scan(&self, pattern: &str, deadline: Instant) -> Result<Vec<String>, RemoteError> {
        let literal = pattern.split('*').next().unwrap_or_default();
        let listed = self.objects.list(&self.object(literal), deadline)?;
        Ok(listed
            .into_iter()
            .filter_map(|l| {
                let key = l.key.strip_prefix(&self.prefix)?.to_owned();
                crate::glob::matches(pattern, &key).then_some(key)
            })
            .collect())
    }
}

fn hash(value: &[u8]) -> u64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    // A fixed seed: the same value hashes the same for the life of the process.
    let mut h =
        std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
            .build_hasher();
    h.write(value);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn an_address_names_a_bucket_and_a_prefix_and_bad_ones_are_said() {
        let vars = &[
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:9000"),
            ("AWS_REGION", "eu-west-1"),
        ];
        let r = S3Remote::open("s3://team-cache/gpu/h100/", env(vars)).expect("valid");
        assert_eq!(r.prefix, "gpu/h100/");
        assert_eq!(r.object("k"), "gpu/h100/k");
        assert_eq!(
            r.describe(),
            "s3://team-cache/gpu/h100 at http://127.0.0.1:9000"
        );
        let r = S3Remote::open("s3://team-cache", env(vars)).expect("valid");
        assert_eq!(r.object("k"), "k");
        // Without an endpoint: AWS's for the region.
        let r = S3Remote::open("s3://team-cache/x", env(&[("AWS_REGION", "eu-west-1")]))
            .expect("valid");
        assert!(
            r.describe().ends_with("https://s3.eu-west-1.amazonaws.com"),
            "{}",
            r.describe()
        );
        for (address, why) in [
            ("s3://ab/x", "bucket name"),
            ("s3://Upper/x", "bucket name"),
            ("redis://x", "not an s3:// address"),
            ("s3://team-cache/a/../b", "`..` segment"),
            ("s3://team-cache/./b", "`..` segment"),
        ] {
            let e = S3Remote::open(address, env(vars))
                .expect_err(address)
                .to_string();
            assert!(e.contains(why), "{address}: {e}");
        }
        let half = &[("AWS_ACCESS_KEY_ID", "key")];
        let e = S3Remote::open("s3://team-cache", env(half)).expect_err("half credentials");
        assert!(e.to_string().contains("go together"), "{e}");
        let e = S3Remote::open("s3://team-cache", env(&[("AWS_ENDPOINT_URL", "ftp://x")]))
            .expect_err("ftp");
        assert!(e.to_string().contains("AWS_ENDPOINT_URL"), "{e}");
    }
}
