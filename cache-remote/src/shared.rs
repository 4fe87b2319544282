//! The shared tier for tools that use it without a [`cache_core::Cache`] (the CLI's `get`,
//! `put`, `import` and `remote`): the same key layout, checks, breaker and counters.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cache_core::Namespace;
use cache_format::{CacheData, Entry, Fingerprint, Limits, Scope};
use cache_migrate::Migrations;

use crate::health::{Counters, RemoteHealth};
use crate::lease::Fences;
use crate::options::RemoteOptions;
use crate::policy::Policy;
use crate::store::{Remote, RemoteError};

/// What a publication by [`SharedTier::publish`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Published {
    /// Entries written (new, or merged with what the server held).
    pub written: u64,
    /// Entries the server already held in full.
    pub unchanged: u64,
    /// Entries refused before writing (too large, a namespace no cache accepts).
    pub refused: u64,
    /// Entries not published: lost races every round, or the round stopped on an error.
    pub left: usize,
}

/// Keys a pull reads and hands over at a time.
const PULL_STEP: usize = 64;

/// How many keys a pull asks about between two looks at the clock (each look also reads the
/// lacking keys found since the last one).
const CHECK_EVERY: usize = 1024;

/// How far [`SharedTier::pull`] got.
#[derive(Debug, Clone, Default)]
pub struct Pulled {
    /// Keys of this application and schema found on the server.
    pub keys: usize,
    /// Keys read (their values checked and handed over, or refused), in batches.
    pub read: usize,
    /// Entries handed over (they passed every check).
    pub entries: usize,
    /// Values refused, by reason.
    pub rejected: BTreeMap<&'static str, u64>,
    /// Why it stopped before reading every key (the wait ran out, the store failed), if it
    /// did: what was handed over before stands.
    pub stopped: Option<RemoteError>,
}

/// The shared tier of one application and schema, without a cache.
#[derive(Debug)]
pub struct SharedTier {
    policy: Policy,
}

impl SharedTier {
    /// The tier of `registry`'s application and current schema on `remote`.
    pub fn new(remote: Arc<dyn Remote>, options: RemoteOptions, registry: Migrations) -> Self {
        SharedTier {
            policy: Policy::new(remote, options, Arc::new(registry), Limits::default()),
        }
    }

    /// Where it is (no password).
    pub fn describe(&self) -> &str {
        &self.policy.describe
    }

    /// One round trip within `timeout`; returns how long it took.
    pub fn ping(&self, timeout: Duration) -> Result<Duration, RemoteError> {
        let started = Instant::now();
        let result = self
            .policy
            .remote
            .ping(cache_core::deadline_from(started, timeout));
        self.policy.outcome(&result);
        result.map(|()| started.elapsed())
    }

    /// The entries stored for key `fp` of namespace `ns`: in `scope`, or in every scope the
    /// server holds (a key listing). Values that fail a check are left out and counted.
    pub fn find(
        &self,
        ns: &str,
        fp: &Fingerprint,
        scope: Option<&Scope>,
        timeout: Duration,
    ) -> Result<Vec<(Scope, Entry)>, RemoteError> {
        let deadline = cache_core::deadline_after(timeout);
        let keys = match scope {
            Some(scope) => vec![self.policy.layout.key(scope, ns, fp)],
            None => self
                .policy
                .scan(&self.policy.layout.key_pattern(ns, fp), deadline)?,
        };
        Ok(self
            .policy
            .read_keys(&keys, deadline)?
            .into_iter()
            .map(|(scope, _, entry)| (scope, entry))
            .collect())
    }

    /// Every entry of this application and schema on the server, checked: a key listing,
    /// then reads of up to 500 keys per round trip, all within `timeout`, each batch handed to
    /// `take` as it arrives (with origin `remote`), so what was read is kept when the time runs
    /// out. Keys `first` says yes to (scope fingerprint, namespace, key fingerprint: say, those
    /// the local cache lacks) are read first, so a pull cut short and run again goes on where
    /// it stopped. An `Err` only when the listing fails or `take` does.
    pub fn pull<E: From<RemoteError>>(
        &self,
        timeout: Duration,
        first: impl Fn(&Fingerprint, &str, &Fingerprint) -> bool,
        mut take: impl FnMut(CacheData) -> Result<(), E>,
    ) -> Result<Pulled, E> {
        let deadline = cache_core::deadline_after(timeout);
        let keys = self.all_keys(deadline)?;
        let before = self.policy.counters.rejected();
        let mut pulled = Pulled {
            keys: keys.len(),
            ..Pulled::default()
        };
        // Small batches: each is kept as it arrives, so a slow store (an object store reads
        // each key with a request of its own) keeps what it gave before the time ran out.
        let step = self.policy.pull_batch().clamp(1, PULL_STEP);
        // The keys `first` says yes to are read as they are found, in the server's order: a
        // pull run again starts reading at once, whatever the keys the cache already has
        // (each is asked about once; a walk over them all first would spend a short wait on
        // asking). The others are read after.
        let mut wanted: Vec<&String> = Vec::with_capacity(step);
        let mut later: Vec<&String> = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            if i % CHECK_EVERY == CHECK_EVERY - 1 {
                if Instant::now() >= deadline {
                    // Asking about a million keys takes a while: the wait bounds it too.
                    pulled.stopped = Some(RemoteError::Timeout(
                        "the wait ran out while finding the keys this cache lacks".to_owned(),
                    ));
                    return Ok(self.rejected_since(before, pulled));
                }
                // Few keys lacking among many: those found so far are read now, not once a
                // whole batch is found, so a short wait on a slow machine still reads some.
                if !wanted.is_empty() {
                    let batch = std::mem::take(&mut wanted);
                    if !self.pull_batch(&batch, deadline, &mut pulled, &mut take)? {
                        return Ok(self.rejected_since(before, pulled));
                    }
                }
            }
            let lacks = self
                .policy
                .layout
                .parse(key)
                .is_some_and(|(scope, ns, fp)| first(&scope, &ns, &fp));
            if !lacks {
                later.push(key);
                continue;
            }
            wanted.push(key);
            if wanted.len() == step {
                let batch = std::mem::take(&mut wanted);
                if !self.pull_batch(&batch, deadline, &mut pulled, &mut take)? {
                    return Ok(self.rejected_since(before, pulled));
                }
            }
        }
        later.splice(0..0, wanted);
        for batch in later.chunks(step) {
            if !self.pull_batch(batch, deadline, &mut pulled, &mut take)? {
                break;
            }
        }
        Ok(self.rejected_since(before, pulled))
    }

    /// Reads one batch of a pull and hands what passed to `take`. `false`: the pull stops
    /// (the wait ran out or the store failed; `pulled.stopped` says which).
    fn pull_batch<E>(
        &self,
        batch: &[&String],
        deadline: Instant,
        pulled: &mut Pulled,
        take: &mut impl FnMut(CacheData) -> Result<(), E>,
    ) -> Result<bool, E> {
        let owned: Vec<String> = batch.iter().map(|k| (*k).clone()).collect();
        let read = match self.policy.read_keys(&owned, deadline) {
            Ok(read) => read,
            Err(e) => {
                pulled.stopped = Some(e);
                return Ok(false);
            }
        };
        pulled.read += batch.len();
        pulled.entries += read.len();
        let mut data = CacheData::new();
        for (scope, ns, entry) in read {
            data.insert(&scope, &ns, entry);
        }
        if !data.is_empty() {
            take(data)?;
        }
        Ok(true)
    }

    /// `pulled` with the values refused since the counts `before`.
    fn rejected_since(&self, before: BTreeMap<&'static str, u64>, mut pulled: Pulled) -> Pulled {
        let mut rejected = self.policy.counters.rejected();
        for (why, n) in before {
            if let Some(now) = rejected.get_mut(why) {
                *now -= n;
            }
        }
        rejected.retain(|_, n| *n > 0);
        pulled.rejected = rejected;
        pulled
    }

    /// How many keys of this application and schema the server holds.
    pub fn count(&self, timeout: Duration) -> Result<usize, RemoteError> {
        self.all_keys(cache_core::deadline_after(timeout))
            .map(|k| k.len())
    }

    /// The fleet leases of this application and schema held now, as (lease key, holder);
    /// lease keys holding something tunecache did not write are left out.
    pub fn leases(&self, timeout: Duration) -> Result<Vec<(String, String)>, RemoteError> {
        let deadline = cache_core::deadline_after(timeout);
        let pattern = format!("{{{}*}}:lease", self.policy.layout.prefix());
        let mut held = Vec::new();
        for key in self.policy.scan(&pattern, deadline)? {
            let peek = self
                .policy
                .remote
                .lease(&key, crate::LeaseOp::Peek, deadline);
            self.policy.outcome(&peek);
            if let crate::LeaseReply::Held { value, .. } = peek?
                && crate::lease::is_ours(&value)
            {
                held.push((key, crate::lease::holder(&value)));
            }
        }
        Ok(held)
    }

    fn all_keys(&self, deadline: Instant) -> Result<Vec<String>, RemoteError> {
        let pattern = format!("{}*", self.policy.layout.prefix());
        self.policy.scan(&pattern, deadline)
    }

    /// How long a publication may take on this store (its options' publish budget).
    pub fn publish_budget(&self) -> Duration {
        self.policy.options.publish_budget
    }

    /// Publishes every entry of `data` (any scope), merged with what the server holds, within
    /// `timeout`.
    pub fn publish(&self, data: &CacheData, timeout: Duration) -> Result<Published, RemoteError> {
        let deadline = cache_core::deadline_after(timeout);
        let counters = &self.policy.counters;
        let before = (
            Counters::get(&counters.published),
            Counters::get(&counters.unchanged),
        );
        let mut report = Published::default();
        let mut error = None;
        for (scope, scope_data) in data.scopes() {
            let mut entries = Vec::new();
            for (ns, by_fp) in scope_data.namespaces() {
                let Ok(ns) = Namespace::new(ns) else {
                    report.refused += by_fp.len() as u64;
                    continue;
                };
                // Every entry, whatever its origin: one pulled from the server and since joined
                // with a measurement made here has more than the server (a pull followed by a
                // push writes nothing where the server holds it all: the merge says so).
                entries.extend(by_fp.values().map(|e| (ns, e.clone())));
            }
            let outcome = crate::publish::publish(
                &self.policy,
                scope,
                entries,
                deadline,
                true,
                &Fences::new(),
            );
            report.left += outcome.left.len();
            if let Some(e) = outcome.error {
                error = Some(e);
            }
        }
        report.written = Counters::get(&counters.published) - before.0;
        report.unchanged = Counters::get(&counters.unchanged) - before.1;
        match error {
            Some(e) if report.written + report.unchanged == 0 => Err(e),
            _ => Ok(report),
        }
    }

    /// The counters so far.
    pub fn health(&self) -> RemoteHealth {
        self.policy.health(0)
    }
}
