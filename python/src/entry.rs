//! `Entry`, `Candidate` and `Claim` (what a cache returns), and the fingerprint functions.

use std::sync::Arc;

use cache_core::ClaimGuard;
use cache_core::cache_format::{Candidate, Entry, Fields, Fingerprint, Outcome};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::args::params_of;
use crate::keys::{fields_to_py, to_fields};

/// The checksum of a candidate set: an iterable of `(algorithm, params)` pairs.
pub(crate) fn candidate_set(candidates: &Bound<'_, PyAny>) -> PyResult<Fingerprint> {
    let mut ids: Vec<(String, Fields)> = Vec::new();
    for item in candidates.try_iter()? {
        let item = item?;
        let (name, params): (String, Bound<'_, PyAny>) = item
            .extract()
            .map_err(|_| PyTypeError::new_err("candidates must be (algorithm, params) pairs"))?;
        ids.push((name, params_of(Some(&params))?));
    }
    Ok(Fingerprint::of_candidate_set(
        ids.iter().map(|(n, p)| (n.as_str(), p)),
        &Fields::new(),
    ))
}

/// The checksum of a candidate set (`[(algorithm, params), ...]`, any order), as 32 hex
/// digits: what an entry's `candidate_set` is compared with.
#[pyfunction]
pub(crate) fn candidate_set_fingerprint(candidates: &Bound<'_, PyAny>) -> PyResult<String> {
    Ok(candidate_set(candidates)?.to_hex())
}

/// The fingerprint of a key (32 hex digits), as FORMAT.md defines it and the CLI prints it.
#[pyfunction]
pub(crate) fn fingerprint(key: &Bound<'_, PyAny>) -> PyResult<String> {
    Ok(Fingerprint::of_key(&to_fields(key, "key")?).to_hex())
}

/// The canonical encoding of a key (FORMAT.md, "Canonical encoding").
#[pyfunction]
pub(crate) fn canonical_key(key: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    let mut out = Vec::new();
    cache_core::cache_format::encode_fields(&to_fields(key, "key")?, &mut out);
    Ok(out)
}

/// The fingerprint of a scope (32 hex digits).
#[pyfunction]
pub(crate) fn scope_fingerprint(scope: &Bound<'_, PyAny>) -> PyResult<String> {
    Ok(Fingerprint::of_scope(&to_fields(scope, "scope")?).to_hex())
}

/// The ranked candidates recorded for one key.
#[pyclass(frozen, module = "tunecache._tunecache", name = "Entry")]
pub(crate) struct PyEntry {
    pub(crate) entry: Arc<Entry>,
}

#[pymethods]
impl PyEntry {
    /// The key, as a dict.
    #[getter]
    fn key<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        fields_to_py(py, self.entry.key().fields())
    }

    /// The key's fingerprint (32 hex digits).
    #[getter]
    fn fingerprint(&self) -> String {
        self.entry.fingerprint().to_hex()
    }

    /// The best measured candidate, or None if none was measured.
    #[getter]
    fn best(&self) -> Option<PyCandidate> {
        self.entry.best().map(|c| PyCandidate { c: c.clone() })
    }

    /// Every candidate, best first (failed ones last).
    #[getter]
    fn candidates<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(
            py,
            self.entry.candidates().iter().map(|c| PyCandidate {
                c: Candidate::clone(c),
            }),
        )
    }

    /// The checksum of the candidate set of the latest tuning (32 hex digits).
    #[getter]
    fn candidate_set(&self) -> String {
        self.entry.candidate_set().to_hex()
    }

    /// When it was last recorded, in milliseconds since the Unix epoch.
    #[getter]
    fn recorded_at(&self) -> u64 {
        self.entry.recorded_at()
    }

    /// Where it came from: `measured`, `imported` or `remote`.
    #[getter]
    fn origin(&self) -> &'static str {
        self.entry.origin().kind()
    }

    /// The origin's detail (host and pid, file, server).
    #[getter]
    fn origin_detail(&self) -> String {
        self.entry.origin().detail().to_owned()
    }

    fn __repr__(&self) -> String {
        let best = self
            .entry
            .best()
            .map_or_else(|| "none".to_owned(), |c| c.id.label());
        format!(
            "<Entry {} best={best} of {} candidates>",
            self.entry.key(),
            self.entry.candidates().len()
        )
    }
}

/// One candidate's identity and result.
#[pyclass(frozen, module = "tunecache._tunecache", name = "Candidate")]
pub(crate) struct PyCandidate {
    c: Candidate,
}

#[pymethods]
impl PyCandidate {
    /// The algorithm's name.
    #[getter]
    fn algorithm(&self) -> &str {
        &self.c.id.algorithm
    }

    /// Its launch parameters, as a dict.
    #[getter]
    fn params<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        fields_to_py(py, &self.c.id.params)
    }

    /// Median time in seconds, or None if it failed.
    #[getter]
    fn median(&self) -> Option<f64> {
        self.c.stats().map(|s| s.median_ns * 1e-9)
    }

    /// Median time in nanoseconds, or None if it failed.
    #[getter]
    fn median_ns(&self) -> Option<f64> {
        self.c.stats().map(|s| s.median_ns)
    }

    /// Fastest sample in nanoseconds, or None if it failed.
    #[getter]
    fn min_ns(&self) -> Option<f64> {
        self.c.stats().map(|s| s.min_ns)
    }

    /// Spread of the samples in nanoseconds (median absolute deviation), or None.
    #[getter]
    fn spread_ns(&self) -> Option<f64> {
        self.c.stats().map(|s| s.spread_ns)
    }

    /// Timed samples, or None if it failed.
    #[getter]
    fn samples(&self) -> Option<u32> {
        self.c.stats().map(|s| s.samples)
    }

    /// Why it failed, or None if it was measured.
    #[getter]
    fn failed(&self) -> Option<&str> {
        match &self.c.outcome {
            Outcome::Failed(reason) => Some(reason),
            Outcome::Measured(_) | Outcome::Chosen(_) => None,
        }
    }

    /// Who chose it, when another tool chose it without figures (an imported shipped config);
    /// None if it was measured or failed.
    #[getter]
    fn chosen_by(&self) -> Option<&str> {
        match &self.c.outcome {
            Outcome::Chosen(by) => Some(by),
            Outcome::Measured(_) | Outcome::Failed(_) => None,
        }
    }

    /// When it was measured, in milliseconds since the Unix epoch.
    #[getter]
    fn measured_at(&self) -> u64 {
        self.c.measured_at
    }

    /// How it was measured (a dict: timer, samples, ...), or None if unknown.
    #[getter]
    fn policy<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.c
            .policy
            .as_ref()
            .map(|p| fields_to_py(py, p))
            .transpose()
    }

    /// What measuring it cost, in nanoseconds, if recorded.
    #[getter]
    fn tuning_ns(&self) -> Option<u64> {
        self.c.tuning_ns
    }

    fn __repr__(&self) -> String {
        match self.c.stats() {
            Some(s) => format!(
                "<Candidate {} median {:.1} ns of {} samples>",
                self.c.id.label(),
                s.median_ns,
                s.samples
            ),
            None => match &self.c.outcome {
                Outcome::Chosen(by) => format!("<Candidate {} chosen by {by}>", self.c.id.label()),
                _ => format!("<Candidate {} failed>", self.c.id.label()),
            },
        }
    }
}

/// A claim on one key (see `Cache.claim`); a context manager.
#[pyclass(frozen, module = "tunecache._tunecache", name = "Claim")]
pub(crate) struct PyClaim {
    pub(crate) guard: std::sync::Mutex<Option<ClaimGuard>>,
    pub(crate) state: &'static str,
    pub(crate) shared: bool,
}

#[pymethods]
impl PyClaim {
    /// `"held"` or `"busy"`.
    #[getter]
    fn state(&self) -> &'static str {
        self.state
    }

    /// Whether a held claim holds across the processes sharing the file (`False`: only
    /// among this process's threads, for a cache with no file to share claims through).
    #[getter]
    fn shared(&self) -> bool {
        self.shared
    }

    /// Lets other processes have the key.
    fn release(&self) {
        let taken = self.guard.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(taken);
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        _ty: &Bound<'_, PyAny>,
        _value: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> bool {
        self.release();
        false
    }
}

/// A key's fleet claim (`Cache.fleet_claim`): `"lead"` (this process measures it for every
/// process sharing the server; `finish` publishes, then lets the others go on), `"published"`
/// (another process published it while this one waited: it is in the cache now) or `"alone"`
/// (no coordination: measure it here; `detail` says why).
#[pyclass(frozen, module = "tunecache._tunecache", name = "FleetClaim")]
pub(crate) struct PyFleetClaim {
    pub(crate) lease: std::sync::Mutex<Option<cache_remote::LeaseGuard>>,
    pub(crate) state: &'static str,
    pub(crate) detail: String,
}

impl PyFleetClaim {
    pub(crate) fn new(claim: cache_remote::FleetClaim) -> Self {
        let (state, detail, lease) = match claim {
            cache_remote::FleetClaim::Lead(lease) => ("lead", String::new(), Some(lease)),
            cache_remote::FleetClaim::Published { by } => ("published", by, None),
            cache_remote::FleetClaim::Alone(why) => ("alone", why.to_string(), None),
        };
        PyFleetClaim {
            lease: std::sync::Mutex::new(lease),
            state,
            detail,
        }
    }

    /// No coordination, for `why`.
    pub(crate) fn alone(why: &str) -> Self {
        PyFleetClaim {
            lease: std::sync::Mutex::new(None),
            state: "alone",
            detail: why.to_owned(),
        }
    }

    fn take(&self) -> Option<cache_remote::LeaseGuard> {
        self.lease.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

#[pymethods]
impl PyFleetClaim {
    /// `"lead"`, `"published"` or `"alone"`.
    #[getter]
    fn state(&self) -> &'static str {
        self.state
    }

    /// Who published the key (`"published"`), or why there is no coordination (`"alone"`).
    #[getter]
    fn detail(&self) -> &str {
        &self.detail
    }

    /// Publishes what the cache recorded (waiting at most `timeout` seconds), then lets the
    /// key go. Raises `CacheError` if it was not published (the lease is let go anyway).
    /// Nothing to do unless `state` is `"lead"`.
    #[pyo3(signature = (timeout=2.0))]
    fn finish(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let timeout = std::time::Duration::try_from_secs_f64(timeout)
            .map_err(|_| pyo3::exceptions::PyValueError::new_err("timeout must be ≥ 0"))?;
        match self.take() {
            Some(lease) => py
                .detach(move || lease.finish(timeout))
                .map_err(|e| crate::CacheError::new_err(e.to_string())),
            None => Ok(()),
        }
    }

    /// Lets the key go without publishing.
    fn release(&self, py: Python<'_>) {
        let taken = self.take();
        py.detach(move || drop(taken));
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _ty: &Bound<'_, PyAny>,
        _value: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> bool {
        self.release(py);
        false
    }
}
