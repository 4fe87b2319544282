//! A pinned generation (`TUNECACHE_GENERATION`) as a read-only tier of its own, with a budget of
//! its own. A cache's open never waits for the download: a background thread reads the
//! pointer, fetches the generation into the one local folder (verified whole in a temporary
//! file, then put in place: [`super::Generations::fetch`]) and opens it; a lookup that arrives
//! first waits for it within the tier's budget (every rank of a job must answer from the same
//! bytes), then falls through to the other tiers with one warning. Its state (pending, ready,
//! refused and why) is in the cache's health. The CLI, Python, C and Rust all get it the same
//! way: through [`crate::RemoteBuilder`].

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use cache_core::{Fill, Namespace, Tier, TierContext, TierHealth, TierSource};
use cache_format::{Entry, Fingerprint};

use super::{ENV_GENERATION, GenerationError, Generations};
use crate::server::S3Remote;

/// How long a lookup waits for a pinned generation still being fetched.
pub(crate) const GENERATION_WAIT: Duration = Duration::from_secs(10);

/// The longest a generation's download may take while bytes keep arriving.
pub(crate) const DOWNLOAD_CAP: Duration = Duration::from_secs(3600);

/// The folder where a machine keeps the generations it fetched: `generations/` beside the
/// cache file, or in tunecache's default folder for a cache without one.
pub fn generation_dir(cache_file: Option<&Path>) -> Option<PathBuf> {
    match cache_file {
        Some(file) => Some(
            file.parent()
                .filter(|p| !p.as_os_str().is_empty())
                .map_or_else(|| PathBuf::from("generations"), |p| p.join("generations")),
        ),
        None => cache_core::default_dir().map(|d| d.join("generations")),
    }
}

/// The generation `id` (`current`, or an id) of the bucket `store` shares, fetched (verified,
/// and with `TUNECACHE_TRUST` set, its signatures checked) into `dir` unless it is there
/// already: what the tier's thread and the CLI do alike. Pinned to `current`, a generation the
/// pointer names that is refused (damaged, unsigned, rolled back) or cannot be had leaves the
/// one this machine last took for `current` in force, with a warning.
///
/// `trust`: the policy file, if any (a caller takes `TUNECACHE_TRUST`'s from its settings:
/// `trust::policy_path`).
pub fn fetch_pinned(
    store: S3Remote,
    id: &str,
    dir: &Path,
    timeout: Duration,
    trust: Option<&Path>,
) -> Result<PathBuf, GenerationError> {
    let given = match trust {
        Some(path) => Some(
            crate::trust::Trust::read(path).map_err(|e| GenerationError::Refused(e.to_string()))?,
        ),
        None => None,
    };
    let trust = match given {
        Some(t) => Some(
            t.in_force(dir)
                .map_err(|e| GenerationError::Refused(e.to_string()))?,
        ),
        None => None,
    };
    let id = id.trim();
    let last = dir.join(format!(
        ".current-{}",
        last_key(&crate::Remote::describe(&store))
    ));
    let generations = Generations::new(store);
    match generations.fetch(id, dir, timeout, trust.as_ref()) {
        Ok(path) => {
            if id == "current"
                && let Some(name) = path.file_name().and_then(|n| n.to_str())
            {
                let _ = cache_core::file::write_atomic(&last, name.as_bytes());
            }
            Ok(path)
        }
        Err(e) if id == "current" => {
            let had = std::fs::read_to_string(&last)
                .ok()
                .and_then(|name| name.strip_suffix(".tcb").map(str::to_owned))
                .filter(|had| super::is_id(had));
            let Some(had) = had else {
                return Err(e);
            };
            // The generation it had, checked as any local one is.
            let path = generations.fetch(&had, dir, timeout, trust.as_ref())?;
            tracing::warn!(
                "tunecache: {ENV_GENERATION}=current: {e}; serving {had}, the generation this \
                 machine took for `current` before"
            );
            Ok(path)
        }
        Err(e) => Err(e),
    }
}

/// A short name for a bucket's address, for the file that remembers its `current`.
fn last_key(describe: &str) -> String {
    use sha2::Digest as _;
    let h = sha2::Sha256::digest(describe.as_bytes());
    h[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// Keys a generation holds that were published one at a time after it: read per key.
pub(crate) type Newer = HashSet<(Namespace, Fingerprint)>;

/// Where a generation stands.
#[derive(Debug)]
pub(crate) enum State {
    Pending,
    /// Served, but for the keys published after it.
    Ready(Arc<dyn Tier>, Arc<Newer>),
    /// Nothing to serve: why (no generation yet, or none for this cache's scope).
    Empty(String),
    Refused(String),
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct GenerationTier {
    state: Mutex<State>,
    cv: Condvar,
    describe: String,
    budget: Duration,
    /// The bucket's current generation as a warm-up (`warm.rs`), not a pinned one: a lookup
    /// never waits for it.
    warm: bool,
    /// A lookup fell through while it was pending: said once.
    warned: AtomicBool,
    waited_out: AtomicU64,
    hits: AtomicU64,
}

impl GenerationTier {
    /// A tier waiting for its generation: pinned (`warm` false: a lookup waits for it at most
    /// [`GENERATION_WAIT`]) or a warm-up (never waited for).
    pub(crate) fn new(describe: String, warm: bool) -> Self {
        GenerationTier {
            state: Mutex::new(State::Pending),
            cv: Condvar::new(),
            describe,
            budget: if warm {
                Duration::ZERO
            } else {
                GENERATION_WAIT
            },
            warm,
            warned: AtomicBool::new(false),
            waited_out: AtomicU64::new(0),
            hits: AtomicU64::new(0),
        }
    }

    pub(crate) fn set(&self, state: State) {
        *crate::lock(&self.state) = state;
        self.cv.notify_all();
    }

    /// The tier that serves the generation, once ready, and the keys it does not answer;
    /// waits for it at most the budget.
    fn ready(&self) -> Option<(Arc<dyn Tier>, Arc<Newer>)> {
        let deadline = cache_core::deadline_after(self.budget);
        let mut st = crate::lock(&self.state);
        loop {
            match &*st {
                State::Ready(t, newer) => return Some((Arc::clone(t), Arc::clone(newer))),
                State::Empty(_) | State::Refused(_) => return None,
                State::Pending if self.warm => {
                    drop(st);
                    self.waited_out.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
                State::Pending => {}
            }
            let now = Instant::now();
            if now >= deadline {
                drop(st);
                self.waited_out.fetch_add(1, Ordering::Relaxed);
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "tunecache: {} is still being fetched after {:?}: this lookup goes on \
                         without it (later ones use it once it is ready)",
                        self.describe,
                        self.budget
                    );
                }
                return None;
            }
            st = self
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

impl Tier for GenerationTier {
    fn name(&self) -> &'static str {
        "generation"
    }

    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn budget(&self) -> Duration {
        self.budget
    }

    fn fill(&self) -> Fill {
        Fill::Serve
    }

    fn get_many(&self, ns: Namespace, fps: &[Fingerprint]) -> Vec<Arc<Entry>> {
        let Some((tier, newer)) = self.ready() else {
            return Vec::new();
        };
        let found = if newer.is_empty() {
            tier.get_many(ns, fps)
        } else {
            let asked: Vec<Fingerprint> = fps
                .iter()
                .filter(|fp| !newer.contains(&(ns, **fp)))
                .copied()
                .collect();
            if asked.is_empty() {
                return Vec::new();
            }
            tier.get_many(ns, &asked)
        };
        self.hits.fetch_add(found.len() as u64, Ordering::Relaxed);
        found
    }

    fn health(&self) -> TierHealth {
        let (available, state, mut counters) = match &*crate::lock(&self.state) {
            State::Pending => (
                false,
                "pending: being fetched".to_owned(),
                Default::default(),
            ),
            State::Ready(t, newer) => {
                let mut counters = t.health().counters;
                if self.warm {
                    counters.insert("keys published after it".to_owned(), newer.len() as u64);
                }
                (true, "ready".to_owned(), counters)
            }
            State::Empty(why) => (false, why.clone(), Default::default()),
            State::Refused(why) => (false, format!("refused: {why}"), Default::default()),
        };
        counters.insert("hits".to_owned(), self.hits.load(Ordering::Relaxed));
        let waited_out = if self.warm {
            "lookups before it was ready"
        } else {
            "lookups that did not wait for it"
        };
        counters.insert(
            waited_out.to_owned(),
            self.waited_out.load(Ordering::Relaxed),
        );
        TierHealth {
            name: self.name(),
            describe: self.describe.clone(),
            available,
            counters,
            state: Some(state),
        }
    }
}

/// A pinned generation waiting for its cache (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct GenerationSource {
    pub(crate) address: String,
    pub(crate) id: String,
    /// The trust policy file (`None`: `TUNECACHE_TRUST`'s).
    pub(crate) trust: Option<PathBuf>,
    /// The settings the bucket is opened with (its endpoint and credentials).
    pub(crate) settings: cache_core::settings::Settings,
}

impl GenerationSource {
    /// The generation `TUNECACHE_GENERATION` pins in `settings` on the bucket `address`, if it
    /// pins one, checked against the policy `trust` (`None`: the one `TUNECACHE_TRUST` names).
    pub(crate) fn from_settings(
        address: &str,
        trust: Option<&Path>,
        settings: &cache_core::settings::Settings,
    ) -> Option<Self> {
        let id = settings.get(ENV_GENERATION)?;
        let id = id.trim();
        if id.is_empty()
            || id.eq_ignore_ascii_case(super::OFF)
            || !address.trim().starts_with("s3://")
        {
            return None;
        }
        Some(GenerationSource {
            address: address.trim().to_owned(),
            id: id.to_owned(),
            trust: trust
                .map(Path::to_owned)
                .or_else(|| crate::trust::policy_path(settings)),
            settings: settings.clone(),
        })
    }
}

impl TierSource for GenerationSource {
    fn open(&self, ctx: &mut TierContext<'_>) -> Option<Arc<dyn Tier>> {
        let store = match S3Remote::open(&self.address, |name| {
            self.settings.get(name).map(str::to_owned)
        }) {
            Ok(store) => store,
            Err(e) => {
                ctx.warn(format!(
                    "tunecache: {ENV_GENERATION}={} is not used: {e}",
                    self.id
                ));
                return None;
            }
        };
        let tier = Arc::new(GenerationTier::new(
            format!(
                "generation {} of {}",
                self.id,
                crate::Remote::describe(&store)
            ),
            false,
        ));
        let Some(dir) = generation_dir(ctx.cache_file) else {
            ctx.warn(format!(
                "tunecache: {ENV_GENERATION}={} is not used: no folder to keep it in (no cache \
                 file and no home folder)",
                self.id
            ));
            return None;
        };
        let (registry, limits, scope) = (Arc::clone(ctx.registry), *ctx.limits, ctx.scope.clone());
        let (worker, id, trust) = (Arc::clone(&tier), self.id.clone(), self.trust.clone());
        let spawned = cache_core::spawn_background("tunecache-generation".into(), move || {
            let state = match fetch_pinned(store, &id, &dir, DOWNLOAD_CAP, trust.as_deref()) {
                Ok(path) => match cache_core::serve_files(&[path], &registry, &limits, &scope) {
                    (Some(t), _) => State::Ready(t, Arc::default()),
                    (None, notes) if notes.is_empty() => {
                        State::Empty("ready, with no entry for this scope".to_owned())
                    }
                    (None, notes) => State::Refused(notes.join("; ")),
                },
                Err(e) => State::Refused(e.to_string()),
            };
            if let State::Refused(why) = &state {
                tracing::warn!("tunecache: {ENV_GENERATION}={id} is not used: {why}");
            }
            worker.set(state);
        });
        if let Err(e) = spawned {
            tier.set(State::Refused(format!("no thread to fetch it: {e}")));
        }
        Some(tier)
    }
}
