//! Where a cache's files are, and how the disk tier is tuned.

use std::path::PathBuf;

use cache_format::Limits;

use crate::fsio;

/// The files of one cache.
#[derive(Debug, Clone)]
pub(crate) struct Paths {
    pub(crate) snapshot: PathBuf,
    pub(crate) journal: PathBuf,
    pub(crate) lock: PathBuf,
    pub(crate) dir: PathBuf,
}

impl Paths {
    /// The files of the cache at `snapshot`. If `snapshot` is a symbolic link, it is resolved
    /// once, here: the journal, the lock and temporary files sit beside the target, so the link
    /// and its target share one lock and one journal, and a compaction replaces the target,
    /// leaving the link in place.
    pub(crate) fn new(snapshot: PathBuf) -> Self {
        let snapshot = fsio::resolve_link(&snapshot);
        Paths {
            // `aside` shortens a name that would pass 255 bytes, so a cache with a long name
            // still has a journal and a lock (the same rule as every other suffix).
            journal: fsio::aside(&snapshot, ".journal"),
            lock: fsio::aside(&snapshot, ".lock"),
            dir: fsio::parent_dir(&snapshot),
            snapshot,
        }
    }
}

/// Tuning of the disk tier.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DiskOptions {
    pub(crate) limits: Limits,
    /// Rewrite the table once the bytes no commit refers to pass this fraction of the live
    /// ones...
    pub(crate) compact_ratio: f64,
    /// ...and this many bytes; fold the journal into the table once it would pass this many.
    pub(crate) compact_min_bytes: u64,
    /// Keep the pre-migration files when a migrated file is rewritten.
    pub(crate) backup_on_migrate: bool,
    /// The longest a fold that is only due, or a background rewrite, may take before it is
    /// given up (`None`: no bound).
    pub(crate) compaction_budget: Option<std::time::Duration>,
    /// What a rewrite drops (old entries, the oldest past a size).
    pub(crate) retention: crate::retention::Retention,
}

impl DiskOptions {
    /// The defaults every one-shot writer uses (`gc`, `migrate`, `import`, `put`): fold the
    /// journal past 256 KiB, keep backups of migrated files, no budget, no retention (one-shot
    /// writers start no background rewrite).
    pub(crate) fn new(limits: Limits) -> Self {
        DiskOptions {
            limits,
            compact_ratio: 0.5,
            compact_min_bytes: 256 << 10,
            backup_on_migrate: true,
            compaction_budget: None,
            retention: crate::retention::Retention::default(),
        }
    }

    /// Whether a migrated file's old version is kept aside when it is rewritten.
    pub(crate) fn backup(mut self, backup: bool) -> Self {
        self.backup_on_migrate = backup;
        self
    }
}
