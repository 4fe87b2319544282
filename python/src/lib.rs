//! The Python extension module `tunecache._tunecache`: the Rust core for the `tunecache`
//! Python package (`python/tunecache`), which wraps it in the API users see. Built by maturin
//! as one abi3 wheel for CPython ≥ 3.11; tested from Python (`python/tests`).
//!
//! What is here: the cache (`Cache`, `Entry`, `Candidate`, `Claim`), the key conversion and
//! fingerprints, the output cache and its keys, and the queue that carries the core's warnings
//! to Python's `logging`. The GIL is released around file, lock, network, migration and
//! hashing work, not around in-memory hits.
#![deny(missing_docs)]

mod args;
mod cache;
mod entry;
mod errors;
mod health;
mod imports;
mod keys;
mod log;
mod outputs;
#[cfg(unix)]
mod sigterm;
#[cfg(not(unix))]
mod sigterm {
    //! No SIGTERM on this platform: nothing to arm.
    use pyo3::prelude::*;

    pub(crate) fn register(_: &std::sync::Arc<cache_core::Cache>) {}

    /// Arms nothing: there is no SIGTERM here.
    #[pyfunction]
    pub(crate) fn arm_sigterm_flush(_timeout: f64) -> bool {
        false
    }
}

use pyo3::prelude::*;

pyo3::create_exception!(
    _tunecache,
    CacheError,
    pyo3::exceptions::PyOSError,
    "A cache operation that could not be done (a closed cache, a save that did not finish)."
);

/// The warnings the core reported since the last call, as `(level, message)` pairs, oldest
/// first.
#[pyfunction]
fn drain_warnings() -> Vec<(&'static str, String)> {
    log::drain()
}

#[pymodule]
fn _tunecache(m: &Bound<'_, PyModule>) -> PyResult<()> {
    log::install();
    m.add("CacheError", m.py().get_type::<CacheError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<cache::PyCache>()?;
    m.add_class::<entry::PyEntry>()?;
    m.add_class::<entry::PyCandidate>()?;
    m.add_class::<entry::PyClaim>()?;
    m.add_class::<entry::PyFleetClaim>()?;
    m.add_class::<outputs::PyOutputCache>()?;
    m.add_function(wrap_pyfunction!(entry::fingerprint, m)?)?;
    m.add_function(wrap_pyfunction!(entry::canonical_key, m)?)?;
    m.add_function(wrap_pyfunction!(entry::scope_fingerprint, m)?)?;
    m.add_function(wrap_pyfunction!(entry::candidate_set_fingerprint, m)?)?;
    m.add_function(wrap_pyfunction!(outputs::output_key, m)?)?;
    m.add_function(wrap_pyfunction!(outputs::output_batch_keys, m)?)?;
    m.add_function(wrap_pyfunction!(drain_warnings, m)?)?;
    m.add_function(wrap_pyfunction!(sigterm::arm_sigterm_flush, m)?)?;
    m.add_function(wrap_pyfunction!(imports::record_triton, m)?)?;
    m.add_function(wrap_pyfunction!(imports::entry_digest, m)?)?;
    Ok(())
}
