//! `Cache.import_from`: another tool's cache files (cache-import) read into entries, with the
//! same all-or-nothing checks as JSON lines.

use std::path::Path;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use cache_core::cache_format::{CacheData, Fields, Limits};
use cache_core::cache_migrate::Migrations;
use cache_import::{Format, ImportOptions, ImportSummary};

use crate::errors;

/// Reads `path` as `format` into checked entries; a damaged source is a `ValueError` naming
/// the file and line.
pub(crate) fn read(
    format: &str,
    path: &Path,
    scope: Fields,
    namespace: Option<String>,
    registry: &Migrations,
) -> PyResult<(CacheData, ImportSummary)> {
    let format = Format::from_name(format).ok_or_else(|| {
        let known: Vec<&str> = Format::ALL.iter().map(|f| f.name()).collect();
        PyValueError::new_err(format!(
            "{format:?} is not a format tunecache imports ({})",
            known.join(", ")
        ))
    })?;
    let options = ImportOptions {
        scope,
        namespace,
        ..ImportOptions::default()
    };
    let (lines, summary) = cache_import::read_entries(format, path, &options)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let built = lines
        .into_entries(registry, &Limits::default())
        .map_err(|e| errors::import(&e))?;
    let data = built.into_data().map_err(|e| errors::store(&e))?;
    Ok((data, summary))
}
