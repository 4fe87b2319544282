//! `tunecache._tunecache.Cache`, its entries and candidates, and per-key claims.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwapOption;
use cache_core::cache_format::{CacheData, Entry, Fields, Fingerprint, Key, Scope, now_millis};
use cache_core::cache_migrate::Migrations;
use cache_core::{Cache, Claim, MemoryLookup, Mode, Namespace, Store};
use cache_remote::{RemoteBuilder as _, RemoteCache as _};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::args::{namespace, new_candidate, secs};
use crate::entry::{PyClaim, PyEntry, PyFleetClaim, candidate_set};
use crate::keys::{fields_to_py, to_fields};
use crate::{CacheError, errors};

/// A persistent autotune cache (the Rust `cache_core::Cache`). The Python class
/// `tunecache.Cache` wraps it; see its documentation.
#[pyclass(frozen, module = "tunecache._tunecache", name = "Cache")]
pub(crate) struct PyCache {
    cache: ArcSwapOption<Cache>,
    /// Bumped by every change this process makes (put, refresh, close), so Python can keep a
    /// memo of hits and know when to drop it.
    generation: AtomicU64,
    /// The process that opened it. A forked child must never drop it: its saver thread
    /// exists only in the parent.
    pid: u32,
    app: String,
    schema: u32,
}

impl Drop for PyCache {
    fn drop(&mut self) {
        if std::process::id() != self.pid
            && let Some(cache) = self.cache.swap(None)
        {
            std::mem::forget(cache);
        }
    }
}

impl PyCache {
    fn get_cache(&self) -> PyResult<Arc<Cache>> {
        self.cache
            .load_full()
            .ok_or_else(|| CacheError::new_err("the cache is closed"))
    }

    /// Checks and merges a whole entry (as `put` does a candidate's), outside the GIL.
    pub(crate) fn put_entry(&self, py: Python<'_>, ns: Namespace, entry: Entry) -> PyResult<()> {
        let cache = self.get_cache()?;
        py.detach(|| cache.try_put(ns, entry))
            .map_err(|e| errors::store(&e))?;
        self.generation.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The entry of `fp` in `ns`, as `get` finds it.
    pub(crate) fn entry_of(
        &self,
        py: Python<'_>,
        ns: Namespace,
        fp: &Fingerprint,
    ) -> PyResult<Option<Arc<Entry>>> {
        let cache = self.get_cache()?;
        Ok(lookup(py, &cache, ns, fp))
    }
}

#[pymethods]
impl PyCache {
    /// Opens the cache; never fails for its location (an unusable one degrades to memory,
    /// with a warning). `migrations` is a migration file's JSON text (`app`, `current`,
    /// `steps`), `remote` a shared tier's address (else `TUNECACHE_REMOTE` is read).
    #[new]
    #[pyo3(signature = (app, schema, *, migrations=None, scope=None, path=None, read_only=false, remote=None, save_delay=None, lock_timeout=None, trust=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        app: &str,
        schema: u32,
        migrations: Option<&str>,
        scope: Option<&Bound<'_, PyAny>>,
        path: Option<std::path::PathBuf>,
        read_only: bool,
        remote: Option<&str>,
        save_delay: Option<f64>,
        lock_timeout: Option<f64>,
        trust: Option<std::path::PathBuf>,
    ) -> PyResult<Self> {
        if app.is_empty() {
            return Err(PyValueError::new_err("app must not be empty"));
        }
        let registry = match migrations {
            None => Migrations::new(app, schema),
            Some(text) => {
                let registry = Migrations::from_json(text)
                    .map_err(|e| PyValueError::new_err(format!("migrations: {e}")))?;
                if registry.app() != app || registry.current() != schema {
                    return Err(PyValueError::new_err(format!(
                        "migrations are for {} schema {}, the cache for {app} schema {schema}",
                        registry.app(),
                        registry.current()
                    )));
                }
                registry
            }
        };
        let scope = match scope {
            Some(s) if !s.is_none() => Scope::new(to_fields(s, "scope")?),
            _ => Scope::new(Fields::new()),
        };
        let mut builder = Cache::builder(registry).scope(scope).read_only(read_only);
        if let Some(path) = path {
            builder = builder.file(path);
        }
        if let Some(d) = save_delay {
            builder = builder.save_delay(secs(d, "save_delay")?);
        }
        if let Some(t) = lock_timeout {
            builder = builder.lock_timeout(secs(t, "lock_timeout")?);
        }
        let builder = builder.remote_or_warn_trusting(remote, trust.as_deref());
        let cache = Arc::new(py.detach(move || builder.open()));
        crate::sigterm::register(&cache);
        Ok(PyCache {
            cache: ArcSwapOption::from(Some(cache)),
            generation: AtomicU64::new(0),
            pid: std::process::id(),
            app: app.to_owned(),
            schema,
        })
    }

    /// The application name.
    #[getter]
    fn app(&self) -> &str {
        &self.app
    }

    /// The current schema version.
    #[getter]
    fn schema(&self) -> u32 {
        self.schema
    }

    /// The file, or None for a memory-only cache.
    #[getter]
    fn path(&self) -> PyResult<Option<std::path::PathBuf>> {
        Ok(self.get_cache()?.path().map(|p| p.to_owned()))
    }

    /// The scope, as a dict.
    #[getter]
    fn scope<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        fields_to_py(py, self.get_cache()?.scope().fields())
    }

    /// Changes made through this object so far (a memo keyed on it stays valid while it
    /// does not move).
    #[getter]
    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.cache.load().is_none()
    }

    /// The entry for `key` in `namespace`, or None. A hit in memory keeps the GIL; a lookup
    /// that may read (an entry still in the file, the shared tier on a miss) releases it.
    fn get(
        &self,
        py: Python<'_>,
        namespace: &str,
        key: &Bound<'_, PyAny>,
    ) -> PyResult<Option<PyEntry>> {
        let fields = to_fields(key, "key")?;
        let ns = self::namespace(namespace)?;
        let fp = Fingerprint::of_key(&fields);
        let cache = self.get_cache()?;
        Ok(lookup(py, &cache, ns, &fp).map(|entry| PyEntry { entry }))
    }

    /// Records one candidate's measurement (or failure) for `key`, merged with what the entry
    /// holds; returns the entry after the merge.
    /// `policy` (a dict) says how it was measured (FORMAT.md, "Measurement policy").
    #[pyo3(signature = (namespace, key, algorithm, params=None, *, median_ns=None, min_ns=None, spread_ns=0.0, samples=1, failed=None, tuning_ns=None, candidates=None, policy=None))]
    #[allow(clippy::too_many_arguments)]
    fn put(
        &self,
        py: Python<'_>,
        namespace: &str,
        key: &Bound<'_, PyAny>,
        algorithm: &str,
        params: Option<&Bound<'_, PyAny>>,
        median_ns: Option<f64>,
        min_ns: Option<f64>,
        spread_ns: f64,
        samples: u32,
        failed: Option<String>,
        tuning_ns: Option<u64>,
        candidates: Option<&Bound<'_, PyAny>>,
        policy: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyEntry> {
        let fields = to_fields(key, "key")?;
        let ns = self::namespace(namespace)?;
        let candidate = new_candidate(
            algorithm, params, median_ns, min_ns, spread_ns, samples, failed, tuning_ns, policy,
        )?;
        let key = Key::new(fields);
        let fp = key.fingerprint();
        let cache = self.get_cache()?;
        let set = match candidates {
            Some(c) if !c.is_none() => candidate_set(c)?,
            _ => lookup(py, &cache, ns, &fp).map_or_else(
                || {
                    Fingerprint::of_candidate_set(
                        [(candidate.id.algorithm.as_str(), &candidate.id.params)],
                        &Fields::new(),
                    )
                },
                |e| e.candidate_set(),
            ),
        };
        let entry = Entry::new(
            key,
            set,
            cache_core::measured_here(),
            now_millis(),
            [candidate],
        );
        py.detach(|| cache.try_put(ns, entry))
            .map_err(|e| errors::store(&e))?;
        self.generation.fetch_add(1, Ordering::Relaxed);
        let entry = lookup(py, &cache, ns, &fp)
            .ok_or_else(|| CacheError::new_err("the entry just recorded is not in memory"))?;
        Ok(PyEntry { entry })
    }

    /// What `put` with these arguments would refuse, without recording anything: a bad
    /// namespace, key or params, or an entry no reader would accept (`RefusedEntryError`,
    /// `ValueError`, as `put` raises them). For all-or-nothing imports that check every item
    /// before recording the first.
    #[pyo3(signature = (namespace, key, algorithm, params=None, *, median_ns=None, min_ns=None, spread_ns=0.0, samples=1, failed=None))]
    #[allow(clippy::too_many_arguments)]
    fn check_put(
        &self,
        namespace: &str,
        key: &Bound<'_, PyAny>,
        algorithm: &str,
        params: Option<&Bound<'_, PyAny>>,
        median_ns: Option<f64>,
        min_ns: Option<f64>,
        spread_ns: f64,
        samples: u32,
        failed: Option<String>,
    ) -> PyResult<()> {
        let fields = to_fields(key, "key")?;
        let ns = self::namespace(namespace)?;
        let candidate = new_candidate(
            algorithm, params, median_ns, min_ns, spread_ns, samples, failed, None, None,
        )?;
        let entry = Entry::new(
            Key::new(fields),
            Fingerprint::default(),
            cache_core::measured_here(),
            now_millis(),
            [candidate],
        );
        let cache = self.get_cache()?;
        let limits = cache_core::cache_format::Limits::default();
        cache_core::check_entry(cache.scope(), ns.name(), &entry, &limits).map_err(|reason| {
            errors::store(&cache_core::StoreError::Refused {
                namespace: namespace.to_owned(),
                reason,
            })
        })
    }

    /// Every entry of this cache's scope, optionally of one namespace only.
    #[pyo3(signature = (namespace=None))]
    fn entries(&self, py: Python<'_>, namespace: Option<&str>) -> PyResult<Vec<(String, PyEntry)>> {
        let cache = self.get_cache()?;
        // Entries still kept in the file are read: without the GIL.
        let all = py.detach(|| cache.entries());
        let mut out: Vec<(String, PyEntry)> = all
            .into_iter()
            .filter(|(ns, _)| namespace.is_none_or(|n| ns.name() == n))
            .map(|(ns, entry)| (ns.name().to_owned(), PyEntry { entry }))
            .collect();
        out.sort_by(|a, b| {
            (a.0.as_str(), a.1.entry.fingerprint()).cmp(&(b.0.as_str(), b.1.entry.fingerprint()))
        });
        Ok(out)
    }

    /// Merges JSON lines (the CLI's `export` format) into the cache, all or nothing; returns
    /// how many entries were imported. The same policy as `tunecache import`: lines of this
    /// cache's application and schema (or saying none) as they are, older ones migrated
    /// through the cache's migrations, another application's or a newer schema's refused
    /// (`ForeignFileError`), a bad line a `ValueError`, an entry no reader would accept a
    /// `RefusedEntryError`. `keep_origin` keeps each line's origin; otherwise entries are
    /// marked imported from `source`, as `tunecache import` does.
    #[pyo3(signature = (text, source="<python>", keep_origin=false))]
    fn import_lines(
        &self,
        py: Python<'_>,
        text: &str,
        source: &str,
        keep_origin: bool,
    ) -> PyResult<usize> {
        use cache_core::cache_format::json::ImportOrigin;
        let policy = if keep_origin {
            ImportOrigin::Keep
        } else {
            ImportOrigin::MarkImported
        };
        let cache = self.get_cache()?;
        let data = py
            .detach(|| -> Result<CacheData, cache_core::ImportError> {
                let lines = cache_core::ImportLines::read(text.as_bytes(), source, policy)?;
                let built = lines.into_entries(
                    cache.registry(),
                    &cache_core::cache_format::Limits::default(),
                )?;
                built
                    .into_data()
                    .map_err(|error| cache_core::ImportError::Spill {
                        input: source.to_owned(),
                        error: Box::new(error),
                    })
            })
            .map_err(|e| errors::import(&e))?;
        let imported = py.detach(|| cache.import(data));
        self.generation.fetch_add(1, Ordering::Relaxed);
        // The lines were checked whole above: a refusal here would be a bug, said loudly.
        if let Some(e) = imported.refused.first() {
            return Err(errors::store(e));
        }
        Ok(imported.taken)
    }

    /// Merges another tool's cache files (`format`: vllm, sglang, triton, tunableop,
    /// kernel-tuner, xla; IMPORTS.md), all or nothing; `scope` adds fields where the source
    /// says none. Returns `{"imported", "files", "notes"}`.
    #[pyo3(signature = (format, path, scope=None, namespace=None))]
    fn import_from<'py>(
        &self,
        py: Python<'py>,
        format: &str,
        path: std::path::PathBuf,
        scope: Option<&Bound<'_, PyAny>>,
        namespace: Option<String>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let scope = match scope {
            Some(s) if !s.is_none() => to_fields(s, "scope")?,
            _ => Fields::new(),
        };
        let cache = self.get_cache()?;
        let (data, summary) =
            py.detach(|| crate::imports::read(format, &path, scope, namespace, cache.registry()))?;
        let imported = py.detach(|| cache.import(data));
        self.generation.fetch_add(1, Ordering::Relaxed);
        if let Some(e) = imported.refused.first() {
            return Err(errors::store(e));
        }
        let out = PyDict::new(py);
        out.set_item("imported", imported.taken)?;
        out.set_item("files", summary.files)?;
        out.set_item("notes", summary.notes)?;
        Ok(out)
    }

    /// The entries of this cache's scope as JSON lines (the CLI's `export` format, each line
    /// naming the application and schema).
    fn export_lines(&self, py: Python<'_>) -> PyResult<String> {
        let cache = self.get_cache()?;
        let (app, schema) = (self.app.clone(), self.schema);
        Ok(py.detach(|| {
            let mut data = CacheData::new();
            let scope = cache.scope().clone();
            for (ns, entry) in cache.entries() {
                data.insert(&scope, ns.name(), (*entry).clone());
            }
            cache_core::cache_format::json::to_lines_versioned(&data, &app, schema)
        }))
    }

    fn __len__(&self) -> PyResult<usize> {
        Ok(self.get_cache()?.len())
    }

    /// Takes the claim of `key`: while held, other processes sharing the file (or, with no
    /// file to share, other threads of this process) that ask for it wait (at most `wait`
    /// seconds). Returns a `Claim` whose `state` is `"held"` (`shared` says whether across
    /// processes) or `"busy"` (another holder kept it longer than `wait`).
    fn claim(
        &self,
        py: Python<'_>,
        namespace: &str,
        key: &Bound<'_, PyAny>,
        wait: f64,
    ) -> PyResult<PyClaim> {
        let fp = Fingerprint::of_key(&to_fields(key, "key")?);
        let ns = self::namespace(namespace)?;
        let wait = secs(wait, "wait")?;
        let cache = self.get_cache()?;
        let claim = py.detach(|| cache.claim(ns, &fp, wait));
        Ok(match claim {
            Claim::Held(guard) => PyClaim {
                shared: guard.is_shared(),
                guard: std::sync::Mutex::new(Some(guard)),
                state: "held",
            },
            Claim::Busy => PyClaim {
                shared: false,
                guard: std::sync::Mutex::new(None),
                state: "busy",
            },
        })
    }

    /// Before measuring `key` (missing here and on the shared tier): takes its fleet lease, or
    /// waits at most `wait` seconds for the process that holds it to publish it (see
    /// `FleetClaim`). Without a shared tier, `"alone"` at once.
    fn fleet_claim(
        &self,
        py: Python<'_>,
        namespace: &str,
        key: &Bound<'_, PyAny>,
        wait: f64,
    ) -> PyResult<PyFleetClaim> {
        let fp = Fingerprint::of_key(&to_fields(key, "key")?);
        let ns = self::namespace(namespace)?;
        let wait = secs(wait, "wait")?;
        let cache = self.get_cache()?;
        let claim = match cache.remote() {
            Some(remote) => py.detach(|| remote.claim(ns, &fp, wait)),
            None => return Ok(PyFleetClaim::alone("no shared tier")),
        };
        self.generation.fetch_add(1, Ordering::Relaxed);
        Ok(PyFleetClaim::new(claim))
    }

    /// The fleet's entries for `keys` of `namespace` (this cache's own published first, then
    /// read from the shared tier in one round trip, whatever this cache holds), one per key
    /// (`None` where the fleet lacks it); `None` when there is no shared tier or it could not
    /// be read within its budget.
    #[pyo3(signature = (namespace, keys, timeout=10.0))]
    fn fleet_view(
        &self,
        py: Python<'_>,
        namespace: &str,
        keys: Vec<Bound<'_, PyAny>>,
        timeout: f64,
    ) -> PyResult<Option<Vec<Option<PyEntry>>>> {
        let fps = keys
            .iter()
            .map(|k| Ok(Fingerprint::of_key(&to_fields(k, "key")?)))
            .collect::<PyResult<Vec<_>>>()?;
        let ns = self::namespace(namespace)?;
        let timeout = secs(timeout, "timeout")?;
        let cache = self.get_cache()?;
        let Some(remote) = cache.remote() else {
            return Ok(None);
        };
        let view = py.detach(|| remote.view(ns, &fps, timeout));
        self.generation.fetch_add(1, Ordering::Relaxed);
        Ok(match view {
            Ok(view) => Some(
                view.into_iter()
                    .map(|e| e.map(|entry| PyEntry { entry }))
                    .collect(),
            ),
            Err(why) => {
                tracing::debug!("tunecache: no fleet view: {why}");
                None
            }
        })
    }

    /// Reads what other processes saved since the last read.
    fn refresh(&self, py: Python<'_>) -> PyResult<()> {
        let cache = self.get_cache()?;
        py.detach(|| cache.refresh())
            .map_err(|e| errors::store(&e))?;
        self.generation.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Sends what this process recorded to the shared tier, waiting at most `timeout`
    /// seconds; raises `CacheError` if the server did not get it (results stay queued).
    /// Without a shared tier, returns at once.
    #[pyo3(signature = (timeout=2.0))]
    fn publish(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let cache = self.get_cache()?;
        let timeout = secs(timeout, "timeout")?;
        py.detach(|| cache.publish_within(timeout))
            .map_err(|e| errors::remote(&e))
    }

    /// Makes every recorded result durable, waiting at most `timeout` seconds (default: the
    /// cache's flush timeout). Raises `CacheError` if they are not. With `budget` (a process
    /// about to end), past `timeout` it goes on waiting while other processes' saves ahead of
    /// it are landing, up to `budget` seconds in all.
    #[pyo3(signature = (timeout=None, budget=None))]
    fn flush(&self, py: Python<'_>, timeout: Option<f64>, budget: Option<f64>) -> PyResult<()> {
        let cache = self.get_cache()?;
        let timeout = timeout.map(|t| secs(t, "timeout")).transpose()?;
        let budget = budget.map(|t| secs(t, "budget")).transpose()?;
        py.detach(|| match (timeout, budget) {
            (t, Some(b)) => cache.flush_before_exit(t.unwrap_or(b), b),
            (Some(t), None) => cache.flush_within(t),
            (None, None) => cache.flush(),
        })
        .map_err(|e| errors::store(&e))
    }

    /// Saves what is pending and stops the saver; later calls raise `CacheError`. Closing
    /// twice is harmless.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let Some(cache) = self.cache.swap(None) else {
            return Ok(());
        };
        self.generation.fetch_add(1, Ordering::Relaxed);
        if cache.health().mode != Mode::Persistent {
            // Nothing to save: it never wrote a file (it said why when it opened).
            py.detach(move || drop(cache));
            return Ok(());
        }
        py.detach(|| match Arc::try_unwrap(cache) {
            Ok(cache) => cache.close(),
            // Another thread is inside a call with it: save now; the last user drops it.
            Err(shared) => shared.flush(),
        })
        .map_err(|e| errors::store(&e))
    }

    /// Holds the saver between saves (so no file lock is held) until `resume_saves`: taken
    /// around `fork`, so a child never inherits the parent's lock. Waits for a save in
    /// progress.
    fn pause_saves(&self, py: Python<'_>) {
        if let Some(cache) = self.cache.load_full() {
            py.detach(|| cache.pause_saves());
        }
    }

    /// Ends `pause_saves`.
    fn resume_saves(&self) {
        if let Some(cache) = self.cache.load_full() {
            cache.resume_saves();
        }
    }

    /// The cache's state as plain data: mode, path, why it is not persistent, the last failed
    /// save, files moved aside, pending results, the migration, each tier's counters and the
    /// shared tier's.
    fn health<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        crate::health::health(py, &*self.get_cache()?)
    }

    /// The mode alone (`persistent`, `read-only`, `memory`): what the exit flushes ask, with
    /// nothing made or imported on the way (a signal handler may run it).
    fn mode(&self) -> PyResult<&'static str> {
        Ok(crate::health::mode_name(self.get_cache()?.health().mode))
    }

    fn __repr__(&self) -> String {
        match self.cache.load_full() {
            Some(c) => format!(
                "<tunecache Cache {} schema {} at {}, {} entries>",
                self.app,
                self.schema,
                c.path()
                    .map_or_else(|| "memory".to_owned(), |p| p.display().to_string()),
                c.len()
            ),
            None => format!("<tunecache Cache {} (closed)>", self.app),
        }
    }
}

/// The entry for `fp` in `ns`: a hit in memory with the GIL held, anything that may read
/// (an entry still kept in the file, a tier with a time budget) with it released, so other
/// Python threads run meanwhile.
fn lookup(py: Python<'_>, cache: &Cache, ns: Namespace, fp: &Fingerprint) -> Option<Arc<Entry>> {
    match cache.get_in_memory(ns, fp) {
        MemoryLookup::Hit(entry) => Some(entry),
        MemoryLookup::Miss => None,
        MemoryLookup::NeedsIo => py.detach(|| cache.get(ns, fp)),
    }
}
