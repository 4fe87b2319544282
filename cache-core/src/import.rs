//! One import policy for JSON lines (the export format), shared by `tunecache import`, the
//! library and the Python package: all lines or none; each entry held as its encoded bytes
//! (a [`Spill`] per version the lines say: in memory up to a bound, then in a file), never
//! the text and the model at once;
//! timestamps from the future set to the present; lines at the cache's application and
//! schema (or saying none) taken as they are, older ones migrated through the registry (the
//! same gate and steps as every read), another application's or a newer schema's refused;
//! then every entry checked as a reader would ([`crate::check_entry`], valid namespace
//! names), the first offender named.

use std::collections::BTreeMap;
use std::io::BufRead;

use cache_format::json::{ImportOrigin, JsonLineError, Version, read_lines_each};
use cache_format::{CacheData, FormatError, FormatVersion, Limits};
use cache_migrate::{MigrateError, Migrations};

use crate::error::{Refusal, StoreError};
use crate::namespace::Namespace;
use crate::spill::Spill;

/// Why an import took nothing. Every message names the input.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// A line is not an entry (its number is in the error).
    #[error("{0}")]
    Line(#[from] JsonLineError),
    /// An entry could not be encoded back (it is over a reader's bounds).
    #[error("{input}: an entry could not be read back ({error}); nothing was imported")]
    Unreadable {
        /// The input's name.
        input: String,
        /// What is wrong.
        error: FormatError,
    },
    /// The entries could not be held (the spill file beside the cache: a full disk).
    #[error("{input}: {error}; nothing was imported")]
    Spill {
        /// The input's name.
        input: String,
        /// What failed.
        error: Box<StoreError>,
    },
    /// Lines of another application.
    #[error(
        "{input}: its lines are entries of application {found:?}, the cache is {app:?}; nothing was imported"
    )]
    Foreign {
        /// The input's name.
        input: String,
        /// The application the lines say.
        found: String,
        /// The cache's.
        app: String,
    },
    /// Lines of a newer schema than the cache's.
    #[error(
        "{input}: its lines are at schema {found}, newer than the cache's {schema}; nothing was imported (migrate the cache first)"
    )]
    Newer {
        /// The input's name.
        input: String,
        /// The schema the lines say.
        found: u32,
        /// The cache's.
        schema: u32,
    },
    /// Older lines the registry could not migrate.
    #[error(
        "{input}: its lines at schema {found} could not be migrated to {schema}: {error}; nothing was imported"
    )]
    Migrate {
        /// The input's name.
        input: String,
        /// The schema the lines say.
        found: u32,
        /// The cache's.
        schema: u32,
        /// Why.
        error: Box<MigrateError>,
    },
    /// An entry's namespace is not a valid name.
    #[error("{input}: {error}; nothing was imported")]
    Namespace {
        /// The input's name.
        input: String,
        /// Why.
        error: Box<StoreError>,
    },
    /// An entry no reader would accept back.
    #[error(
        "{input}: the entry {key} of namespace {namespace:?} could not be read back ({reason}); nothing was imported"
    )]
    Refused {
        /// The input's name.
        input: String,
        /// Its namespace.
        namespace: String,
        /// Its key, as text.
        key: String,
        /// Why.
        reason: Box<Refusal>,
    },
}

/// JSON lines read and grouped by the version each line says; not yet through the gate.
#[derive(Debug)]
pub struct ImportLines {
    input: String,
    groups: BTreeMap<Version, Spill>,
    /// Where spill files go.
    dir: std::path::PathBuf,
}

impl ImportLines {
    /// Reads every line of `reader` (named `input` in messages), a line at a time; entries
    /// past the memory bound spill to a file in the system's temporary folder.
    pub fn read(
        reader: impl BufRead,
        input: &str,
        origin: ImportOrigin,
    ) -> Result<ImportLines, ImportError> {
        Self::read_in(reader, input, origin, &std::env::temp_dir())
    }

    /// [`ImportLines::read`], spilling entries past the memory bound to a file in `dir` (the
    /// folder of the cache they go into).
    pub fn read_in(
        reader: impl BufRead,
        input: &str,
        origin: ImportOrigin,
        dir: &std::path::Path,
    ) -> Result<ImportLines, ImportError> {
        let now = cache_format::now_millis();
        let mut groups: BTreeMap<Version, Spill> = BTreeMap::new();
        let mut failed = None;
        read_lines_each(reader, input, origin, |version, scope, ns, mut entry| {
            if failed.is_some() {
                return;
            }
            // Timestamps from the future are set to the present, as every writer does.
            entry.clamp_future(now);
            let group = match groups.get_mut(version) {
                Some(group) => group,
                None => groups
                    .entry(version.clone())
                    .or_insert_with(|| Spill::new(dir)),
            };
            if let Err(e) = group.merge(scope, ns, entry) {
                failed = Some(e);
            }
        })?;
        if let Some(error) = failed {
            return Err(spilled(input, error));
        }
        Ok(ImportLines {
            input: input.to_owned(),
            groups,
            dir: dir.to_owned(),
        })
    }

    /// Entries another format's importer read (they say no version: they are taken at the
    /// cache's schema), through the same checks as lines.
    pub fn from_entries(input: &str, entries: Spill) -> ImportLines {
        ImportLines {
            input: input.to_owned(),
            groups: BTreeMap::from([(None, entries)]),
            dir: std::env::temp_dir(),
        }
    }

    /// Whether some lines are at an older schema of `app` than `schema` (their import needs
    /// the application's migration steps).
    pub fn has_older(&self, app: &str, schema: u32) -> bool {
        self.groups
            .keys()
            .flatten()
            .any(|(a, s)| a == app && *s < schema)
    }

    /// The entries, through the version gate of `registry` (the cache's application and
    /// current schema), each checked against `limits`: all of them, or an error and none.
    pub fn into_entries(
        self,
        registry: &Migrations,
        limits: &Limits,
    ) -> Result<Spill, ImportError> {
        let input = self.input;
        let unreadable = |error| spilled(&input, error);
        let (app, schema) = (registry.app(), registry.current());
        let mut data: Option<Spill> = None;
        let mut migrated = CacheData::new();
        for (version, group) in self.groups {
            match version {
                Some((found, _)) if found != app => {
                    return Err(ImportError::Foreign {
                        input,
                        found,
                        app: app.to_owned(),
                    });
                }
                Some((_, found)) if found > schema => {
                    return Err(ImportError::Newer {
                        input,
                        found,
                        schema,
                    });
                }
                Some((_, found)) if found < schema => {
                    let group = group.into_data().map_err(unreadable)?;
                    migrated.merge(migrate(registry, found, &group, limits).map_err(|error| {
                        ImportError::Migrate {
                            input: input.clone(),
                            found,
                            schema,
                            error: Box::new(error),
                        }
                    })?);
                }
                _ => {
                    data = Some(match data.take() {
                        None => group,
                        Some(mut data) => {
                            group
                                .try_for_each(|scope, ns, entry| data.merge(scope, ns, entry))
                                .map_err(unreadable)?;
                            data
                        }
                    });
                }
            }
        }
        let mut data = data.unwrap_or_else(|| Spill::new(&self.dir));
        for (scope, ns, entry) in migrated.entries() {
            data.merge(scope, ns, entry.clone()).map_err(unreadable)?;
        }
        check_all(&data, &input, limits)?;
        Ok(data)
    }
}

/// Older lines through the registry's steps, as a file of that schema would go.
fn migrate(
    registry: &Migrations,
    schema: u32,
    group: &CacheData,
    limits: &Limits,
) -> Result<CacheData, MigrateError> {
    let payload = cache_format::encode_payload(group);
    cache_migrate::upgrade(
        registry,
        FormatVersion::CURRENT,
        registry.app(),
        schema,
        &payload,
        limits,
    )
    .map(|up| up.data)
}

/// An error of the spill as an import's: one that does not decode is unreadable; one of the
/// file holding it is said as such.
fn spilled(input: &str, error: StoreError) -> ImportError {
    match error {
        StoreError::Format { source, .. } => ImportError::Unreadable {
            input: input.to_owned(),
            error: source,
        },
        other => ImportError::Spill {
            input: input.to_owned(),
            error: Box::new(other),
        },
    }
}

/// All or nothing: a bad namespace name, or an entry no reader would accept, refuses the whole
/// import (the first in the cache's order is named).
fn check_all(data: &Spill, input: &str, limits: &Limits) -> Result<(), ImportError> {
    let unreadable = |error| spilled(input, error);
    let mut failure = None;
    data.try_for_each(|scope, ns, entry| -> Result<(), StoreError> {
        if failure.is_some() {
            return Ok(());
        }
        if let Err(error) = Namespace::new(ns) {
            failure = Some(ImportError::Namespace {
                input: input.to_owned(),
                error: Box::new(error),
            });
        } else if let Err(reason) = crate::check_entry(scope, ns, &entry, limits) {
            failure = Some(ImportError::Refused {
                input: input.to_owned(),
                namespace: ns.to_owned(),
                key: entry.key().to_string(),
                reason: Box::new(reason),
            });
        }
        Ok(())
    })
    .map_err(unreadable)?;
    failure.map_or(Ok(()), Err)
}
