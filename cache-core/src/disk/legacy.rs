//! Reading a cache file of an older format (1 to 3: one msgpack snapshot), whole: every entry
//! is checked, decoded and migrated, and memory mirrors the file until the first writer
//! rewrites it as a table (format 4).

use cache_format::{FormatError, read_snapshot};
use cache_migrate::{FORMAT_STEPS, MigrateError, StepReport, upgrade_snapshot};

use super::{Base, Disk, Event, Failure, Incoming, Loaded, SnapState};
use crate::fsio;

impl Disk {
    pub(super) fn load_legacy(&self, inc: &mut Incoming) -> Result<Loaded, Failure> {
        let path = &self.paths.snapshot;
        let Some((bytes, id)) = fsio::read_with_id(path, self.options.limits.max_file_bytes)?
        else {
            return Ok(Loaded::Missing);
        };
        let bytes = match bytes {
            Ok(bytes) => bytes,
            Err(too_large) => return Ok(Loaded::Unusable(too_large.into())),
        };
        let snap = match read_snapshot(&bytes, &self.options.limits) {
            Ok(snap) => snap,
            // It began as a cache (Disk::load_base checked) and ends within the marker: say
            // so, not "not a tunecache file", when it is set aside.
            Err(FormatError::NotTunecache { what, .. }) if bytes.len() < 16 => {
                let cut = FormatError::Truncated {
                    what,
                    offset: bytes.len() as u64,
                    needed: 16 - bytes.len() as u64,
                    available: 0,
                };
                return Ok(Loaded::Unusable(cut.into()));
            }
            Err(e @ FormatError::NewerFormat { .. }) => {
                return Err(self.blocked(path, e.into()));
            }
            Err(e) => return Ok(Loaded::Unusable(e.into())),
        };
        let up = match upgrade_snapshot(&self.registry, &snap, &self.options.limits) {
            Ok(up) => up,
            Err(e @ (MigrateError::Foreign { .. } | MigrateError::NewerSchema { .. })) => {
                return Err(self.blocked(path, e.into()));
            }
            Err(e) => return Ok(Loaded::Unusable(e.into())),
        };
        let schema = snap.header.schema;
        // The file is rewritten as a table by the next save: that is the format step 3→4,
        // reported with whatever the schema steps did (and, like them, the old file is kept
        // as a backup when the cache keeps backups of migrated files).
        let mut report = up.report.unwrap_or_else(|| cache_migrate::Report {
            app: snap.header.app.clone(),
            from: schema,
            to: schema,
            entries: up.data.len() as u64,
            steps: Vec::new(),
            collisions: Vec::new(),
        });
        report.steps.extend(table_steps());
        inc.data = up.data;
        inc.whole = true;
        inc.needs_rewrite = true;
        inc.events.push(Event::Migrated {
            path: path.clone(),
            report,
        });
        Ok(Loaded::Base(Base::Legacy(SnapState {
            id,
            generation: snap.header.generation,
            migrated_from: Some(schema),
        })))
    }
}

/// The container steps from a format 3 file to a table (format 4), as a report lists them:
/// a file of an older format read whole is rewritten as a table.
pub(crate) fn table_steps() -> Vec<StepReport> {
    FORMAT_STEPS
        .iter()
        .filter(|s| s.from >= 3 && s.to <= cache_format::FORMAT_VERSION)
        .map(|s| StepReport {
            from: s.from,
            to: s.to,
            description: format!("container format: {}", s.description),
            changes: Vec::new(),
        })
        .collect()
}
