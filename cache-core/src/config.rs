//! Configuration: a builder, environment overrides, and the default location.
//!
//! Precedence, highest first: `TUNECACHE_FILE`, `TUNECACHE_DIR`, the builder's `file`, the
//! builder's `dir`, the user's cache directory (`$XDG_CACHE_HOME/tunecache` or
//! `~/.cache/tunecache` on Linux). The environment wins over code so an operator can move,
//! disable or freeze a cache without rebuilding (`TUNECACHE_DISABLE`, `TUNECACHE_READ_ONLY`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cache_format::{Limits, Scope};
use cache_migrate::Migrations;

use crate::settings::Settings;
use crate::tier::TierSource;

/// Overrides the cache file.
pub(crate) const ENV_FILE: &str = "TUNECACHE_FILE";
/// Overrides the cache directory (the file is `<dir>/<app>.tcache`).
pub(crate) const ENV_DIR: &str = "TUNECACHE_DIR";
/// `1` keeps everything in memory and touches no file.
pub(crate) const ENV_DISABLE: &str = "TUNECACHE_DISABLE";
/// `1` reads the file but never writes it.
pub(crate) const ENV_READ_ONLY: &str = "TUNECACHE_READ_ONLY";
/// Extension of cache files.
pub(crate) const FILE_EXTENSION: &str = "tcache";

/// The default cache directory, if the platform has one.
pub fn default_dir() -> Option<PathBuf> {
    directories::BaseDirs::new().map(|d| d.cache_dir().join("tunecache"))
}

/// The file name of an application's cache: `<app>.tcache`, with characters that are not
/// safe in file names replaced by `_`.
pub fn file_name(app: &str) -> String {
    let safe: String = app
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let safe = safe.trim_start_matches('.');
    format!(
        "{}.{FILE_EXTENSION}",
        if safe.is_empty() { "cache" } else { safe }
    )
}

/// How a cache will be opened.
#[derive(Debug, Clone)]
pub struct CacheBuilder {
    pub(crate) registry: Migrations,
    pub(crate) scope: Scope,
    dir: Option<PathBuf>,
    file: Option<PathBuf>,
    disabled: bool,
    read_only: bool,
    /// Read from the environment on first use, unless given ([`CacheBuilder::with_settings`]).
    settings: std::sync::OnceLock<Settings>,
    pub(crate) lock_timeout: Duration,
    flush_timeout: Option<Duration>,
    pub(crate) save_delay: Duration,
    pub(crate) refresh_interval: Option<Duration>,
    pub(crate) max_retry_delay: Duration,
    pub(crate) limits: Limits,
    pub(crate) compact_ratio: f64,
    pub(crate) compact_min_bytes: u64,
    pub(crate) compaction_budget: Option<Duration>,
    pub(crate) backup_on_migrate: bool,
    pub(crate) retention: crate::retention::Retention,
    tiers: Vec<Arc<dyn TierSource>>,
    system: Vec<PathBuf>,
}

/// Where the entries live, once configuration is resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// In the given file.
    File {
        /// The snapshot file.
        path: PathBuf,
        /// Whether writes are off.
        read_only: bool,
    },
    /// In memory only.
    Memory(MemoryOnly),
}

/// Why a cache keeps its results in memory only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemoryOnly {
    /// Caching to disk was switched off (`TUNECACHE_DISABLE`, or the builder): nothing to warn
    /// about.
    Disabled,
    /// There is no usable place for a file; the text says why.
    NoLocation(String),
}

impl std::fmt::Display for MemoryOnly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MemoryOnly::Disabled => f.write_str("disabled"),
            MemoryOnly::NoLocation(why) => f.write_str(why),
        }
    }
}

impl CacheBuilder {
    /// A builder for the application described by `registry` (its name, current schema and
    /// migration steps), with the defaults: the user's cache directory, the empty scope, a
    /// 2 s lock bound, durable within about 250 ms of a change, refresh from other processes
    /// every 2 s, and the environment applied.
    pub fn new(registry: Migrations) -> Self {
        CacheBuilder {
            registry,
            scope: Scope::default(),
            dir: None,
            file: None,
            disabled: false,
            read_only: false,
            settings: std::sync::OnceLock::new(),
            lock_timeout: Duration::from_secs(2),
            flush_timeout: None,
            save_delay: Duration::from_millis(250),
            refresh_interval: Some(Duration::from_secs(2)),
            max_retry_delay: Duration::from_secs(10),
            limits: Limits::default(),
            compact_ratio: 0.5,
            compact_min_bytes: 256 << 10,
            compaction_budget: None,
            backup_on_migrate: true,
            retention: crate::retention::Retention::default(),
            tiers: Vec::new(),
            system: Vec::new(),
        }
    }

    /// What each compaction of the file drops: entries recorded longer ago than `max_age`,
    /// then the entries of stale scopes ([`crate::STALE_SCOPE_AFTER`]) and those recorded
    /// longest ago until the snapshot fits `max_bytes` (the journal
    /// grows past it between compactions). What this process holds in memory stays usable;
    /// other processes no longer read the dropped entries. `tunecache gc` applies the same
    /// rule at once.
    pub fn retention(mut self, max_bytes: Option<u64>, max_age: Option<Duration>) -> Self {
        self.retention = crate::retention::Retention { max_age, max_bytes };
        self
    }

    /// Read-only system files (bundles or cache files shipped with an installation), read
    /// at open behind the user's own file: a lookup that misses the user's entries is served
    /// from them; they are never locked, written, repaired or moved, and one that cannot be
    /// used is reported once and ignored. `TUNECACHE_SYSTEM_PATH` (files separated by `:`)
    /// adds to them.
    pub fn system_files(mut self, paths: impl IntoIterator<Item = impl Into<PathBuf>>) -> Self {
        self.system = paths.into_iter().map(Into::into).collect();
        self
    }

    /// Adds one system file after those given so far (a shared tier's pinned generation).
    pub fn system_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.system.push(path.into());
        self
    }

    /// The system files: the builder's, then `TUNECACHE_SYSTEM_PATH`'s.
    pub(crate) fn system_paths(&self) -> Vec<PathBuf> {
        let mut paths = self.system.clone();
        paths.extend(self.settings().system_paths());
        paths
    }

    /// A lower tier behind the file and the system files, asked on a miss after those
    /// added before it (cache-remote's shared tier: `cache_remote::RemoteBuilder::remote`).
    pub fn tier(mut self, source: impl TierSource + 'static) -> Self {
        self.tiers.push(Arc::new(source));
        self
    }

    /// The tiers given with [`CacheBuilder::tier`], in order.
    pub(crate) fn tier_sources(&self) -> &[Arc<dyn TierSource>] {
        &self.tiers
    }

    /// The settings in force: the environment, read once when first asked (by `open`, say),
    /// those given with [`CacheBuilder::with_settings`], or none after
    /// [`CacheBuilder::ignore_env`].
    pub fn settings(&self) -> &Settings {
        self.settings.get_or_init(Settings::from_env)
    }

    /// The scope lookups and records of this cache belong to.
    pub fn scope(mut self, scope: Scope) -> Self {
        self.scope = scope;
        self
    }

    /// Puts the file in `dir` as `<app>.tcache`.
    pub fn dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    /// Uses exactly this file.
    pub fn file(mut self, file: impl Into<PathBuf>) -> Self {
        self.file = Some(file.into());
        self
    }

    /// Keeps everything in memory; touches no file.
    pub fn disabled(mut self, disabled: bool) -> Self {
        self.disabled = disabled;
        self
    }

    /// Reads the file but never writes it.
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Ignores the `TUNECACHE_*` environment variables.
    pub fn ignore_env(mut self) -> Self {
        self.settings = std::sync::OnceLock::from(Settings::default());
        self
    }

    /// Uses `settings` in place of the environment (a caller that read it once already, or
    /// explicit options over it): the builder then reads nothing.
    pub fn with_settings(mut self, settings: Settings) -> Self {
        self.settings = std::sync::OnceLock::from(settings);
        self
    }

    /// Longest wait for another process's lock before a save is retried later.
    pub fn lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout;
        self
    }

    /// Longest time `flush` (and drop) waits; defaults to twice the lock timeout plus 1 s.
    pub fn flush_timeout(mut self, timeout: Duration) -> Self {
        self.flush_timeout = Some(timeout);
        self
    }

    /// How long the saver gathers changes before writing them.
    pub fn save_delay(mut self, delay: Duration) -> Self {
        self.save_delay = delay;
        self
    }

    /// How often other processes' results are read in; `None` reads them only on flush.
    pub fn refresh_interval(mut self, interval: Option<Duration>) -> Self {
        self.refresh_interval = interval;
        self
    }

    /// Decoding bounds.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// When the journal is folded into the table, and the table rewritten: the journal once it
    /// would pass `min_bytes` (its bound: 256 KiB by default, what an open replays at most);
    /// the table, in the background, once the bytes no commit refers to any more pass both
    /// `ratio` times the live ones (0.5 by default) and `min_bytes`.
    pub fn compaction(mut self, ratio: f64, min_bytes: u64) -> Self {
        self.compact_ratio = ratio;
        self.compact_min_bytes = min_bytes;
        self
    }

    /// The longest a save may spend on a fold that is only due (the journal passed its
    /// bound), and a background rewrite on its copy: past it, the fold is abandoned (nothing of
    /// it stays on disk) and the save appends to the journal instead, so a short-lived writer
    /// (a command-line `put`) is never made to fail by a fold it has no time for; a later
    /// writer with time folds. Default: no bound.
    pub fn compaction_budget(mut self, budget: Duration) -> Self {
        self.compaction_budget = Some(budget);
        self
    }

    /// Whether to keep the pre-migration file as `<file>.bak.<ms>` when a migrated cache is
    /// first written (default: yes).
    pub fn backup_on_migrate(mut self, backup: bool) -> Self {
        self.backup_on_migrate = backup;
        self
    }

    pub(crate) fn effective_flush_timeout(&self) -> Duration {
        self.flush_timeout.unwrap_or_else(|| {
            // Saturating: a lock timeout near Duration::MAX is "wait for ever", not a panic.
            self.lock_timeout
                .saturating_mul(2)
                .saturating_add(Duration::from_secs(1))
        })
    }

    /// Resolves where the cache lives; the strings are warnings about ignored settings.
    pub fn resolve(&self) -> (Location, Vec<String>) {
        let mut warnings = Vec::new();
        let mut flag = |name: &'static str, default: bool| -> bool {
            match self.env(name) {
                None => default,
                Some(v) => parse_bool(&v).unwrap_or_else(|| {
                    warnings.push(format!("ignoring {}", invalid_switch(name, &v)));
                    default
                }),
            }
        };
        let disabled = flag(ENV_DISABLE, self.disabled);
        let read_only = flag(ENV_READ_ONLY, self.read_only);
        if disabled {
            return (Location::Memory(MemoryOnly::Disabled), warnings);
        }
        match self.path() {
            Some(path) => (Location::File { path, read_only }, warnings),
            None => (
                Location::Memory(MemoryOnly::NoLocation(
                    "no cache directory on this system; set TUNECACHE_DIR".into(),
                )),
                warnings,
            ),
        }
    }

    /// The cache file, whatever the switches say: `TUNECACHE_FILE` > `TUNECACHE_DIR` >
    /// builder `file` > builder `dir` > the user cache directory (`None`: there is none).
    /// Tools that inspect a cache use it, so `TUNECACHE_DISABLE` does not hide the file.
    pub fn path(&self) -> Option<PathBuf> {
        let name = file_name(self.registry.app());
        if let Some(f) = self.env(ENV_FILE).filter(|s| !s.is_empty()) {
            Some(PathBuf::from(f))
        } else if let Some(d) = self.env(ENV_DIR).filter(|s| !s.is_empty()) {
            Some(PathBuf::from(d).join(&name))
        } else if let Some(f) = &self.file {
            Some(f.clone())
        } else if let Some(d) = &self.dir {
            Some(d.join(&name))
        } else {
            default_dir().map(|d| d.join(&name))
        }
    }

    fn env(&self, name: &str) -> Option<String> {
        self.settings().get(name).map(str::to_owned)
    }
}

/// The switches `TUNECACHE_DISABLE` and `TUNECACHE_READ_ONLY` as set in the environment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Switches {
    /// `TUNECACHE_DISABLE`: keep results in memory only.
    pub disabled: bool,
    /// `TUNECACHE_READ_ONLY`: read the file, never write it.
    pub read_only: bool,
}

impl Switches {
    /// Reads both from `settings`. A value other than 1/0, true/false, yes/no, on/off (any
    /// case) or empty is an error naming the variable. (A library `Cache` warns and ignores
    /// such a value instead, since it must open whatever happens.)
    pub fn from_settings(settings: &Settings) -> Result<Self, SwitchError> {
        let read = |name: &'static str| match settings.get_os(name) {
            None => Ok(false),
            Some(v) => {
                let v = v.to_string_lossy();
                parse_bool(&v).ok_or(SwitchError {
                    name,
                    value: v.into_owned(),
                })
            }
        };
        Ok(Switches {
            disabled: read(ENV_DISABLE)?,
            read_only: read(ENV_READ_ONLY)?,
        })
    }
}

fn invalid_switch(name: &'static str, value: &str) -> String {
    SwitchError {
        name,
        value: value.to_owned(),
    }
    .to_string()
}

/// A switch variable set to a value that is not a yes or a no ([`Switches::from_settings`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}={value:?}: expected 1/0, true/false, yes/no or on/off")]
pub struct SwitchError {
    /// The variable.
    pub name: &'static str,
    /// Its value.
    pub value: String,
}

fn parse_bool(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" | "" => Some(false),
        _ => None,
    }
}
