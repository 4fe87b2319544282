//! `Cache.import_from`: another tool's cache files (cache-import) read into entries, with the
//! same all-or-nothing checks as JSON lines; and `record_triton`, the Triton adapter's one
//! result recorded through cache-import's Triton mapping (the only one).

use std::path::Path;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use cache_core::cache_format::{
    CacheData, Entry, Fields, Fingerprint, Key, Limits, Outcome, now_millis,
};
use cache_core::cache_migrate::Migrations;
use cache_import::{Format, ImportOptions, ImportSummary};

use crate::cache::PyCache;
use crate::errors;
use crate::keys::to_fields;

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

/// A 64-bit digest of the entry `get` would return for `key` in `namespace` (its key, time
/// and every candidate's identity, time and outcome), or None: the Triton adapter reuses the
/// file it rendered from an entry while the entry's digest is unchanged, without building the
/// entry in Python on every hit.
#[pyfunction]
pub(crate) fn entry_digest(
    py: Python<'_>,
    cache: &PyCache,
    namespace: &str,
    key: &Bound<'_, PyAny>,
) -> PyResult<Option<u64>> {
    let ns = crate::args::namespace(namespace)?;
    let fp = Fingerprint::of_key(&to_fields(key, "key")?);
    Ok(cache.entry_of(py, ns, &fp)?.map(|entry| digest(&entry)))
}

/// What [`entry_digest`] hashes: everything a rendering of the entry can show (FxHash: a hit
/// pays for it, and it only tells versions of one entry apart).
fn digest(entry: &Entry) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut h = rustc_hash::FxHasher::default();
    entry.key().hash(&mut h);
    entry.recorded_at().hash(&mut h);
    for c in entry.candidates() {
        c.id.hash(&mut h);
        c.measured_at.hash(&mut h);
        c.tuning_ns.hash(&mut h);
        match &c.outcome {
            Outcome::Measured(s) => {
                h.write_u8(0);
                for v in [s.median_ns, s.min_ns, s.spread_ns] {
                    h.write_u64(v.to_bits());
                }
                h.write_u32(s.samples);
            }
            Outcome::Failed(why) => {
                h.write_u8(1);
                why.hash(&mut h);
            }
            Outcome::Chosen(by) => {
                h.write_u8(2);
                by.hash(&mut h);
            }
        }
    }
    h.finish()
}

/// Records what Triton wrote for one autotuned function (`text`, a `<fn>.autotune.json`
/// document; `source` names it in errors) as the entry of `key` in `namespace`, measured
/// here: cache-import's `triton_entry`, checked and merged as a put is. A document that is
/// not Triton's raises `ValueError` naming `source` and the line.
#[pyfunction]
pub(crate) fn record_triton(
    py: Python<'_>,
    cache: &PyCache,
    namespace: &str,
    key: &Bound<'_, PyAny>,
    text: &str,
    source: &str,
) -> PyResult<()> {
    let ns = crate::args::namespace(namespace)?;
    let key = Key::new(to_fields(key, "key")?);
    let entry = cache_import::triton_entry(
        Path::new(source),
        text,
        key,
        cache_core::measured_here(),
        now_millis(),
    )
    .map_err(|e| PyValueError::new_err(e.to_string()))?;
    cache.put_entry(py, ns, entry)
}
