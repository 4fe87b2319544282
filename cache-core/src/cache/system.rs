//! The read-only system tier: bundles or cache files shipped with an installation (a container
//! image, a wheel), behind the user's own file. A table (a bundle of version 3, or a format 4
//! file at this build's versions) is opened in place, reading a few hundred bytes whatever
//! its size, and read a key at a time like the user's own file; an older file is read once,
//! whole. Nothing here locks, writes, repairs or moves them: a file that cannot be used is
//! reported once and ignored. Lookups go memory (the user's file) → system → any other tier;
//! the user's entries win. It is the first [`Tier`]: its entries are served as they are
//! ([`Fill::Serve`]), never copied into the user's file.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cache_format::bundle::{BUNDLE_MARKER, read_bundle};
use cache_format::table::{TKey, Table};
use cache_format::{Entry, Fingerprint, Limits, Scope};
use cache_migrate::Migrations;

use crate::memory::{MemoryStore, Resident};
use crate::namespace::Namespace;
use crate::tablefile::{FileBytes, TableFile};
use crate::tier::{Fill, Tier, TierHealth};

/// The system files' entries of the cache's scope.
#[derive(Debug)]
pub(crate) struct SystemTier {
    /// Tables read a key at a time, in the order given.
    tables: Vec<Arc<TableFile>>,
    /// The entries of files read whole (older formats or schemas).
    whole: MemoryStore,
    /// What lookups found in the tables (and keys they lack), kept.
    found: MemoryStore,
    scope: Scope,
    describe: String,
    ignored: u64,
    entries: u64,
    hits: AtomicU64,
    misses: AtomicU64,
}

/// A system file, opened.
enum Opened {
    /// A table at this build's versions with entries of the scope.
    Table(Box<TableFile>),
    /// Entries of the scope, read whole.
    Whole(Vec<(Namespace, Entry)>),
}

impl SystemTier {
    /// Opens every file of `paths`; `None` if none of them holds an entry of `scope`. The
    /// strings say which files are not used, and why (without a `tunecache:` prefix: the
    /// caller's message wraps them).
    pub(crate) fn load(
        paths: &[PathBuf],
        registry: &Migrations,
        limits: &Limits,
        scope: &Scope,
    ) -> (Option<SystemTier>, Vec<String>) {
        let whole = MemoryStore::new();
        let mut tables = Vec::new();
        let mut notes = Vec::new();
        let mut entries = 0u64;
        for p in paths {
            match open(p, registry, limits, scope) {
                Ok(Opened::Table(t)) => {
                    let n = t
                        .directory()
                        .map_or(0, |d| d.entries_of(&scope.fingerprint()));
                    // A file with nothing for this scope (another GPU's) is not asked.
                    if n > 0 {
                        entries += n;
                        tables.push(Arc::from(t));
                    }
                }
                Ok(Opened::Whole(found)) => {
                    entries += found.len() as u64;
                    whole.merge_many(found);
                }
                Err(why) => {
                    notes.push(format!("the system file {} is ignored: {why}", p.display()))
                }
            }
        }
        if tables.is_empty() && whole.is_empty() {
            return (None, notes);
        }
        let describe = paths
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(":");
        let found = MemoryStore::new();
        found.set_backed(true);
        let tier = SystemTier {
            tables,
            whole,
            found,
            scope: scope.clone(),
            describe,
            ignored: notes.len() as u64,
            entries,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        };
        (Some(tier), notes)
    }

    /// The entry for `fp` in `ns`: the files read whole joined with every table's (read now,
    /// then kept).
    fn lookup(&self, ns: Namespace, fp: &Fingerprint) -> Option<Arc<Entry>> {
        if self.tables.is_empty() {
            return self.whole.get(ns, fp);
        }
        match self.found.resident(ns, fp) {
            Resident::Complete(e) => return Some(e),
            Resident::Absent => return None,
            Resident::Partial | Resident::Unknown => {}
        }
        let key = TKey::of(&self.scope, ns.name(), fp);
        let mut joined: Option<Entry> = self.whole.get(ns, fp).map(|e| Entry::clone(&e));
        for t in &self.tables {
            // A damaged block of a shipped file is a miss there; `tunecache verify` names it.
            let Ok(Some(bytes)) = t.get(&key) else {
                continue;
            };
            let Ok(e) = t.decode_entry(&key, ns.name(), &bytes) else {
                continue;
            };
            match &mut joined {
                Some(j) => j.merge(e),
                None => joined = Some(e),
            }
        }
        self.found.fill(ns, fp, joined, 0, &AtomicU64::new(0))
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
        // Files read whole are in memory; a table is read a key at a time: a few `pread`s.
        if self.tables.is_empty() {
            Duration::ZERO
        } else {
            Duration::from_millis(50)
        }
    }

    fn fill(&self) -> Fill {
        Fill::Serve
    }

    fn get_many(&self, ns: Namespace, fps: &[Fingerprint]) -> Vec<Arc<Entry>> {
        let found: Vec<Arc<Entry>> = fps.iter().filter_map(|fp| self.lookup(ns, fp)).collect();
        self.hits.fetch_add(found.len() as u64, Ordering::Relaxed);
        self.misses
            .fetch_add((fps.len() - found.len()) as u64, Ordering::Relaxed);
        found
    }

    fn health(&self) -> TierHealth {
        let counters = BTreeMap::from([
            ("entries".to_owned(), self.entries),
            ("hits".to_owned(), self.hits.load(Ordering::Relaxed)),
            ("misses".to_owned(), self.misses.load(Ordering::Relaxed)),
            ("files ignored".to_owned(), self.ignored),
        ]);
        TierHealth {
            name: self.name(),
            describe: self.describe.clone(),
            available: true,
            counters,
            state: None,
        }
    }
}

/// The files of `paths` (bundles or cache files) as a read-only tier that serves the entries
/// of `scope` as they are, through the version gate and migration of `registry`: what the
/// system tier is, for a tier of another crate that gets its file later (a pinned
/// generation). `None` when no file holds an entry of `scope`; the strings say which files are
/// not used and why.
pub fn serve_files(
    paths: &[PathBuf],
    registry: &Migrations,
    limits: &Limits,
    scope: &Scope,
) -> (Option<Arc<dyn Tier>>, Vec<String>) {
    let (tier, notes) = SystemTier::load(paths, registry, limits, scope);
    (tier.map(|t| Arc::new(t) as Arc<dyn Tier>), notes)
}

/// `TUNECACHE_SYSTEM_PATH`: system files, separated by `:`.
pub const ENV_SYSTEM_PATH: &str = "TUNECACHE_SYSTEM_PATH";

/// Opens the system file at `path` (a bundle or a cache file) for the entries of `scope`,
/// through the version gate and migration of `registry`; the error says why it is not used.
fn open(
    path: &Path,
    registry: &Migrations,
    limits: &Limits,
    scope: &Scope,
) -> Result<Opened, String> {
    let file = crate::fsio::open_regular(path)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| "no such file".to_owned())?;
    let file = Arc::new(file);
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    let mut prefix = vec![0u8; len.min(4096) as usize];
    file.read_exact_at(&mut prefix, 0)
        .map_err(|e| e.to_string())?;
    let is_bundle = prefix.len() > 12 && prefix[2..10] == *BUNDLE_MARKER.as_bytes();
    let region = if is_bundle {
        match crate::bundle::locate(&file, len).map_err(|e| e.to_string())? {
            Some(found) => Some((found.offset, found.len)),
            None => return read_whole(&file, len, limits, registry, scope),
        }
    } else if cache_format::table::is_table(&prefix) {
        Some((0, len))
    } else {
        None
    };
    let Some((offset, size)) = region else {
        return read_whole(&file, len, limits, registry, scope);
    };
    let table = Table::open(FileBytes::region(Arc::clone(&file), offset, size), limits)
        .map_err(|e| e.to_string())?;
    let (app, schema) = (table.head().app.clone(), table.head().schema);
    registry.check(&app, schema).map_err(|e| e.to_string())?;
    if schema != registry.current() {
        // An older schema: its keys may change, so it is read whole and migrated.
        let raw = crate::disk::read_whole_table(&table).map_err(|e| e.to_string())?;
        let up = cache_migrate::upgrade(
            registry,
            cache_format::FormatVersion::V4,
            &app,
            schema,
            &cache_format::encode_payload(&raw),
            limits,
        )
        .map_err(|e| e.to_string())?;
        return Ok(Opened::Whole(of_scope(&up.data, scope)));
    }
    Ok(Opened::Table(Box::new(table)))
}

/// A system file of an older format (or bundle version), read whole.
fn read_whole(
    file: &std::fs::File,
    len: u64,
    limits: &Limits,
    registry: &Migrations,
    scope: &Scope,
) -> Result<Opened, String> {
    if len > limits.max_file_bytes {
        return Err(format!(
            "{len} bytes, over the limit of {}",
            limits.max_file_bytes
        ));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    // Bounded even if the file grows after its size was read.
    std::io::Read::read_to_end(
        &mut std::io::Read::take(file, limits.max_file_bytes),
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
    Ok(Opened::Whole(of_scope(&data, scope)))
}

/// The entries of `scope` in `data`.
fn of_scope(data: &cache_format::CacheData, scope: &Scope) -> Vec<(Namespace, Entry)> {
    let mut out = Vec::new();
    for (s, ns, entry) in data.entries() {
        if s == scope
            && let Ok(ns) = Namespace::new(ns)
        {
            out.push((ns, entry.clone()));
        }
    }
    out
}
