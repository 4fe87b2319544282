//! The shared (remote) tier: what one machine measured, the others reuse.
//!
//! [`Remote`] is the small trait a shared store implements (cache-remote implements it on
//! Redis); every call takes a deadline and none may block past it. [`MemoryRemote`] is an
//! in-process implementation for tests. The policy around it lives here, so every backend
//! gets it: the key layout, the value (one entry in the same checked snapshot envelope as
//! files, read through the same version gate and migration), the checks a remote entry must
//! pass before it is used, a circuit breaker that keeps an unreachable server off the
//! caller's path, and the counters.
//!
//! A [`crate::Cache`] with a remote reads it on a local miss only (a hit never touches the
//! network) and publishes what was measured here from a background thread, merging with what
//! the server holds by the one merge rule ([`cache_format::Entry::merge`]) through a bounded
//! compare-and-set loop.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cache_format::{CacheData, Entry, Fingerprint, Limits, Origin, Outcome, Scope, now_millis};
use cache_migrate::{MigrateError, Migrations};

use crate::namespace::Namespace;

/// The key prefix's format salt: changes whenever the key layout or the value's meaning does,
/// so builds that disagree never read each other's values.
pub const KEY_SALT: &str = "tc1";

/// A shared store of byte values under string keys. Implementations must return (with
/// [`RemoteError::Timeout`] if need be) by the deadline, connecting included, and must not
/// panic on any reply.
pub trait Remote: Send + Sync + fmt::Debug {
    /// Where it is, for messages: never a password.
    fn describe(&self) -> String;

    /// The values of `keys`, in order, in one round trip. With `touch`, each key found gets
    /// that time to live from now (a write: only in read-write mode).
    fn get_many(
        &self,
        keys: &[String],
        touch: Option<Duration>,
        deadline: Instant,
    ) -> Result<Vec<Option<Vec<u8>>>, RemoteError>;

    /// For each swap, in one round trip: sets `value` (with `ttl`, if any) if the key still
    /// holds `expected` (`None`: the key is absent), atomically per key. Returns, per swap,
    /// whether it was set.
    fn compare_and_set_many(
        &self,
        swaps: &[Swap<'_>],
        ttl: Option<Duration>,
        deadline: Instant,
    ) -> Result<Vec<bool>, RemoteError>;

    /// One round trip that changes nothing, to check the connection.
    fn ping(&self, deadline: Instant) -> Result<(), RemoteError>;

    /// The keys matching `pattern` (a glob where only `*` is special), for tools that pull or
    /// count (`tunecache remote`); never on a cache's path. A backend that cannot list keys
    /// refuses.
    fn scan(&self, pattern: &str, deadline: Instant) -> Result<Vec<String>, RemoteError> {
        let _ = (pattern, deadline);
        Err(RemoteError::Refused(
            "this shared store cannot list its keys".to_owned(),
        ))
    }
}

/// One compare-and-set of [`Remote::compare_and_set_many`].
#[derive(Debug, Clone, Copy)]
pub struct Swap<'a> {
    /// The key.
    pub key: &'a str,
    /// The value it must hold for the swap to happen (`None`: it must be absent).
    pub expected: Option<&'a [u8]>,
    /// The new value.
    pub value: &'a [u8],
}

/// Why a call to the shared store failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemoteError {
    /// The deadline passed (a server that accepts but does not answer, a slow network).
    #[error("timed out: {0}")]
    Timeout(String),
    /// No connection could be made or it broke.
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// The server refuses writes because its memory is full.
    #[error("server full: {0}")]
    Full(String),
    /// The server refused the command (permissions, a read-only replica, a bad script).
    #[error("refused: {0}")]
    Refused(String),
    /// A reply that does not fit the request.
    #[error("unexpected reply: {0}")]
    Protocol(String),
}

impl RemoteError {
    /// Whether this is an outage (the breaker opens) rather than a refusal.
    pub fn is_outage(&self) -> bool {
        matches!(self, RemoteError::Timeout(_) | RemoteError::Unreachable(_))
    }
}

/// What a cache does with its remote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RemoteMode {
    /// Nothing.
    Off,
    /// Reads on a local miss; never writes (not even a time-to-live refresh).
    Read,
    /// Reads on a local miss and publishes what was measured here.
    #[default]
    ReadWrite,
}

impl std::str::FromStr for RemoteMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" | "0" | "none" => Ok(RemoteMode::Off),
            "read" | "read-only" | "ro" => Ok(RemoteMode::Read),
            "read-write" | "rw" | "readwrite" => Ok(RemoteMode::ReadWrite),
            other => Err(format!(
                "remote mode {other:?}: expected off, read or read-write"
            )),
        }
    }
}

impl fmt::Display for RemoteMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RemoteMode::Off => "off",
            RemoteMode::Read => "read",
            RemoteMode::ReadWrite => "read-write",
        })
    }
}

/// How a cache uses its remote.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// What it does.
    pub mode: RemoteMode,
    /// The most one read on a miss may take, connecting included (default 50 ms).
    pub budget: Duration,
    /// The most one publication round may take (default 2 s); it runs in the background.
    pub publish_budget: Duration,
    /// How long a value lives on the server after it was last written or read (default 30
    /// days; `None`: for ever).
    pub ttl: Option<Duration>,
    /// Values larger than this are neither read nor written (default 256 KiB).
    pub max_value_bytes: usize,
    /// A remote entry whose measured candidates have fewer samples is refused (default 1).
    pub min_samples: u32,
    /// How long a key the remote did not have is not asked for again (default 30 s).
    pub negative_ttl: Duration,
    /// How long a full server is left alone for writes (default 60 s).
    pub full_cooldown: Duration,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            mode: RemoteMode::ReadWrite,
            budget: Duration::from_millis(50),
            publish_budget: Duration::from_secs(2),
            ttl: Some(Duration::from_secs(30 * 24 * 3600)),
            max_value_bytes: 256 << 10,
            min_samples: 1,
            negative_ttl: Duration::from_secs(30),
            full_cooldown: Duration::from_secs(60),
        }
    }
}

/// The state of the circuit breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go to the server.
    Closed,
    /// The server failed; calls are skipped until the next probe.
    Open {
        /// Failures in a row.
        failures: u32,
    },
}

/// What the shared tier did, for `Health` and `tunecache stats`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteHealth {
    /// Where it is (no password).
    pub describe: String,
    /// What the cache does with it.
    pub mode: RemoteMode,
    /// Misses read from the remote and used.
    pub hits: u64,
    /// Misses the remote did not have either.
    pub misses: u64,
    /// Calls that passed their deadline.
    pub timeouts: u64,
    /// Calls that failed otherwise.
    pub errors: u64,
    /// Reads skipped because the breaker was open.
    pub skipped: u64,
    /// Remote values refused, by reason.
    pub rejected: BTreeMap<&'static str, u64>,
    /// Entries written to the server.
    pub published: u64,
    /// Entries the server already held in full (nothing written).
    pub unchanged: u64,
    /// Compare-and-set attempts that lost to another writer (and were retried).
    pub conflicts: u64,
    /// Entries waiting to be published.
    pub pending: usize,
    /// The breaker.
    pub breaker: BreakerState,
    /// Whether writes are paused because the server was full.
    pub full: bool,
}

/// A value and when it expires.
type Stored = (Vec<u8>, Option<Instant>);

/// An in-process [`Remote`] for tests: a map with time-to-live, a command counter, and
/// switches to make it fail. Not a shared tier: it lives and dies with the process.
#[derive(Debug, Default)]
pub struct MemoryRemote {
    name: String,
    map: Mutex<HashMap<String, Stored>>,
    /// Commands received (one per key of a batch).
    pub commands: AtomicU64,
    /// Commands that write.
    pub writes: AtomicU64,
    fail: Mutex<Option<RemoteError>>,
}

impl MemoryRemote {
    /// An empty one.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty one that names itself `memory:<name>` in messages.
    pub fn named(name: &str) -> Self {
        MemoryRemote {
            name: name.to_owned(),
            ..Self::default()
        }
    }

    /// Makes every call fail with `error` (or succeed again with `None`).
    pub fn fail_with(&self, error: Option<RemoteError>) {
        *self.map_lock(&self.fail) = error;
    }

    /// Sets a raw value (e.g. a crafted one).
    pub fn insert(&self, key: &str, value: Vec<u8>) {
        self.map_lock(&self.map)
            .insert(key.to_owned(), (value, None));
    }

    /// The raw value of a key.
    pub fn value(&self, key: &str) -> Option<Vec<u8>> {
        let now = Instant::now();
        self.map_lock(&self.map)
            .get(key)
            .filter(|(_, exp)| exp.is_none_or(|e| e > now))
            .map(|(v, _)| v.clone())
    }

    /// Every live key.
    pub fn keys(&self) -> Vec<String> {
        let now = Instant::now();
        let mut keys: Vec<String> = self
            .map_lock(&self.map)
            .iter()
            .filter(|(_, (_, exp))| exp.is_none_or(|e| e > now))
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort();
        keys
    }

    fn map_lock<'a, T>(&self, m: &'a Mutex<T>) -> std::sync::MutexGuard<'a, T> {
        m.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn check(&self) -> Result<(), RemoteError> {
        match &*self.map_lock(&self.fail) {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

impl Remote for MemoryRemote {
    fn describe(&self) -> String {
        format!("memory:{}", self.name)
    }

    fn get_many(
        &self,
        keys: &[String],
        touch: Option<Duration>,
        _deadline: Instant,
    ) -> Result<Vec<Option<Vec<u8>>>, RemoteError> {
        self.check()?;
        self.commands
            .fetch_add(keys.len() as u64, Ordering::Relaxed);
        if touch.is_some() {
            self.writes.fetch_add(keys.len() as u64, Ordering::Relaxed);
        }
        let now = Instant::now();
        let mut map = self.map_lock(&self.map);
        Ok(keys
            .iter()
            .map(|k| {
                let (value, exp) = map.get_mut(k)?;
                if exp.is_some_and(|e| e <= now) {
                    return None;
                }
                if let Some(ttl) = touch {
                    *exp = Some(now + ttl);
                }
                Some(value.clone())
            })
            .collect())
    }

    fn compare_and_set_many(
        &self,
        swaps: &[Swap<'_>],
        ttl: Option<Duration>,
        _deadline: Instant,
    ) -> Result<Vec<bool>, RemoteError> {
        self.check()?;
        self.commands
            .fetch_add(swaps.len() as u64, Ordering::Relaxed);
        self.writes.fetch_add(swaps.len() as u64, Ordering::Relaxed);
        let now = Instant::now();
        let mut map = self.map_lock(&self.map);
        Ok(swaps
            .iter()
            .map(|s| {
                let current = map
                    .get(s.key)
                    .filter(|(_, exp)| exp.is_none_or(|e| e > now))
                    .map(|(v, _)| v.as_slice());
                if current != s.expected {
                    return false;
                }
                map.insert(s.key.to_owned(), (s.value.to_vec(), ttl.map(|t| now + t)));
                true
            })
            .collect())
    }

    fn ping(&self, _deadline: Instant) -> Result<(), RemoteError> {
        self.check()?;
        self.commands.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn scan(&self, pattern: &str, _deadline: Instant) -> Result<Vec<String>, RemoteError> {
        self.check()?;
        self.commands.fetch_add(1, Ordering::Relaxed);
        Ok(self
            .keys()
            .into_iter()
            .filter(|k| glob(pattern, k))
            .collect())
    }
}

/// Whether `text` matches `pattern`, where `*` matches any run of bytes.
fn glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || !text[first.len()..].ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    true
}

/// The key of one entry on the server: the salt, then application, schema, scope
/// fingerprint, namespace and key fingerprint, separated by `:` (FORMAT.md, "Shared tier").
/// The application and namespace are percent-escaped (every byte but ASCII letters, digits,
/// `.`, `_` and `-`), so no field can contain the separator.
pub fn remote_key(
    app: &str,
    schema: u32,
    scope: &Fingerprint,
    ns: &str,
    fp: &Fingerprint,
) -> String {
    let mut key = format!("{KEY_SALT}:");
    escape_into(&mut key, app);
    key.push_str(&format!(":{schema}:{scope}:"));
    escape_into(&mut key, ns);
    key.push(':');
    key.push_str(&fp.to_hex());
    key
}

fn escape_into(out: &mut String, s: &str) {
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

/// The value stored for one entry: a snapshot (FORMAT.md) holding that one entry in its
/// scope and namespace.
pub fn encode_value(registry: &Migrations, scope: &Scope, ns: &str, entry: &Entry) -> Vec<u8> {
    let mut data = CacheData::new();
    data.insert(scope, ns, entry.clone());
    cache_format::encode_snapshot(registry.app(), registry.current(), &data)
}

/// How far ahead of this machine's clock a remote timestamp may be.
const FUTURE_SLACK_MS: u64 = 60_000;

/// Why a remote value was refused: the counter it goes to.
pub(crate) type Rejection = &'static str;

/// Checks a remote value for `(ns, fp)` as every read path checks a file, then the poisoning
/// filters; returns the entry as stored (origin untouched).
pub(crate) fn check_value(
    bytes: &[u8],
    registry: &Migrations,
    limits: &Limits,
    options: &RemoteOptions,
    scope: &Fingerprint,
    ns: &str,
    fp: &Fingerprint,
) -> Result<(Scope, Entry), Rejection> {
    if bytes.len() > options.max_value_bytes {
        return Err("oversized");
    }
    let snap = cache_format::read_snapshot(bytes, limits).map_err(|_| "damaged")?;
    let upgraded = cache_migrate::upgrade(
        registry,
        snap.format,
        &snap.header.app,
        snap.header.schema,
        snap.payload_bytes(),
        limits,
    )
    .map_err(|e| match e {
        MigrateError::Foreign { .. } => "foreign application",
        MigrateError::NewerSchema { .. } => "newer schema",
        _ => "not migratable",
    })?;
    let data = upgraded.data;
    if data.len() != 1 {
        return Err("not one entry");
    }
    let (found_scope, found_ns, entry) = data.entries().next().ok_or("not one entry")?;
    if found_scope.fingerprint() != *scope {
        return Err("wrong scope");
    }
    if found_ns != ns || entry.fingerprint() != *fp {
        return Err("wrong key");
    }
    crate::cache::check_entry(found_scope, ns, entry, limits).map_err(|_| "unreadable entry")?;
    let latest = now_millis().saturating_add(FUTURE_SLACK_MS);
    if entry.recorded_at() > latest || entry.candidates().iter().any(|c| c.measured_at > latest) {
        return Err("future timestamp");
    }
    let implausible = entry.candidates().iter().any(|c| match &c.outcome {
        Outcome::Measured(s) => {
            s.median_ns < 0.0
                || s.min_ns < 0.0
                || s.spread_ns < 0.0
                || s.min_ns > s.median_ns
                || s.samples < options.min_samples
        }
        Outcome::Failed(_) => false,
    });
    if implausible {
        return Err("implausible statistics");
    }
    Ok((found_scope.clone(), entry.clone()))
}

/// The circuit breaker: after an outage, calls are skipped for a back-off that doubles from
/// 100 ms up to 2 s; when it has passed, one caller probes (the others keep skipping) and
/// either closes the breaker or opens it again for longer. One warning per outage.
#[derive(Debug, Default)]
struct Breaker {
    failures: u32,
    open_until: Option<Instant>,
    full_until: Option<Instant>,
}

const BREAKER_FIRST: Duration = Duration::from_millis(100);
const BREAKER_MAX: Duration = Duration::from_secs(2);

impl Breaker {
    /// Whether a call may go out now. A call after the back-off is the probe: others wait
    /// for its outcome (at most `probe`).
    fn allow(&mut self, now: Instant, probe: Duration) -> bool {
        match self.open_until {
            None => true,
            Some(t) if now >= t => {
                self.open_until = Some(now + probe);
                true
            }
            Some(_) => false,
        }
    }

    /// Records an outage; returns whether it is a new one (to warn once).
    fn failure(&mut self, now: Instant) -> bool {
        self.failures = self.failures.saturating_add(1);
        let backoff = BREAKER_FIRST
            .saturating_mul(1 << (self.failures - 1).min(8))
            .min(BREAKER_MAX);
        self.open_until = Some(now + backoff);
        self.failures == 1
    }

    /// Records a success; returns whether it ends an outage.
    fn success(&mut self) -> bool {
        let recovered = self.failures > 0;
        self.failures = 0;
        self.open_until = None;
        recovered
    }

    fn state(&self) -> BreakerState {
        if self.failures == 0 {
            BreakerState::Closed
        } else {
            BreakerState::Open {
                failures: self.failures,
            }
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    timeouts: AtomicU64,
    errors: AtomicU64,
    skipped: AtomicU64,
    published: AtomicU64,
    unchanged: AtomicU64,
    conflicts: AtomicU64,
    rejected: Mutex<BTreeMap<&'static str, u64>>,
}

/// What a publication round left to do.
#[derive(Debug)]
pub(crate) struct PublishOutcome {
    /// Keys not published yet (an error, a lost race every round): try again later.
    pub(crate) left: Vec<(Namespace, Fingerprint)>,
    /// The error that stopped the round, if any.
    pub(crate) error: Option<RemoteError>,
    /// Entries the server now holds that have more than what was published (another
    /// machine's measurements of the same key, joined in): for the publisher's memory and
    /// file, so every machine's file converges to the fold.
    pub(crate) folded: Vec<(Namespace, Entry)>,
}

/// One compare-and-set of a publication round: the index of its entry, the value expected,
/// the new bytes, and the merged entry if it holds more than what this machine had.
type Write = (usize, Option<Vec<u8>>, Vec<u8>, Option<Entry>);

/// A cache's use of its remote: the policy around [`Remote`] (see the module docs).
#[derive(Debug)]
pub(crate) struct RemoteTier {
    remote: Arc<dyn Remote>,
    options: RemoteOptions,
    registry: Arc<Migrations>,
    limits: Limits,
    scope: Scope,
    describe: String,
    breaker: Mutex<Breaker>,
    counters: Counters,
    /// Keys the remote lacked, and when it was last asked.
    negative: Mutex<HashMap<(Namespace, Fingerprint), Instant>>,
}

/// Past this many remembered misses, the negative cache starts over.
const NEGATIVE_MAX: usize = 100_000;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl RemoteTier {
    pub(crate) fn new(
        remote: Arc<dyn Remote>,
        options: RemoteOptions,
        registry: Arc<Migrations>,
        limits: Limits,
        scope: Scope,
    ) -> Self {
        let describe = remote.describe();
        RemoteTier {
            remote,
            options,
            registry,
            limits,
            scope,
            describe,
            breaker: Mutex::new(Breaker::default()),
            counters: Counters::default(),
            negative: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn writes(&self) -> bool {
        self.options.mode == RemoteMode::ReadWrite
    }

    pub(crate) fn options(&self) -> &RemoteOptions {
        &self.options
    }

    fn key(&self, ns: Namespace, fp: &Fingerprint) -> String {
        self.key_in(&self.scope, ns.name(), fp)
    }

    fn key_in(&self, scope: &Scope, ns: &str, fp: &Fingerprint) -> String {
        remote_key(
            self.registry.app(),
            self.registry.current(),
            &scope.fingerprint(),
            ns,
            fp,
        )
    }

    fn reject(&self, why: Rejection) {
        *lock(&self.counters.rejected).entry(why).or_default() += 1;
    }

    /// Whether a call may go out now; counts a skipped read otherwise.
    fn allow(&self, probe: Duration) -> bool {
        let ok = lock(&self.breaker).allow(Instant::now(), probe);
        if !ok {
            self.counters.skipped.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    fn outcome<T>(&self, result: &Result<T, RemoteError>) {
        match result {
            Ok(_) => {
                if lock(&self.breaker).success() {
                    tracing::info!(
                        "tunecache: the shared tier at {} answers again",
                        self.describe
                    );
                }
            }
            Err(e) => {
                if matches!(e, RemoteError::Timeout(_)) {
                    self.counters.timeouts.fetch_add(1, Ordering::Relaxed);
                } else {
                    self.counters.errors.fetch_add(1, Ordering::Relaxed);
                }
                if let RemoteError::Full(_) = e {
                    let first = {
                        let mut b = lock(&self.breaker);
                        let first = b.full_until.is_none_or(|t| t <= Instant::now());
                        b.full_until = Some(Instant::now() + self.options.full_cooldown);
                        first
                    };
                    if first {
                        tracing::warn!(
                            "tunecache: the shared tier at {} is full ({e}); not publishing \
                             for {:?}, reading as before",
                            self.describe,
                            self.options.full_cooldown
                        );
                    }
                } else if e.is_outage() && lock(&self.breaker).failure(Instant::now()) {
                    tracing::warn!(
                        "tunecache: the shared tier at {} failed ({e}); going on with the \
                         local cache and retrying in the background",
                        self.describe
                    );
                }
            }
        }
    }

    fn full(&self) -> bool {
        lock(&self.breaker)
            .full_until
            .is_some_and(|t| t > Instant::now())
    }

    /// Reads the entries of `keys` (local misses) in one round trip within the budget;
    /// returns those found that pass every check, with origin `remote`. A key the remote
    /// lacked is not asked for again for a while.
    pub(crate) fn fetch(&self, ns: Namespace, fps: &[Fingerprint]) -> Vec<Entry> {
        if self.options.mode == RemoteMode::Off || fps.is_empty() {
            return Vec::new();
        }
        let now = Instant::now();
        let wanted: Vec<Fingerprint> = {
            let negative = lock(&self.negative);
            fps.iter()
                .filter(|fp| {
                    negative
                        .get(&(ns, **fp))
                        .is_none_or(|t| now.duration_since(*t) >= self.options.negative_ttl)
                })
                .copied()
                .collect()
        };
        if wanted.is_empty() || !self.allow(self.options.budget) {
            return Vec::new();
        }
        let keys: Vec<String> = wanted.iter().map(|fp| self.key(ns, fp)).collect();
        let touch = (self.writes() && !self.full())
            .then_some(self.options.ttl)
            .flatten();
        let deadline = now + self.options.budget;
        let mut result = self.remote.get_many(&keys, touch, deadline);
        if touch.is_some() && matches!(result, Err(RemoteError::Full(_))) {
            // Refreshing the time to live is a write, which a full server refuses.
            self.outcome(&result);
            result = self.remote.get_many(&keys, None, deadline);
        }
        self.outcome(&result);
        let Ok(values) = result else {
            return Vec::new();
        };
        let mut found = Vec::new();
        let mut missed = Vec::new();
        for (fp, value) in wanted.iter().zip(values) {
            let Some(bytes) = value else {
                self.counters.misses.fetch_add(1, Ordering::Relaxed);
                missed.push(*fp);
                continue;
            };
            match check_value(
                &bytes,
                &self.registry,
                &self.limits,
                &self.options,
                &self.scope.fingerprint(),
                ns.name(),
                fp,
            ) {
                Ok((_, mut entry)) => {
                    self.counters.hits.fetch_add(1, Ordering::Relaxed);
                    entry.set_origin(Origin::Remote(self.describe.clone()));
                    found.push(entry);
                }
                Err(why) => {
                    self.reject(why);
                    self.counters.misses.fetch_add(1, Ordering::Relaxed);
                    missed.push(*fp);
                }
            }
        }
        if !missed.is_empty() {
            let mut negative = lock(&self.negative);
            if negative.len() + missed.len() > NEGATIVE_MAX {
                negative.clear();
            }
            negative.extend(missed.into_iter().map(|fp| ((ns, fp), now)));
        }
        found
    }

    /// Publishes `entries` (measured here), merged with what the server holds, by a bounded
    /// compare-and-set loop: read the current values, merge, write where nothing changed
    /// meanwhile, and redo the keys that lost a race (at most four rounds).
    ///
    /// `force` (a caller waits for it) probes even while the breaker is open.
    pub(crate) fn publish(
        &self,
        entries: Vec<(Namespace, Entry)>,
        deadline: Instant,
        force: bool,
    ) -> PublishOutcome {
        let scope = self.scope.clone();
        self.publish_in(&scope, entries, deadline, force)
    }

    /// [`RemoteTier::publish`] for entries of `scope` (which need not be the cache's).
    pub(crate) fn publish_in(
        &self,
        scope: &Scope,
        entries: Vec<(Namespace, Entry)>,
        deadline: Instant,
        force: bool,
    ) -> PublishOutcome {
        let all_keys = || {
            entries
                .iter()
                .map(|(ns, e)| (*ns, e.fingerprint()))
                .collect()
        };
        if !self.writes() || entries.is_empty() {
            return PublishOutcome {
                left: Vec::new(),
                error: None,
                folded: Vec::new(),
            };
        }
        if self.full() {
            return PublishOutcome {
                left: all_keys(),
                error: Some(RemoteError::Full("cooling down".to_owned())),
                folded: Vec::new(),
            };
        }
        if !force && !self.allow(self.options.budget) {
            return PublishOutcome {
                left: all_keys(),
                error: Some(RemoteError::Unreachable(
                    "the breaker is open after an outage".to_owned(),
                )),
                folded: Vec::new(),
            };
        }
        let mut folded: Vec<(Namespace, Entry)> = Vec::new();
        let mut todo: Vec<(Namespace, Entry, String)> = entries
            .into_iter()
            .map(|(ns, e)| {
                let key = self.key_in(scope, ns.name(), &e.fingerprint());
                (ns, e, key)
            })
            .collect();
        for _round in 0..4 {
            let keys: Vec<String> = todo.iter().map(|(_, _, k)| k.clone()).collect();
            let current = self.remote.get_many(&keys, None, deadline);
            self.outcome(&current);
            let current = match current {
                Ok(c) => c,
                Err(e) => return self.left(todo, e, folded),
            };
            let mut writes: Vec<Write> = Vec::new();
            for (i, ((ns, mine, _), value)) in todo.iter().zip(current).enumerate() {
                let stored = value.as_deref().and_then(|bytes| {
                    check_value(
                        bytes,
                        &self.registry,
                        &self.limits,
                        &self.options,
                        &scope.fingerprint(),
                        ns.name(),
                        &mine.fingerprint(),
                    )
                    .map(|(_, e)| e)
                    .map_err(|why| self.reject(why))
                    .ok()
                });
                let merged = match stored {
                    Some(stored) => {
                        let mut merged = stored.clone();
                        merged.merge(mine.clone());
                        if merged == stored {
                            self.counters.unchanged.fetch_add(1, Ordering::Relaxed);
                            if stored != *mine {
                                folded.push((*ns, stored));
                            }
                            continue;
                        }
                        merged
                    }
                    None => mine.clone(),
                };
                let bytes = encode_value(&self.registry, scope, ns.name(), &merged);
                if bytes.len() > self.options.max_value_bytes {
                    self.reject("oversized");
                    continue;
                }
                let more = (merged != *mine).then_some(merged);
                writes.push((i, value, bytes, more));
            }
            if writes.is_empty() {
                return PublishOutcome {
                    left: Vec::new(),
                    error: None,
                    folded,
                };
            }
            let swaps: Vec<Swap<'_>> = writes
                .iter()
                .map(|(i, expected, value, _)| Swap {
                    key: &todo[*i].2,
                    expected: expected.as_deref(),
                    value,
                })
                .collect();
            let done = self
                .remote
                .compare_and_set_many(&swaps, self.options.ttl, deadline);
            self.outcome(&done);
            let done = match done {
                Ok(d) if d.len() == swaps.len() => d,
                Ok(d) => {
                    let e = RemoteError::Protocol(format!(
                        "{} answers to {} compare-and-set commands",
                        d.len(),
                        swaps.len()
                    ));
                    return self.left(todo, e, folded);
                }
                Err(e) => return self.left(todo, e, folded),
            };
            let mut again = Vec::new();
            let lost: Vec<usize> = writes
                .iter()
                .zip(&done)
                .filter(|(_, ok)| !**ok)
                .map(|((i, _, _, _), _)| *i)
                .collect();
            for ((i, _, _, more), ok) in writes.into_iter().zip(&done) {
                if let (Some(merged), true) = (more, *ok) {
                    folded.push((todo[i].0, merged));
                }
            }
            let set = done.iter().filter(|ok| **ok).count() as u64;
            self.counters.published.fetch_add(set, Ordering::Relaxed);
            self.counters
                .conflicts
                .fetch_add(lost.len() as u64, Ordering::Relaxed);
            for (i, item) in todo.into_iter().enumerate() {
                if lost.contains(&i) {
                    again.push(item);
                }
            }
            if again.is_empty() {
                return PublishOutcome {
                    left: Vec::new(),
                    error: None,
                    folded,
                };
            }
            todo = again;
            if Instant::now() >= deadline {
                break;
            }
        }
        PublishOutcome {
            left: todo
                .into_iter()
                .map(|(ns, e, _)| (ns, e.fingerprint()))
                .collect(),
            error: None,
            folded,
        }
    }

    fn left(
        &self,
        todo: Vec<(Namespace, Entry, String)>,
        error: RemoteError,
        folded: Vec<(Namespace, Entry)>,
    ) -> PublishOutcome {
        PublishOutcome {
            left: todo
                .into_iter()
                .map(|(ns, e, _)| (ns, e.fingerprint()))
                .collect(),
            error: Some(error),
            folded,
        }
    }

    pub(crate) fn prefix(&self) -> String {
        let mut p = format!("{KEY_SALT}:");
        escape_into(&mut p, self.registry.app());
        p.push_str(&format!(":{}:", self.registry.current()));
        p
    }

    /// Reads `keys` (of this application and schema), up to 500 per round trip, checking
    /// each value against what its key says; returns what passed, with its namespace.
    pub(crate) fn read_keys(
        &self,
        keys: &[String],
        deadline: Instant,
    ) -> Result<Vec<(Scope, String, Entry)>, RemoteError> {
        let mut out = Vec::new();
        for batch in keys.chunks(PULL_BATCH) {
            let values = self.remote.get_many(batch, None, deadline);
            self.outcome(&values);
            for (key, value) in batch.iter().zip(values?) {
                let Some(bytes) = value else { continue };
                let Some((scope_fp, ns, fp)) = self.parse_key(key) else {
                    self.reject("foreign key");
                    continue;
                };
                match check_value(
                    &bytes,
                    &self.registry,
                    &self.limits,
                    &self.options,
                    &scope_fp,
                    &ns,
                    &fp,
                ) {
                    Ok((scope, mut entry)) => {
                        self.counters.hits.fetch_add(1, Ordering::Relaxed);
                        entry.set_origin(Origin::Remote(self.describe.clone()));
                        out.push((scope, ns, entry));
                    }
                    Err(why) => self.reject(why),
                }
            }
        }
        Ok(out)
    }

    /// The scope fingerprint, namespace and key fingerprint a key of this application and
    /// schema names.
    fn parse_key(&self, key: &str) -> Option<(Fingerprint, String, Fingerprint)> {
        let rest = key.strip_prefix(&self.prefix())?;
        let mut parts = rest.split(':');
        let scope = parts.next()?.parse().ok()?;
        let ns = unescape(parts.next()?)?;
        let fp = parts.next()?.parse().ok()?;
        parts.next().is_none().then_some((scope, ns, fp))
    }

    /// Every entry of the cache's own scope on the server, checked, by namespace.
    pub(crate) fn pull_scope(
        &self,
        deadline: Instant,
    ) -> Result<Vec<(Namespace, Entry)>, RemoteError> {
        let mut pattern = self.prefix();
        pattern.push_str(&self.scope.fingerprint().to_hex());
        pattern.push_str(":*");
        let keys = self.remote.scan(&pattern, deadline);
        self.outcome(&keys);
        Ok(self
            .read_keys(&keys?, deadline)?
            .into_iter()
            .filter_map(|(_, ns, entry)| Some((Namespace::new(&ns).ok()?, entry)))
            .collect())
    }

    /// When the breaker lets the next call out (`None`: now).
    pub(crate) fn retry_at(&self) -> Option<Instant> {
        let b = lock(&self.breaker);
        let open = b.open_until.filter(|_| b.failures > 0);
        let full = b.full_until.filter(|t| *t > Instant::now());
        open.into_iter().chain(full).max()
    }

    pub(crate) fn health(&self, pending: usize) -> RemoteHealth {
        let c = &self.counters;
        let breaker = lock(&self.breaker).state();
        let full = self.full();
        RemoteHealth {
            describe: self.describe.clone(),
            mode: self.options.mode,
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            timeouts: c.timeouts.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            skipped: c.skipped.load(Ordering::Relaxed),
            rejected: lock(&c.rejected).clone(),
            published: c.published.load(Ordering::Relaxed),
            unchanged: c.unchanged.load(Ordering::Relaxed),
            conflicts: c.conflicts.load(Ordering::Relaxed),
            pending,
            breaker,
            full,
        }
    }
}

/// What a publication by [`SharedTier::publish`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Published {
    /// Entries written (new, or merged with what the server held).
    pub written: u64,
    /// Entries the server already held in full.
    pub unchanged: u64,
    /// Entries refused before writing (too large, a namespace no cache accepts).
    pub refused: u64,
    /// Entries that came from a shared tier (origin `remote`): not published again, so a
    /// pull followed by a push changes nothing on the server.
    pub from_remote: u64,
    /// Entries not published: lost races every round, or the round stopped on an error.
    pub left: usize,
}

/// What [`SharedTier::pull`] read.
#[derive(Debug, Clone, Default)]
pub struct Pulled {
    /// The entries that passed every check, with origin `remote`.
    pub data: CacheData,
    /// Keys of this application and schema found on the server.
    pub keys: usize,
    /// Values refused, by reason.
    pub rejected: BTreeMap<&'static str, u64>,
}

/// The shared tier for tools that use it without a [`crate::Cache`] (the CLI's `get`, `put`,
/// `import` and `remote`): the same key layout, checks, breaker and counters.
#[derive(Debug)]
pub struct SharedTier {
    tier: RemoteTier,
}

/// Keys read per round trip when pulling.
const PULL_BATCH: usize = 500;

impl SharedTier {
    /// The tier of `registry`'s application and current schema on `remote`; `scope` is the
    /// one [`SharedTier::publish`] and lookups default to.
    pub fn new(remote: Arc<dyn Remote>, options: RemoteOptions, registry: Migrations) -> Self {
        SharedTier {
            tier: RemoteTier::new(
                remote,
                options,
                Arc::new(registry),
                Limits::default(),
                Scope::default(),
            ),
        }
    }

    /// Where it is (no password).
    pub fn describe(&self) -> &str {
        &self.tier.describe
    }

    /// One round trip within `timeout`; returns how long it took.
    pub fn ping(&self, timeout: Duration) -> Result<Duration, RemoteError> {
        let started = Instant::now();
        let result = self.tier.remote.ping(started + timeout);
        self.tier.outcome(&result);
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
        let deadline = Instant::now() + timeout;
        let keys = match scope {
            Some(scope) => vec![self.tier.key_in(scope, ns, fp)],
            None => {
                let mut pattern = self.tier.prefix();
                pattern.push_str("*:");
                escape_into(&mut pattern, ns);
                pattern.push(':');
                pattern.push_str(&fp.to_hex());
                let keys = self.tier.remote.scan(&pattern, deadline);
                self.tier.outcome(&keys);
                keys?
            }
        };
        Ok(self
            .tier
            .read_keys(&keys, deadline)?
            .into_iter()
            .map(|(scope, _, entry)| (scope, entry))
            .collect())
    }

    /// Every entry of this application and schema on the server, checked (a key listing,
    /// then reads of up to 500 keys per round trip, all within `timeout`).
    pub fn pull(&self, timeout: Duration) -> Result<Pulled, RemoteError> {
        let deadline = Instant::now() + timeout;
        let mut pattern = self.tier.prefix();
        pattern.push('*');
        let keys = self.tier.remote.scan(&pattern, deadline);
        self.tier.outcome(&keys);
        let keys = keys?;
        let before = lock(&self.tier.counters.rejected).clone();
        let mut data = CacheData::new();
        for (scope, ns, entry) in self.tier.read_keys(&keys, deadline)? {
            data.insert(&scope, &ns, entry);
        }
        let mut rejected = lock(&self.tier.counters.rejected).clone();
        for (why, n) in before {
            if let Some(now) = rejected.get_mut(why) {
                *now -= n;
            }
        }
        rejected.retain(|_, n| *n > 0);
        Ok(Pulled {
            data,
            keys: keys.len(),
            rejected,
        })
    }

    /// How many keys of this application and schema the server holds.
    pub fn count(&self, timeout: Duration) -> Result<usize, RemoteError> {
        let mut pattern = self.tier.prefix();
        pattern.push('*');
        let keys = self.tier.remote.scan(&pattern, Instant::now() + timeout);
        self.tier.outcome(&keys);
        keys.map(|k| k.len())
    }

    /// Publishes every entry of `data` (any scope), merged with what the server holds, within
    /// `timeout`.
    pub fn publish(&self, data: &CacheData, timeout: Duration) -> Result<Published, RemoteError> {
        let deadline = Instant::now() + timeout;
        let before = (
            self.tier.counters.published.load(Ordering::Relaxed),
            self.tier.counters.unchanged.load(Ordering::Relaxed),
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
                for e in by_fp.values() {
                    if let Origin::Remote(_) = e.origin() {
                        report.from_remote += 1;
                    } else {
                        entries.push((ns, e.clone()));
                    }
                }
            }
            let outcome = self.tier.publish_in(scope, entries, deadline, true);
            report.left += outcome.left.len();
            if let Some(e) = outcome.error {
                error = Some(e);
            }
        }
        report.written = self.tier.counters.published.load(Ordering::Relaxed) - before.0;
        report.unchanged = self.tier.counters.unchanged.load(Ordering::Relaxed) - before.1;
        match error {
            Some(e) if report.written + report.unchanged == 0 => Err(e),
            _ => Ok(report),
        }
    }

    /// The counters so far.
    pub fn health(&self) -> RemoteHealth {
        self.tier.health(0)
    }
}

/// The inverse of the key's percent-escaping.
fn unescape(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_breaker_backs_off_doubling_to_its_cap_and_one_probe_goes_out() {
        let mut b = Breaker::default();
        let t0 = Instant::now();
        assert!(b.allow(t0, Duration::from_millis(50)));
        assert!(b.failure(t0), "the first failure is a new outage");
        assert!(!b.allow(t0 + Duration::from_millis(99), Duration::from_millis(50)));
        let t1 = t0 + Duration::from_millis(100);
        assert!(b.allow(t1, Duration::from_millis(50)), "the probe");
        assert!(
            !b.allow(t1, Duration::from_millis(50)),
            "others wait for the probe"
        );
        assert!(!b.failure(t1), "the same outage: no second warning");
        assert!(!b.allow(t1 + Duration::from_millis(199), Duration::ZERO));
        for _ in 0..20 {
            b.failure(t1);
        }
        assert_eq!(b.open_until, Some(t1 + BREAKER_MAX));
        assert!(b.success(), "recovered");
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.allow(t1, Duration::ZERO));
    }

    #[test]
    fn keys_escape_their_free_fields() {
        let fp = Fingerprint([0xab; 16]);
        let scope = Fingerprint([1; 16]);
        let key = remote_key("my:app/1", 3, &scope, "mat mul", &fp);
        assert_eq!(
            key,
            format!(
                "tc1:my%3Aapp%2F1:3:{}:mat%20mul:{}",
                scope.to_hex(),
                fp.to_hex()
            )
        );
        assert_eq!(key.matches(':').count(), 5);
    }

    #[test]
    fn a_key_names_its_scope_namespace_and_fingerprint_back() {
        let tier = SharedTier::new(
            Arc::new(MemoryRemote::new()),
            RemoteOptions::default(),
            Migrations::new("my:app", 4),
        );
        let (scope, fp) = (Fingerprint([7; 16]), Fingerprint([9; 16]));
        for ns in ["matmul", "mat mul:%", "ünï/code"] {
            let key = remote_key("my:app", 4, &scope, ns, &fp);
            assert_eq!(
                tier.tier.parse_key(&key),
                Some((scope, ns.to_owned(), fp)),
                "{key}"
            );
        }
        let other_schema = remote_key("my:app", 5, &scope, "matmul", &fp);
        assert_eq!(tier.tier.parse_key(&other_schema), None);
        assert_eq!(tier.tier.parse_key("tc1:my%3Aapp:4:zz:matmul:zz"), None);
        assert!(glob("tc1:a:*:m:f", "tc1:a:0123:m:f"));
        assert!(!glob("tc1:a:*:m:f", "tc1:a:0123:m:g"));
    }

    #[test]
    fn modes_parse_and_print() {
        for m in [RemoteMode::Off, RemoteMode::Read, RemoteMode::ReadWrite] {
            assert_eq!(m.to_string().parse::<RemoteMode>(), Ok(m));
        }
        assert!("sometimes".parse::<RemoteMode>().is_err());
    }
}
