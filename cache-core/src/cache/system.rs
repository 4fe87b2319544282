//! The read-only system tier: bundles or cache files shipped with an installation (a container
//! image, a wheel), read once at open behind the user's own file. Nothing here locks, writes,
//! repairs or moves them: a file that cannot be used is reported once and ignored. Lookups go
//! memory (the user's file) → system → any other tier; the user's entries win. It is the
//! first [`Tier`]: its entries are served as they are ([`Fill::Serve`]), never copied into the
//! user's file.

use std::any::Any;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cache_format::bundle::{BUNDLE_MARKER, read_bundle};
use cache_format::{Entry, Fingerprint, Limits, Scope};
use cache_migrate::Migrations;

use crate::memory::MemoryStore;
use crate::namespace::Namespace;
use crate::tier::{Fill, Tier, TierHealth};

/// The system files' entries of the cache's scope, in memory.
#[derive(Debug)]
pub(crate) struct SystemTier {
    store: MemoryStore,
    describe: String,
    ignored: u64,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl SystemTier {
    /// Reads every file of `paths` once; `None` if none of them holds an entry of `scope`.
    /// The strings are warnings about files that are not used, and why.
    pub(crate) fn load(
        paths: &[PathBuf],
        registry: &Migrations,
        limits: &Limits,
        scope: &Scope,
    ) -> (Option<SystemTier>, Vec<String>) {
        let store = MemoryStore::new();
        let mut notes = Vec::new();
        for p in paths {
            match load(p, registry, limits, scope) {
                Ok(entries) => {
                    store.merge_many(entries);
                }
                Err(why) => notes.push(format!(
                    "tunecache: the system file {} is ignored: {why}",
                    p.display()
                )),
            }
        }
        if store.is_empty() {
            return (None, notes);
        }
        let describe = paths
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(":");
        let tier = SystemTier {
            store,
            describe,
            ignored: notes.len() as u64,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        };
        (Some(tier), notes)
    }
}

impl Tier for SystemTier {
    fn name(&self) -> &'static str {
        "system"
    }

    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn budget(&self) -> Duration {
        Duration::ZERO
    }

    fn fill(&self) -> Fill {
        Fill::Serve
    }

    fn get_many(&self, ns: Namespace, fps: &[Fingerprint]) -> Vec<Arc<Entry>> {
        let found: Vec<Arc<Entry>> = fps.iter().filter_map(|fp| self.store.get(ns, fp)).collect();
        self.hits.fetch_add(found.len() as u64, Ordering::Relaxed);
        self.misses
            .fetch_add((fps.len() - found.len()) as u64, Ordering::Relaxed);
        found
    }

    fn health(&self) -> TierHealth {
        let counters = BTreeMap::from([
            ("entries".to_owned(), self.store.len() as u64),
            ("hits".to_owned(), self.hits.load(Ordering::Relaxed)),
            ("misses".to_owned(), self.misses.load(Ordering::Relaxed)),
            ("files ignored".to_owned(), self.ignored),
        ]);
        TierHealth {
            name: self.name(),
            describe: self.describe.clone(),
            available: true,
            counters,
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `TUNECACHE_SYSTEM_PATH`: system files, separated by `:`.
pub const ENV_SYSTEM_PATH: &str = "TUNECACHE_SYSTEM_PATH";

/// The entries of `scope` in the system file at `path` (a bundle or a snapshot file), read
/// through the version gate and migration of `registry`; the error says why it is not used.
fn load(
    path: &Path,
    registry: &Migrations,
    limits: &Limits,
    scope: &Scope,
) -> Result<Vec<(Namespace, Entry)>, String> {
    let file = crate::fsio::open_regular(path)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| "no such file".to_owned())?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    if len > limits.max_file_bytes {
        return Err(format!(
            "{len} bytes, over the limit of {}",
            limits.max_file_bytes
        ));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    // Bounded even if the file grows after its size was read.
    std::io::Read::read_to_end(
        &mut std::io::Read::take(&file, limits.max_file_bytes),
        &mut bytes,
    )
    .map_err(|e| e.to_string())?;
    let is_bundle = bytes.len() > 12 && bytes[2..10] == *BUNDLE_MARKER.as_bytes();
    let snapshot: &[u8] = if is_bundle {
        read_bundle(&bytes, limits)
            .map_err(|e| e.to_string())?
            .snapshot
    } else {
        &bytes
    };
    let snap = cache_format::read_snapshot(snapshot, limits).map_err(|e| e.to_string())?;
    let data = cache_migrate::upgrade_snapshot(registry, &snap, limits)
        .map_err(|e| e.to_string())?
        .data;
    let mut out = Vec::new();
    for (s, ns, entry) in data.entries() {
        if s == scope
            && let Ok(ns) = Namespace::new(ns)
        {
            out.push((ns, entry.clone()));
        }
    }
    Ok(out)
}

/// The system files named by `TUNECACHE_SYSTEM_PATH`.
pub(crate) fn from_env() -> Vec<PathBuf> {
    std::env::var_os(ENV_SYSTEM_PATH)
        .map(|v| {
            std::env::split_paths(&v)
                .filter(|p| !p.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default()
}
