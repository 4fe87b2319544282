//! tunableop: not yet read (see IMPORTS.md).

use std::path::Path;

use crate::{ImportOptions, ImportSourceError, ImportSummary};

pub(crate) fn import(
    path: &Path,
    _options: &ImportOptions,
    _sink: &mut dyn FnMut(&cache_core::cache_format::Scope, &str, cache_core::cache_format::Entry),
    _summary: &mut ImportSummary,
) -> Result<usize, ImportSourceError> {
    Err(ImportSourceError::whole(
        path,
        "tunableop is not supported yet",
    ))
}
