//! Opening a cache: what it can do with its location is decided by a pure function
//! ([`plan`]) from facts about the location that a [`Probe`] gathers (the only I/O of the
//! decision); construction then carries the plan out: the lower tiers, the first read of
//! the file, and the saver thread.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

use cache_format::CacheData;
use cache_migrate::Migrations;

use super::file::FileSide;
use super::notice::Notice;
use super::notice::Notices;
use super::system::SystemTier;
use super::tiers::Lower;
use super::{Cache, Mode, Saving, Shared, State, Timings};
use crate::config::{CacheBuilder, Location, MemoryOnly};
use crate::disk::{Disk, DiskOptions, Event, Failure, Incoming, Paths};
use crate::error::StoreError;
use crate::fsio;
use crate::lock::CacheLock;
use crate::memory::MemoryStore;
use crate::tier::{Tier, TierContext, TierLink};

/// What a cache will do with its location.
#[derive(Debug, PartialEq)]
pub(super) enum Plan {
    /// Keep results in memory only.
    Memory {
        /// Why, for `Health::reason` (`None`: nothing to say).
        reason: Option<String>,
        /// The warning to give, if any.
        notice: Option<Notice>,
    },
    /// Read (and, when persistent, write) the file at `path`.
    File {
        path: PathBuf,
        /// `Persistent` or `ReadOnly`.
        mode: Mode,
        reason: Option<String>,
        notice: Option<Notice>,
    },
}

/// The facts about a location [`plan`] needs, each gathered only when asked.
pub(super) trait Probe {
    /// The first of the cache's paths that is not a regular file (a device, a FIFO, a
    /// folder), if any, and whether the cache's path is a symbolic link (to name it too).
    fn irregular(&self) -> Option<(StoreError, bool)>;
    /// Makes the folder and the lock file; why that failed.
    fn prepare(&self) -> Result<(), String>;
    /// Whether the snapshot exists.
    fn exists(&self) -> bool;
}

/// The decision: from the resolved location, whether a file with this application name can
/// be read at all (`header`), and the probe's facts.
pub(super) fn plan(location: Location, header: Result<(), String>, probe: &impl Probe) -> Plan {
    let (path, read_only) = match location {
        Location::Memory(why) => {
            let notice = match &why {
                MemoryOnly::NoLocation(reason) => Some(Notice::memory_only(reason)),
                MemoryOnly::Disabled => None,
            };
            return Plan::Memory {
                reason: Some(why.to_string()),
                notice,
            };
        }
        Location::File { path, read_only } => (path, read_only),
    };
    // A file this build could write but no reader could read (an application name that makes
    // the header too large): keep results in memory instead.
    if let Err(reason) = header {
        return Plan::Memory {
            notice: Some(Notice::memory_only(&reason)),
            reason: Some(reason),
        };
    }
    // A device, a FIFO or a folder at any of the cache's paths is never read, written, locked
    // or renamed (TUNECACHE_FILE=/dev/null means "no file", not "replace /dev/null").
    if let Some((e, is_link)) = probe.irregular() {
        let link = is_link.then_some(path.as_path());
        return Plan::Memory {
            notice: Some(Notice::not_a_file(&e, link)),
            reason: Some(e.to_string()),
        };
    }
    if read_only {
        return Plan::File {
            path,
            mode: Mode::ReadOnly,
            reason: Some("read-only".to_owned()),
            notice: None,
        };
    }
    match probe.prepare() {
        Ok(()) => Plan::File {
            path,
            mode: Mode::Persistent,
            reason: None,
            notice: None,
        },
        Err(why) => {
            let notice = Some(Notice::unwritable(&path, &why));
            let reason = Some(format!("cannot write {}: {why}", path.display()));
            if probe.exists() {
                Plan::File {
                    path,
                    mode: Mode::ReadOnly,
                    reason,
                    notice,
                }
            } else {
                Plan::Memory { reason, notice }
            }
        }
    }
}

/// The real facts, read from the file system.
struct FileProbe<'a> {
    /// The path as configured (perhaps a symbolic link).
    given: &'a Path,
    /// The files, the link resolved.
    paths: &'a Paths,
}

impl Probe for FileProbe<'_> {
    fn irregular(&self) -> Option<(StoreError, bool)> {
        let p = self.paths;
        [&p.snapshot, &p.journal, &p.lock]
            .into_iter()
            .find_map(|path| fsio::check_regular(path).err())
            .map(|e| (e, p.snapshot != self.given))
    }

    fn prepare(&self) -> Result<(), String> {
        let p = self.paths;
        std::fs::create_dir_all(&p.dir)
            .map_err(|e| format!("cannot create {}: {e}", p.dir.display()))?;
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&p.lock)
            .map(|_| ())
            .map_err(|e| format!("cannot open {}: {e}", p.lock.display()))
    }

    fn exists(&self) -> bool {
        self.paths.snapshot.exists()
    }
}

/// Whether a file of this application can be read back at all.
fn header_fits(builder: &CacheBuilder) -> Result<(), String> {
    let registry = &builder.registry;
    let empty =
        cache_format::encode_snapshot(registry.app(), registry.current(), &CacheData::new());
    cache_format::peek_header(&empty, &builder.limits)
        .map(|_| ())
        .map_err(|e| {
            format!(
                "the application name ({} bytes) makes a file no reader accepts: {e}",
                registry.app().len()
            )
        })
}

/// A cache's disk options, as its builder says.
fn disk_options(builder: &CacheBuilder) -> DiskOptions {
    let mut options = DiskOptions::new(builder.limits);
    options.compact_ratio = builder.compact_ratio;
    options.compact_min_bytes = builder.compact_min_bytes;
    options.backup_on_migrate = builder.backup_on_migrate;
    options.compaction_budget = builder.compaction_budget;
    options.retention = builder.retention;
    options
}

impl CacheBuilder {
    /// Opens the cache. Never fails: a location that cannot be used degrades to memory with
    /// one warning, visible afterwards in [`Cache::health`].
    pub fn open(self) -> Cache {
        Cache::open(self)
    }
}

impl Cache {
    pub(crate) fn open(builder: CacheBuilder) -> Cache {
        let (location, warnings) = builder.resolve();
        let plan = match &location {
            Location::File { path, .. } => {
                let (given, paths) = (path.clone(), Paths::new(path.clone()));
                let probe = FileProbe {
                    given: &given,
                    paths: &paths,
                };
                plan(location, header_fits(&builder), &probe)
            }
            Location::Memory(_) => plan(location, Ok(()), &NoFile),
        };
        let registry = Arc::new(builder.registry.clone());
        let (shared, notes) = construct(&builder, &registry, &plan);
        for w in warnings.into_iter().chain(notes) {
            shared.diag.notify(Notice::config(w));
        }
        let mut cache = Cache {
            shared: Arc::clone(&shared),
            saver: None,
        };
        let (path, mode, reason, notice) = match plan {
            Plan::Memory { reason, notice } => {
                shared.diag.set_reason(reason, notice);
                return cache;
            }
            Plan::File {
                path,
                mode,
                reason,
                notice,
            } => (path, mode, reason, notice),
        };
        shared.diag.set_reason(reason, notice);
        let options = disk_options(&builder);
        let paths = Paths::new(path);
        let mut disk = Disk::new(paths, registry, options);
        if !shared.first_read(&mut disk, mode) {
            return cache;
        }
        shared.diag.lock().mode = mode;
        if mode == Mode::Persistent || shared.saving.timings.refresh_interval.is_some() {
            cache.saver = shared.start_saver(disk, mode);
        }
        cache
    }
}

/// A location with no file: nothing to probe.
struct NoFile;

impl Probe for NoFile {
    fn irregular(&self) -> Option<(StoreError, bool)> {
        None
    }
    fn prepare(&self) -> Result<(), String> {
        Ok(())
    }
    fn exists(&self) -> bool {
        false
    }
}

/// The cache's shared state with its lower tiers open (the system tier first); the strings
/// are warnings from opening the tiers.
fn construct(
    builder: &CacheBuilder,
    registry: &Arc<Migrations>,
    plan: &Plan,
) -> (Arc<Shared>, Vec<String>) {
    let mut notes = Vec::new();
    let path = match plan {
        Plan::File { path, .. } => Some(path.clone()),
        Plan::Memory { .. } => None,
    };
    let shared = Arc::new_cyclic(|weak: &std::sync::Weak<Shared>| {
        let mut tiers: Vec<Arc<dyn Tier>> = Vec::new();
        let (system, system_notes) = SystemTier::load(
            &builder.system_paths(),
            registry,
            &builder.limits,
            &builder.scope,
        );
        notes.extend(system_notes.into_iter().map(|n| format!("tunecache: {n}")));
        if let Some(system) = system {
            tiers.push(Arc::new(system));
        }
        let first_offered = tiers.len();
        let mut ctx = TierContext {
            registry,
            scope: &builder.scope,
            limits: &builder.limits,
            save_delay: builder.save_delay,
            link: TierLink::new(weak.clone() as std::sync::Weak<dyn crate::tier::Served>),
            cache_file: path.as_deref(),
            settings: builder.settings(),
            warnings: Vec::new(),
            handles: Vec::new(),
        };
        for source in builder.tier_sources() {
            if let Some(tier) = source.open(&mut ctx) {
                tiers.push(tier);
            }
        }
        notes.append(&mut ctx.warnings);
        let handles = std::mem::take(&mut ctx.handles);
        Shared {
            memory: MemoryStore::new(),
            registry: Arc::clone(registry),
            limits: builder.limits,
            file: FileSide::new(path),
            compactor: Default::default(),
            scope: builder.scope.clone(),
            saving: Saving {
                state: Mutex::new(State::new()),
                cv: Condvar::new(),
                timings: Timings {
                    save_delay: builder.save_delay,
                    lock_timeout: builder.lock_timeout,
                    flush_timeout: builder.effective_flush_timeout(),
                    refresh_interval: builder.refresh_interval,
                    max_retry_delay: builder.max_retry_delay,
                },
            },
            diag: Notices::new(),
            lower: Lower::new(tiers, first_offered, handles),
            local_claims: Arc::default(),
        }
    });
    (shared, notes)
}

impl State {
    fn new() -> Self {
        State {
            dirty: HashSet::new(),
            own: HashSet::new(),
            other: CacheData::new(),
            put_seq: 0,
            durable_seq: 0,
            dirty_since: None,
            rewrite: false,
            flush_requested: 0,
            flush_served: 0,
            refresh_requested: 0,
            refresh_served: 0,
            last_error: None,
            retry_at: None,
            failures: 0,
            shutdown: false,
            saver_running: false,
            paused: 0,
            saving: false,
            patient: super::patient::Patient::default(),
        }
    }
}

/// The first read of [`Cache::open`]: an unlocked read (a table's fixed start, one commit and
/// the journal, whatever the number of entries; a file of an older format whole), then, with
/// `writable` and the lock free right now, a locked reconcile: read what changed since
/// (usually nothing) and make the repairs a locked read makes (cut a torn tail, remove a
/// stale journal or leftover temporaries). A read that found damage is redone whole under
/// the lock, so the damage is kept aside and reported once, as a locked read does. With the
/// lock busy, the saver's locked reads repair a torn tail, and leftover temporaries wait for
/// the next open or rewrite that holds the lock. Returns the reads to absorb, in order.
pub(super) fn open_read(disk: &mut Disk, writable: bool) -> Result<Vec<Incoming>, Failure> {
    let first = disk.read_updates(false)?;
    let held = if writable {
        CacheLock::try_acquire(&disk.paths.lock, &disk.paths.dir)
            .ok()
            .flatten()
    } else {
        None
    };
    let Some(_held) = held else {
        return Ok(vec![first]);
    };
    fsio::remove_stale_temporaries(&disk.paths.snapshot);
    fsio::remove_stale_temporaries(&disk.paths.journal);
    let damaged = first.events.iter().any(|e| {
        matches!(
            e,
            Event::Unusable { .. } | Event::DamagedRecords { kept: None, .. }
        )
    });
    if damaged {
        disk.reset();
        return Ok(vec![disk.read_updates(true)?]);
    }
    let reconcile = disk.read_updates(true)?;
    Ok(vec![first, reconcile])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// Canned facts, counting what was asked.
    struct Facts {
        irregular: Option<bool>,
        prepare: Result<(), String>,
        exists: bool,
        prepared: Cell<u32>,
    }

    impl Facts {
        fn fine() -> Self {
            Facts {
                irregular: None,
                prepare: Ok(()),
                exists: true,
                prepared: Cell::new(0),
            }
        }
    }

    impl Probe for Facts {
        fn irregular(&self) -> Option<(StoreError, bool)> {
            self.irregular.map(|link| {
                let e = StoreError::NotAFile {
                    path: PathBuf::from("/dev/null"),
                    kind: "a character device",
                };
                (e, link)
            })
        }
        fn prepare(&self) -> Result<(), String> {
            self.prepared.set(self.prepared.get() + 1);
            self.prepare.clone()
        }
        fn exists(&self) -> bool {
            self.exists
        }
    }

    fn file(read_only: bool) -> Location {
        Location::File {
            path: PathBuf::from("/c/app.tcache"),
            read_only,
        }
    }

    fn mode(plan: &Plan) -> Option<Mode> {
        match plan {
            Plan::File { mode, .. } => Some(*mode),
            Plan::Memory { .. } => None,
        }
    }

    #[test]
    fn a_usable_file_is_persistent_and_prepared_once() {
        let facts = Facts::fine();
        let p = plan(file(false), Ok(()), &facts);
        assert_eq!(mode(&p), Some(Mode::Persistent));
        assert_eq!(facts.prepared.get(), 1);
    }

    #[test]
    fn disabled_is_memory_without_a_warning_and_no_location_warns() {
        let p = plan(
            Location::Memory(MemoryOnly::Disabled),
            Ok(()),
            &Facts::fine(),
        );
        assert!(matches!(p, Plan::Memory { notice: None, reason: Some(r) } if r == "disabled"));
        let p = plan(
            Location::Memory(MemoryOnly::NoLocation("no home".into())),
            Ok(()),
            &Facts::fine(),
        );
        assert!(matches!(
            p,
            Plan::Memory {
                notice: Some(_),
                ..
            }
        ));
    }

    #[test]
    fn a_header_no_reader_accepts_or_a_device_is_memory_and_nothing_is_created() {
        let facts = Facts::fine();
        let p = plan(file(false), Err("too long".into()), &facts);
        assert!(matches!(p, Plan::Memory { reason: Some(r), .. } if r == "too long"));
        let device = Facts {
            irregular: Some(false),
            ..Facts::fine()
        };
        let p = plan(file(false), Ok(()), &device);
        assert!(matches!(
            p,
            Plan::Memory {
                notice: Some(_),
                ..
            }
        ));
        assert_eq!(facts.prepared.get() + device.prepared.get(), 0);
    }

    #[test]
    fn read_only_reads_and_never_prepares() {
        let facts = Facts::fine();
        let p = plan(file(true), Ok(()), &facts);
        assert_eq!(mode(&p), Some(Mode::ReadOnly));
        assert_eq!(facts.prepared.get(), 0);
    }

    #[test]
    fn an_unwritable_location_reads_an_existing_file_and_is_memory_otherwise() {
        let existing = Facts {
            prepare: Err("denied".into()),
            ..Facts::fine()
        };
        assert_eq!(
            mode(&plan(file(false), Ok(()), &existing)),
            Some(Mode::ReadOnly)
        );
        let missing = Facts {
            prepare: Err("denied".into()),
            exists: false,
            ..Facts::fine()
        };
        let p = plan(file(false), Ok(()), &missing);
        assert!(
            matches!(p, Plan::Memory { reason: Some(r), notice: Some(_) } if r.contains("denied"))
        );
    }

    #[test]
    fn a_link_to_a_device_names_the_device_and_the_link() {
        for link in [false, true] {
            let facts = Facts {
                irregular: Some(link),
                ..Facts::fine()
            };
            let Plan::Memory { reason, notice } = plan(file(false), Ok(()), &facts) else {
                panic!("a device is never a file")
            };
            assert!(reason.is_some_and(|r| r.contains("/dev/null")));
            let text = format!("{notice:?}");
            assert_eq!(text.contains("/c/app.tcache"), link, "{text}");
        }
    }
}
