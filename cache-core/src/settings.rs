//! Every environment variable tunecache reads, in one table: its name, who reads it, what it
//! means and what holds when it is unset. `tunecache --help` and docs/settings.md are made
//! from it (a test keeps the document equal to the table), and `cargo xtask tidy` refuses a
//! `TUNECACHE_*` name in the sources or the documents that the table does not hold (or that is
//! not one of the test harness's, `TEST_ONLY_PREFIXES`). The environment is read here and
//! nowhere else: [`Settings::from_env`] takes every variable of the table once, and the cache
//! builder, the CLI, the Python package and the C ABI pass that value on (`cargo xtask tidy`
//! refuses a `std::env::var` outside this module, tests and tools aside).

use std::ffi::{OsStr, OsString};

/// One environment variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variable {
    /// Its name.
    pub name: &'static str,
    /// Who reads it: the library (and so every binding), the CLI, or the Python adapters.
    pub read_by: &'static str,
    /// What it means.
    pub meaning: &'static str,
    /// What holds when it is unset.
    pub default: &'static str,
}

const ALL: &str = "library, CLI, Python, C";

/// Every variable, in the order the documents list them.
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: "TUNECACHE_FILE",
        read_by: ALL,
        meaning: "the cache file, over what the code or `--cache-file` says",
        default: "`<dir>/<app>.tcache`",
    },
    Variable {
        name: "TUNECACHE_DIR",
        read_by: ALL,
        meaning: "the folder of cache files (`<dir>/<app>.tcache`), over what the code says",
        default: "`$XDG_CACHE_HOME/tunecache`, else `~/.cache/tunecache`",
    },
    Variable {
        name: "TUNECACHE_DISABLE",
        read_by: ALL,
        meaning: "`1`: keep everything in memory and touch no file",
        default: "off",
    },
    Variable {
        name: "TUNECACHE_READ_ONLY",
        read_by: ALL,
        meaning: "`1`: read the cache file but never write it",
        default: "off",
    },
    Variable {
        name: "TUNECACHE_SYSTEM_PATH",
        read_by: ALL,
        meaning: "read-only bundles or cache files asked on a miss (shipped with a library), \
                  separated by `:`",
        default: "none",
    },
    Variable {
        name: "TUNECACHE_REMOTE",
        read_by: ALL,
        meaning: "the shared tier: `redis://HOST:PORT/DB`, `rediss://` (TLS), \
                  `redis+unix:///PATH`, a Redis Cluster's nodes separated by commas, or \
                  `s3://BUCKET/PREFIX`",
        default: "none",
    },
    Variable {
        name: "TUNECACHE_REMOTE_CA",
        read_by: ALL,
        meaning: "a PEM file of the CA a `rediss://` server's certificate is checked against",
        default: "the system's roots",
    },
    Variable {
        name: "TUNECACHE_REMOTE_MODE",
        read_by: ALL,
        meaning: "`off`, `read` (never write to the server) or `read-write`",
        default: "`read-write`",
    },
    Variable {
        name: "TUNECACHE_REMOTE_TIMEOUT_MS",
        read_by: ALL,
        meaning: "a shared-tier read's budget, in milliseconds",
        default: "50",
    },
    Variable {
        name: "TUNECACHE_REMOTE_LEASE_MS",
        read_by: ALL,
        meaning: "a fleet lease's time to live, in milliseconds (0: no leases)",
        default: "10000",
    },
    Variable {
        name: "TUNECACHE_REMOTE_PARALLEL",
        read_by: ALL,
        meaning: "requests an S3 tier sends at once for a batch of keys (1 to 256)",
        default: "64",
    },
    Variable {
        name: "TUNECACHE_GENERATION",
        read_by: ALL,
        meaning: "the generation of an S3 tier a process is pinned to and reads whole: `current` or a SHA-256; `off`: none, not even as a warm-up",
        default: "the bucket's current generation, if any, warms the cache (never waited for); per-key objects for keys published after it",
    },
    Variable {
        name: "TUNECACHE_TRUST",
        read_by: ALL,
        meaning: "a trust policy file: generations and bundles are used only when signed as \
                  it requires",
        default: "none (signatures are not required)",
    },
    Variable {
        name: "TUNECACHE_LOG",
        read_by: ALL,
        meaning: "a tracing filter for tunecache's logs (`info`, `debug`, ...); with `info`, \
                  each Python adapter says at exit what it served, missed and recorded",
        default: "warnings only",
    },
    Variable {
        name: "TUNECACHE_PROGRESS",
        read_by: "CLI",
        meaning: "`always`, `never` or `auto`: the progress bars on stderr",
        default: "`auto` (on a terminal)",
    },
    Variable {
        name: "TUNECACHE_INDUCTOR",
        read_by: "Python",
        meaning: "`1`: compile workers install the Inductor adapter (through the `.pth` file \
                  `inductor.write_pth` writes)",
        default: "off",
    },
    Variable {
        name: "TUNECACHE_INDUCTOR_PATH",
        read_by: "Python",
        meaning: "the Inductor adapter's cache file",
        default: "`<dir>/inductor.tcache`",
    },
    Variable {
        name: "TUNECACHE_TRITON_PATH",
        read_by: "Python",
        meaning: "the Triton adapter's cache file",
        default: "`<dir>/triton.tcache`",
    },
    Variable {
        name: "TUNECACHE_HELION_PATH",
        read_by: "Python",
        meaning: "the Helion adapter's cache file",
        default: "`<dir>/helion.tcache`",
    },
];

/// Names the test harness and the benchmarks read (never a user's setting).
const TEST_ONLY_PREFIXES: &[&str] = &[
    "TUNECACHE_TEST_",
    "TUNECACHE_BENCH_",
    "TUNECACHE_SKIP_LOG",
    "TUNECACHE_BLESS_VECTORS",
    "TUNECACHE_BIN",
    "TUNECACHE_WARPCONVNET_SRC",
];

/// Variables tunecache reads that are not its own: the host name where procfs has none, the
/// timestamp of reproducible builds (`bundle create`), and an S3 tier's standard `AWS_*`
/// endpoint, region and credentials. (The default cache folder comes from the `directories`
/// crate, which reads `HOME` and `XDG_CACHE_HOME` itself.)
const FOREIGN: &[&str] = &[
    "HOSTNAME",
    "SOURCE_DATE_EPOCH",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ENDPOINT_URL",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
];

/// The settings in force: each variable of [`VARIABLES`] and of the foreign names
/// (`HOSTNAME`, `SOURCE_DATE_EPOCH`, the S3 tier's `AWS_*`) that is set, read
/// from the environment once ([`Settings::from_env`]) or given ([`Settings::with`]: an
/// explicit option over the environment, or a test's own). Whoever opens a cache takes one
/// and passes it on; nothing else reads the environment.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Settings {
    values: Vec<(&'static str, OsString)>,
}

/// The names and values, secrets left out: the S3 tier's secret key and session token, and
/// an address with a user or password in it (`TUNECACHE_REMOTE`). Settings travel inside
/// builders and tier sources, which are `Debug`; a password is never printed.
impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = |name: &str, value: &OsStr| {
            let secret = matches!(name, "AWS_SECRET_ACCESS_KEY" | "AWS_SESSION_TOKEN")
                || value.as_encoded_bytes().contains(&b'@');
            if secret {
                "***".to_owned()
            } else {
                format!("{value:?}")
            }
        };
        f.debug_map()
            .entries(
                self.values
                    .iter()
                    .map(|(name, value)| (name, shown(name, value))),
            )
            .finish()
    }
}

/// A name that is neither in [`VARIABLES`] nor one of the foreign names tunecache reads
/// (`HOSTNAME`, `SOURCE_DATE_EPOCH`, the S3 tier's `AWS_*`): [`Settings::with`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a setting tunecache reads (docs/settings.md lists them)")]
pub struct UnknownSetting(pub String);

impl Settings {
    /// Every variable of the table and of the foreign names that the environment sets, read
    /// now.
    pub fn from_env() -> Settings {
        let names = VARIABLES
            .iter()
            .map(|v| v.name)
            .chain(FOREIGN.iter().copied());
        Settings {
            values: names
                .filter_map(|name| Some((name, std::env::var_os(name)?)))
                .collect(),
        }
    }

    /// These settings with `name` set to `value`.
    pub fn with(
        mut self,
        name: &str,
        value: impl Into<OsString>,
    ) -> Result<Settings, UnknownSetting> {
        let name = static_name(name)?;
        self.values.retain(|(n, _)| *n != name);
        self.values.push((name, value.into()));
        Ok(self)
    }

    /// These settings with `name` unset.
    pub fn without(mut self, name: &str) -> Settings {
        self.values.retain(|(n, _)| *n != name);
        self
    }

    /// The value of `name`, if set (and UTF-8: [`Settings::get_os`] takes any bytes).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.get_os(name)?.to_str()
    }

    /// The value of `name`, if set, as the environment held it (paths may not be UTF-8).
    pub fn get_os(&self, name: &str) -> Option<&OsStr> {
        self.values
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_os_str())
    }

    /// The system files `TUNECACHE_SYSTEM_PATH` names, in order (empty parts skipped).
    pub fn system_paths(&self) -> Vec<std::path::PathBuf> {
        self.get_os(crate::ENV_SYSTEM_PATH)
            .map(|v| {
                std::env::split_paths(v)
                    .filter(|p| !p.as_os_str().is_empty())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether `name` is set to something other than nothing or blanks.
    pub fn is_set(&self, name: &str) -> bool {
        self.get_os(name)
            .is_some_and(|v| !v.to_string_lossy().trim().is_empty())
    }
}

/// The table's own spelling of `name`.
fn static_name(name: &str) -> Result<&'static str, UnknownSetting> {
    VARIABLES
        .iter()
        .map(|v| v.name)
        .chain(FOREIGN.iter().copied())
        .find(|n| *n == name)
        .ok_or_else(|| UnknownSetting(name.to_owned()))
}

/// Whether `name` is a variable of [`VARIABLES`] or of the test harness.
pub fn known(name: &str) -> bool {
    VARIABLES.iter().any(|v| v.name == name)
        || TEST_ONLY_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The table as plain text, for `--help`: each variable, then its meaning and default
/// indented, within 96 columns.
pub fn text() -> String {
    let mut out = String::from("Environment (docs/settings.md):\n");
    for v in VARIABLES {
        out.push_str(&format!("  {}\n", v.name));
        let said = format!("{} [unset: {}]", v.meaning, v.default).replace('`', "");
        let mut line = String::new();
        for word in said.split(' ') {
            if !line.is_empty() && 6 + line.len() + 1 + word.len() > 96 {
                out.push_str(&format!("      {line}\n"));
                line.clear();
            }
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
        out.push_str(&format!("      {line}\n"));
    }
    out
}

/// The table as Markdown, as docs/settings.md holds it (a test compares the two).
#[cfg(test)]
pub(crate) fn markdown() -> String {
    let mut out =
        String::from("| variable | read by | what it sets | unset |\n|---|---|---|---|\n");
    for v in VARIABLES {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            v.name, v.read_by, v.meaning, v.default
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    /// A builder or a tier source printed with `{:?}` carries its settings: no secret in them
    /// is printed.
    #[test]
    fn debug_leaves_secrets_out() {
        let s = super::Settings::default()
            .with("AWS_SECRET_ACCESS_KEY", "s3cret-key")
            .and_then(|s| s.with("AWS_SESSION_TOKEN", "s3cret-token"))
            .and_then(|s| s.with("TUNECACHE_REMOTE", "redis://alice:s3cret-pw@h:6379/0"))
            .and_then(|s| s.with("AWS_REGION", "us-east-1"))
            .expect("known names");
        let shown = format!("{s:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(
            shown.contains("AWS_SECRET_ACCESS_KEY") && shown.contains("us-east-1"),
            "{shown}"
        );
    }

    use super::*;

    #[test]
    fn every_variable_is_named_once_and_said_in_full() {
        let mut names: Vec<&str> = VARIABLES.iter().map(|v| v.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), VARIABLES.len(), "a variable listed twice");
        for v in VARIABLES {
            assert!(v.name.starts_with("TUNECACHE_"), "{}", v.name);
            assert!(!v.meaning.is_empty() && !v.default.is_empty(), "{}", v.name);
            assert!(!TEST_ONLY_PREFIXES.iter().any(|p| v.name.starts_with(p)));
            assert!(text().contains(v.name) && markdown().contains(v.name));
        }
        // An unknown name, spelt in two pieces so this file does not use it (`cargo xtask tidy`).
        assert!(known("TUNECACHE_TEST_CHILD") && !known(&format!("{}NOPE", "TUNECACHE_")));
        assert!(
            text().lines().all(|l| l.chars().count() <= 96),
            "{}",
            text()
        );
    }

    #[test]
    fn settings_are_given_unset_and_read_back_and_an_unknown_name_is_refused() {
        let s = Settings::default()
            .with("TUNECACHE_REMOTE", "redis://127.0.0.1:1/0")
            .expect("known")
            .with("HOSTNAME", "h")
            .expect("foreign");
        assert_eq!(s.get("TUNECACHE_REMOTE"), Some("redis://127.0.0.1:1/0"));
        assert!(s.is_set("TUNECACHE_REMOTE") && !s.is_set("TUNECACHE_DIR"));
        let s = s.with("TUNECACHE_REMOTE", "  ").expect("known");
        assert!(!s.is_set("TUNECACHE_REMOTE"), "blank is unset");
        assert_eq!(s.clone().without("HOSTNAME").get("HOSTNAME"), None);
        let e = Settings::default().with(&format!("{}NOPE", "TUNECACHE_"), "1");
        assert!(e.is_err(), "{e:?}");
        // Paths need not be UTF-8: get_os keeps them, get does not pretend.
        #[cfg(unix)]
        {
            use std::os::unix::ffi::OsStringExt as _;
            let odd = OsString::from_vec(vec![0x66, 0xff]);
            let s = Settings::default()
                .with("TUNECACHE_DIR", odd.clone())
                .expect("known");
            assert_eq!(s.get_os("TUNECACHE_DIR"), Some(odd.as_os_str()));
            assert_eq!(s.get("TUNECACHE_DIR"), None);
        }
    }

    /// docs/settings.md holds the table as [`markdown`] makes it.
    #[test]
    fn the_settings_document_holds_the_table() {
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/settings.md"),
        )
        .expect("docs/settings.md");
        assert!(
            doc.contains(&markdown()),
            "docs/settings.md is not the table of cache_core::settings; put this in it:\n{}",
            markdown()
        );
    }
}
