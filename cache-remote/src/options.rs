//! How a cache uses its shared tier: [`RemoteOptions`], its [`RemoteMode`], and the
//! environment variables that override them.

use std::fmt;
use std::time::Duration;

/// `TUNECACHE_GENERATION`: the generation a process reads (`current`, or a SHA-256).
#[cfg(feature = "s3")]
pub const ENV_GENERATION: &str = "TUNECACHE_GENERATION";

/// `TUNECACHE_GENERATION=off`: no generation, not even the bucket's current one as a warm-up.
#[cfg(feature = "s3")]
pub(crate) const OFF: &str = "off";

/// Whether `id` is a generation's name: 64 lower-case hex digits.
#[cfg(feature = "s3")]
pub(crate) fn is_id(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// `off`, `read` or `read-write`: what a cache does with its shared tier.
pub(crate) const ENV_REMOTE_MODE: &str = "TUNECACHE_REMOTE_MODE";
/// The shared tier's read budget in milliseconds.
pub(crate) const ENV_REMOTE_TIMEOUT_MS: &str = "TUNECACHE_REMOTE_TIMEOUT_MS";

/// The fleet lease's time to live in milliseconds (100 to 600000), or 0 for no leases.
pub(crate) const ENV_REMOTE_LEASE_MS: &str = "TUNECACHE_REMOTE_LEASE_MS";

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

/// Requests an S3 tier sends at once for a batch of keys.
pub(crate) const ENV_REMOTE_PARALLEL: &str = "TUNECACHE_REMOTE_PARALLEL";

/// Requests in flight at once for a batch of keys, unless `TUNECACHE_REMOTE_PARALLEL` says.
pub(crate) const DEFAULT_PARALLEL: usize = 64;

/// The most `TUNECACHE_REMOTE_PARALLEL` may ask for (each is a thread while a batch runs).
pub(crate) const MAX_PARALLEL: usize = 256;

/// The requests in flight at once that `value` ([`ENV_REMOTE_PARALLEL`]) asks for: a whole
/// number from 1 to [`MAX_PARALLEL`]; unset or empty, [`DEFAULT_PARALLEL`].
pub(crate) fn parse_parallel(value: Option<&str>) -> Result<usize, crate::ConfigError> {
    // Unset or empty: the default, as for every other setting.
    let Some(value) = value.filter(|v| !v.trim().is_empty()) else {
        return Ok(DEFAULT_PARALLEL);
    };
    match value.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_PARALLEL).contains(&n) => Ok(n),
        _ => Err(crate::ConfigError::BadSetting {
            name: ENV_REMOTE_PARALLEL,
            value: value.to_owned(),
            expected: format!("a whole number from 1 to {MAX_PARALLEL}"),
        }),
    }
}

/// The most rounds a batch's read budget covers ([`RemoteOptions::budget`]).
pub(crate) const MAX_BATCH_ROUNDS: u32 = 8;

/// The read budget of a batch of `keys` on a store that reads `per_round` of them at once
/// (`None`: the whole batch in one round trip): `budget` once per round, at most
/// [`MAX_BATCH_ROUNDS`] times.
pub(crate) fn batch_budget(budget: Duration, keys: usize, per_round: Option<usize>) -> Duration {
    let rounds = match per_round {
        Some(n) if n > 0 => keys.div_ceil(n).max(1),
        _ => 1,
    };
    let rounds = u32::try_from(rounds)
        .unwrap_or(u32::MAX)
        .min(MAX_BATCH_ROUNDS);
    budget.saturating_mul(rounds)
}

/// How a cache uses its remote.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// What it does.
    pub mode: RemoteMode,
    /// The most one read on a miss may take, connecting included (default 50 ms). A batch
    /// (a prefetch, a fleet's view) on a store that reads a key a request gets it once per
    /// round of requests it takes, at most 8 times: a large prefetch is
    /// not taken for an outage.
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
    /// A fleet lease's time to live, renewed every third of it while its holder measures: how
    /// long the fleet waits for a holder that died (default 10 s; `None`: no leases, every
    /// process measures its own misses).
    pub lease_ttl: Option<Duration>,
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
            lease_ttl: Some(Duration::from_secs(10)),
        }
    }
}

impl RemoteOptions {
    /// These options with `TUNECACHE_REMOTE_MODE`, `TUNECACHE_REMOTE_TIMEOUT_MS` and
    /// `TUNECACHE_REMOTE_LEASE_MS` applied,
    /// as `env` reads them; the strings are warnings about values that were ignored.
    pub fn with_env(mut self, env: impl Fn(&str) -> Option<String>) -> (Self, Vec<String>) {
        let mut warnings = Vec::new();
        if let Some(v) = env(ENV_REMOTE_MODE).filter(|v| !v.trim().is_empty()) {
            match v.parse() {
                Ok(mode) => self.mode = mode,
                Err(_) => warnings.push(format!(
                    "ignoring {ENV_REMOTE_MODE}={v:?}: expected off, read or read-write"
                )),
            }
        }
        if let Some(v) = env(ENV_REMOTE_TIMEOUT_MS).filter(|v| !v.trim().is_empty()) {
            match v.trim().parse::<u64>() {
                Ok(ms) if (1..=60_000).contains(&ms) => {
                    self.budget = Duration::from_millis(ms);
                }
                _ => warnings.push(format!(
                    "ignoring {ENV_REMOTE_TIMEOUT_MS}={v:?}: expected milliseconds from 1 to 60000"
                )),
            }
        }
        if let Some(v) = env(ENV_REMOTE_LEASE_MS).filter(|v| !v.trim().is_empty()) {
            match v.trim().parse::<u64>() {
                Ok(0) => self.lease_ttl = None,
                Ok(ms) if (100..=600_000).contains(&ms) => {
                    self.lease_ttl = Some(Duration::from_millis(ms));
                }
                _ => warnings.push(format!(
                    "ignoring {ENV_REMOTE_LEASE_MS}={v:?}: expected 0 (no leases) or milliseconds \
                     from 100 to 600000"
                )),
            }
        }
        (self, warnings)
    }

    /// Each value of the shared tier's settings in `settings` that a cache would ignore
    /// (`TUNECACHE_REMOTE_MODE`, `_TIMEOUT_MS`, `_LEASE_MS`, `_PARALLEL`, and a `TUNECACHE_GENERATION` that
    /// is neither `current` nor a generation's id), as one line naming its variable and what
    /// it expects: a command stops on them where a library cache warns and opens.
    pub fn problems(settings: &cache_core::settings::Settings) -> Vec<String> {
        let (_, warnings) = RemoteOptions::default().from_settings(settings);
        #[cfg_attr(
            not(feature = "s3"),
            allow(unused_mut, reason = "a generation is checked")
        )]
        let mut out: Vec<String> = warnings
            .into_iter()
            .map(|w| w.strip_prefix("ignoring ").map(str::to_owned).unwrap_or(w))
            .collect();
        if let Err(e) = parse_parallel(settings.get(ENV_REMOTE_PARALLEL)) {
            out.push(e.to_string());
        }
        #[cfg(feature = "s3")]
        if let Some(id) = settings.get_os(ENV_GENERATION) {
            let text = id.to_string_lossy();
            let id = text.trim();
            if !id.is_empty() && id != "current" && !id.eq_ignore_ascii_case(OFF) && !is_id(id) {
                out.push(format!(
                    "{}={id:?}: expected current, off or a generation's id (64 lower-case hex digits)",
                    ENV_GENERATION
                ));
            }
        }
        out
    }

    /// [`RemoteOptions::with_env`] on `settings` (the environment as read once).
    pub fn from_settings(self, settings: &cache_core::settings::Settings) -> (Self, Vec<String>) {
        self.with_env(|name| settings.get(name).map(str::to_owned))
    }

    /// Whether this writes to the server.
    pub fn writes(&self) -> bool {
        self.mode == RemoteMode::ReadWrite
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print() {
        for m in [RemoteMode::Off, RemoteMode::Read, RemoteMode::ReadWrite] {
            assert_eq!(m.to_string().parse::<RemoteMode>(), Ok(m));
        }
        assert!("sometimes".parse::<RemoteMode>().is_err());
    }

    #[test]
    fn the_environment_overrides_mode_and_budget_and_bad_values_warn() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let (o, w) = RemoteOptions::default().with_env(env(&[
            (ENV_REMOTE_MODE, "read"),
            (ENV_REMOTE_TIMEOUT_MS, "120"),
        ]));
        assert_eq!(
            (o.mode, o.budget, w.len()),
            (RemoteMode::Read, Duration::from_millis(120), 0)
        );
        let (o, w) = RemoteOptions::default().with_env(env(&[
            (ENV_REMOTE_MODE, "sometimes"),
            (ENV_REMOTE_TIMEOUT_MS, "0"),
        ]));
        assert_eq!(
            (o.mode, o.budget),
            (RemoteMode::ReadWrite, Duration::from_millis(50))
        );
        assert_eq!(w.len(), 2, "{w:?}");
    }

    #[test]
    fn the_environment_sets_or_turns_off_fleet_leases() {
        let with = |v: &'static str| {
            RemoteOptions::default()
                .with_env(move |n| (n == ENV_REMOTE_LEASE_MS).then(|| v.to_owned()))
        };
        assert_eq!(with("0").0.lease_ttl, None);
        assert_eq!(with("2500").0.lease_ttl, Some(Duration::from_millis(2500)));
        for bad in ["50", "forever", "-1", "600001"] {
            let (o, w) = with(bad);
            assert_eq!(
                (o.lease_ttl, w.len()),
                (Some(Duration::from_secs(10)), 1),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_batch_gets_the_budget_once_per_round_within_the_cap() {
        let ms = Duration::from_millis;
        assert_eq!(batch_budget(ms(50), 1000, None), ms(50), "one round trip");
        assert_eq!(batch_budget(ms(1000), 1, Some(64)), ms(1000));
        assert_eq!(batch_budget(ms(1000), 64, Some(64)), ms(1000));
        assert_eq!(batch_budget(ms(1000), 65, Some(64)), ms(2000));
        assert_eq!(batch_budget(ms(1000), 200, Some(64)), ms(4000));
        assert_eq!(
            batch_budget(ms(1000), 1_000_000, Some(64)),
            ms(1000) * MAX_BATCH_ROUNDS,
            "capped"
        );
        assert_eq!(batch_budget(ms(1000), 0, Some(64)), ms(1000));
        assert_eq!(batch_budget(ms(1000), 10, Some(0)), ms(1000));
        assert_eq!(
            batch_budget(Duration::MAX, 1000, Some(1)),
            Duration::MAX,
            "no overflow"
        );
    }

    #[test]
    fn the_parallel_setting_is_a_whole_number_within_bounds() {
        let ok = |v: Option<&str>| parse_parallel(v).ok();
        assert_eq!(ok(None), Some(DEFAULT_PARALLEL));
        assert_eq!(ok(Some(" ")), Some(DEFAULT_PARALLEL), "empty: unset");
        assert_eq!(ok(Some(" 16 ")), Some(16));
        assert_eq!(ok(Some("256")), Some(256));
        for bad in ["0", "257", "-1", "many", "1e3", "\u{0668}"] {
            let e = parse_parallel(Some(bad)).expect_err(bad).to_string();
            assert!(
                e.starts_with("TUNECACHE_REMOTE_PARALLEL=") && e.contains("1 to 256"),
                "{e}"
            );
        }
        let settings = cache_core::settings::Settings::default()
            .with(ENV_REMOTE_PARALLEL, "0")
            .expect("a setting");
        let problems = RemoteOptions::problems(&settings);
        assert_eq!(problems.len(), 1, "{problems:?}");
    }
}
