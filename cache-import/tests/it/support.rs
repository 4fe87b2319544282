//! Helpers: importing into a model, and fixture paths.

use std::path::{Path, PathBuf};

use cache_core::cache_format::CacheData;
use cache_import::{Format, ImportOptions, ImportSourceError, ImportSummary, import};

/// Every entry `format` reads from `path`, merged as a cache would.
pub(crate) fn read(
    format: Format,
    path: &Path,
) -> Result<(CacheData, ImportSummary), ImportSourceError> {
    read_with(format, path, &ImportOptions::default())
}

pub(crate) fn read_with(
    format: Format,
    path: &Path,
    options: &ImportOptions,
) -> Result<(CacheData, ImportSummary), ImportSourceError> {
    let mut data = CacheData::new();
    let summary = import(format, path, options, &mut |scope, ns, entry| {
        data.insert(scope, ns, entry);
    })?;
    Ok((data, summary))
}

/// `tests/fixtures/<name>`.
pub(crate) fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}
