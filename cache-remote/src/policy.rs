//! The shared tier's policy around a [`Remote`], the same for every backend and for every
//! user (a cache's tier, the CLI's [`crate::SharedTier`]): the key layout, the checks on every
//! value read, the circuit breaker and the counters.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cache_format::{Entry, Limits, Origin, Scope};
use cache_migrate::Migrations;

use crate::breaker::Breaker;
use crate::health::{Counters, RemoteHealth};
use crate::layout::Layout;
use crate::options::{RemoteMode, RemoteOptions};
use crate::store::{Read, Remote, RemoteError};
use crate::value::{Expect, Rejection, check_value};

/// Keys read per round trip when pulling or listing, at most...
const PULL_BATCH: usize = 500;
/// ...and at most this many bytes of values (each value is cut at the value cap), so a pull
/// of a server holding oversized values never holds more than this at once.
const PULL_BYTES: usize = 16 << 20;

/// One application and schema's use of a remote.
#[derive(Debug)]
pub(crate) struct Policy {
    pub(crate) remote: Arc<dyn Remote>,
    pub(crate) options: RemoteOptions,
    pub(crate) registry: Arc<Migrations>,
    pub(crate) limits: Limits,
    pub(crate) layout: Layout,
    pub(crate) describe: String,
    breaker: Mutex<Breaker>,
    pub(crate) counters: Counters,
    /// The store denied a write (permissions): this tier reads only from then on.
    denied: std::sync::atomic::AtomicBool,
    /// Calls the store answered (a reply of any kind, not a time-out or a broken connection):
    /// what shows a closing tier that a store still answers.
    pub(crate) answered: std::sync::atomic::AtomicU64,
}

impl Policy {
    pub(crate) fn new(
        remote: Arc<dyn Remote>,
        options: RemoteOptions,
        registry: Arc<Migrations>,
        limits: Limits,
    ) -> Self {
        let describe = remote.describe();
        Policy {
            layout: Layout::new(registry.app(), registry.current()),
            remote,
            options,
            registry,
            limits,
            describe,
            breaker: Mutex::new(Breaker::default()),
            counters: Counters::default(),
            denied: std::sync::atomic::AtomicBool::new(false),
            answered: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Whether this tier writes: its mode says so, and the store has not denied a write.
    pub(crate) fn writes(&self) -> bool {
        self.options.writes() && !self.denied.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn reject(&self, why: Rejection) {
        self.counters.reject(why);
    }

    /// Whether a call may go out now; counts a skipped call otherwise.
    pub(crate) fn allow(&self, probe: Duration) -> bool {
        let ok = crate::lock(&self.breaker).allow(Instant::now(), probe);
        if !ok {
            Counters::bump(&self.counters.skipped, 1);
        }
        ok
    }

    /// Counts a call's outcome and moves the breaker: an outage opens it (one warning per
    /// outage), a full server pauses writes for the cool-down (one warning), a success
    /// closes it.
    pub(crate) fn outcome<T>(&self, result: &Result<T, RemoteError>) {
        if result.as_ref().err().is_none_or(|e| !e.is_outage()) {
            self.answered
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let e = match result {
            Ok(_) => {
                if crate::lock(&self.breaker).success() {
                    tracing::info!(
                        "tunecache: the shared tier at {} answers again",
                        self.describe
                    );
                }
                return;
            }
            Err(e) => e,
        };
        if matches!(e, RemoteError::Timeout(_)) {
            Counters::bump(&self.counters.timeouts, 1);
        } else {
            Counters::bump(&self.counters.errors, 1);
        }
        if let RemoteError::Denied(_) = e {
            if !self.denied.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(
                    "tunecache: the shared tier at {} denies writes ({e}); reading only from now on",
                    self.describe
                );
            }
        } else if let RemoteError::Full(_) = e {
            let first = {
                let mut b = crate::lock(&self.breaker);
                let first = b.full_until.is_none_or(|t| t <= Instant::now());
                b.full_until = Some(cache_core::deadline_after(self.options.full_cooldown));
                first
            };
            if first {
                tracing::warn!(
                    "tunecache: the shared tier at {} is full ({e}); not publishing for {:?}, \
                     reading as before",
                    self.describe,
                    self.options.full_cooldown
                );
            }
        } else if e.is_outage() && crate::lock(&self.breaker).failure(Instant::now()) {
            tracing::warn!(
                "tunecache: the shared tier at {} failed ({e}); going on with the local cache \
                 and retrying in the background",
                self.describe
            );
        }
    }

    /// Whether writes are paused because the server was full.
    pub(crate) fn full(&self) -> bool {
        crate::lock(&self.breaker)
            .full_until
            .is_some_and(|t| t > Instant::now())
    }

    /// When the breaker lets the next call out (`None`: now).
    pub(crate) fn retry_at(&self) -> Option<Instant> {
        let b = crate::lock(&self.breaker);
        let full = b.full_until.filter(|t| *t > Instant::now());
        b.open_until().into_iter().chain(full).max()
    }

    /// How values are read: cut at the value cap (nothing longer crosses the network), with
    /// `touch` refreshing their time to live.
    pub(crate) fn read(&self, touch: Option<Duration>) -> Read {
        Read {
            touch,
            limit: self.options.max_value_bytes,
        }
    }

    /// Checks a value read for `expect`'s key; counts a refusal.
    pub(crate) fn check(&self, bytes: &[u8], expect: Expect<'_>) -> Option<(Scope, Entry)> {
        check_value(bytes, &self.registry, &self.limits, &self.options, expect)
            .map_err(|why| self.reject(why))
            .ok()
    }

    /// How many keys a pull reads per round trip: up to 500, and no more than 16 MiB of
    /// values at the value cap.
    pub(crate) fn pull_batch(&self) -> usize {
        let read = self.read(None);
        (PULL_BYTES / read.limit.saturating_add(1)).clamp(1, PULL_BATCH)
    }

    /// Reads `keys` (of this application and schema), up to 500 per round trip, checking
    /// each value against what its key says; returns what passed, with its namespace, and
    /// origin `remote`.
    pub(crate) fn read_keys(
        &self,
        keys: &[String],
        deadline: Instant,
    ) -> Result<Vec<(Scope, String, Entry)>, RemoteError> {
        let mut out = Vec::new();
        let read = self.read(None);
        for batch in keys.chunks(self.pull_batch()) {
            let values = self.remote.get_many(batch, read, deadline);
            self.outcome(&values);
            for (key, value) in batch.iter().zip(values?) {
                let Some(bytes) = value else { continue };
                let Some((scope_fp, ns, fp)) = self.layout.parse(key) else {
                    self.reject("foreign key");
                    continue;
                };
                let expect = Expect {
                    scope: &scope_fp,
                    ns: &ns,
                    fp: &fp,
                };
                if let Some((scope, mut entry)) = self.check(&bytes, expect) {
                    Counters::bump(&self.counters.hits, 1);
                    entry.set_origin(self.remote_origin(entry.origin()));
                    out.push((scope, ns, entry));
                }
            }
        }
        Ok(out)
    }

    /// The keys matching `pattern`, counted like any call.
    pub(crate) fn scan(
        &self,
        pattern: &str,
        deadline: Instant,
    ) -> Result<Vec<String>, RemoteError> {
        let keys = self.remote.scan(pattern, deadline);
        self.outcome(&keys);
        keys
    }

    /// The origin of an entry read from the server: the server, and who recorded it there
    /// (so `explain` says whose result a process is using).
    pub(crate) fn remote_origin(&self, recorded: &Origin) -> Origin {
        Origin::Remote(match recorded {
            Origin::Measured(by) => format!("{}, measured on {by}", self.describe),
            Origin::Imported(from) => format!("{}, imported from {from}", self.describe),
            Origin::Remote(_) => self.describe.clone(),
        })
    }

    pub(crate) fn health(&self, pending: usize) -> RemoteHealth {
        let c = &self.counters;
        let breaker = crate::lock(&self.breaker).state();
        RemoteHealth {
            describe: self.describe.clone(),
            mode: if self.writes() || self.options.mode == RemoteMode::Off {
                self.options.mode
            } else {
                RemoteMode::Read
            },
            hits: Counters::get(&c.hits),
            misses: Counters::get(&c.misses),
            timeouts: Counters::get(&c.timeouts),
            errors: Counters::get(&c.errors),
            skipped: Counters::get(&c.skipped),
            rejected: c.rejected(),
            published: Counters::get(&c.published),
            unchanged: Counters::get(&c.unchanged),
            conflicts: Counters::get(&c.conflicts),
            pending,
            leases: Counters::get(&c.leases),
            lease_waits: Counters::get(&c.lease_waits),
            takeovers: Counters::get(&c.takeovers),
            breaker,
            full: self.full(),
        }
    }
}
