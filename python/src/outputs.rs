//! `tunecache._tunecache.OutputCache`: the output cache (cache-outputs) and its keys.
//!
//! Arrays cross as `(dtype, shape, buffer)`: the Python package turns numpy arrays and torch
//! tensors into a byte view (`memoryview(...).cast("B")`), and arrays back from the bytes.
//! Hashing and file I/O run with the GIL released; the buffers stay exported (so their owner
//! cannot resize them) until the call returns.

use std::sync::Arc;
use std::time::Duration;

use cache_core::cache_format::{Fields, Fingerprint};
use cache_outputs::{Arg, Codec, DType, KeyBuilder, Output, OutputCache, Tensor, TensorRef};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyTuple};

use crate::CacheError;
use crate::keys::to_fields;

/// A byte view of a Python buffer, valid while its `PyBuffer` is alive.
struct View {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the bytes are only read, while the exporting object keeps them alive and fixed in
// size (a buffer export pins numpy arrays and bytearrays); the GIL is not needed to read them.
unsafe impl Send for View {}
unsafe impl Sync for View {}

impl View {
    fn of(buffer: &PyBuffer<u8>) -> PyResult<Self> {
        if !buffer.is_c_contiguous() {
            return Err(PyValueError::new_err(
                "a buffer must be C-contiguous (use numpy.ascontiguousarray)",
            ));
        }
        Ok(View {
            ptr: buffer.buf_ptr() as *const u8,
            len: buffer.len_bytes(),
        })
    }

    fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: see the `Send` impl: the exporter keeps `len` bytes at `ptr` alive and
        // unchanged in size while the `PyBuffer` this view came from is held.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

fn buffer_of(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<PyBuffer<u8>> {
    PyBuffer::<u8>::get(obj).map_err(|e| {
        PyTypeError::new_err(format!(
            "{what}: expected a bytes-like object of unsigned bytes (memoryview(x).cast('B')): {e}"
        ))
    })
}

fn dtype(name: &str) -> PyResult<DType> {
    DType::parse(name).ok_or_else(|| {
        PyValueError::new_err(format!(
            "unknown dtype {name:?} (bool, u8, i8, u16, i16, u32, i32, u64, i64, f16, bf16, f32, f64)"
        ))
    })
}

fn fingerprint_of(key: &[u8]) -> PyResult<Fingerprint> {
    let bytes: [u8; 16] = key
        .try_into()
        .map_err(|_| PyValueError::new_err("an output key is 16 bytes"))?;
    Ok(Fingerprint(bytes))
}

/// One argument, converted while holding the GIL, hashed without it.
enum Part {
    Tensor {
        dtype: DType,
        shape: Vec<u64>,
        view: View,
    },
    Bytes(View),
    Str(String),
    Int(i64),
    UInt(u64),
    Float(f64),
    Bool(bool),
    None,
    /// A value of a named kind (one level: its value is none of `Kind`).
    Kind(String, Box<Part>),
}

impl Part {
    /// The argument, with `slot` holding the value a `Kind` refers to.
    fn arg<'a>(&'a self, slot: &'a mut Option<Arg<'a>>) -> Arg<'a> {
        if let Part::Kind(kind, inner) = self {
            let value: &'a Arg<'a> = slot.insert(inner.plain());
            return Arg::Kind { kind, value };
        }
        self.plain()
    }

    fn plain(&self) -> Arg<'_> {
        match self {
            Part::Tensor { dtype, shape, view } => {
                Arg::Tensor(TensorRef::new(*dtype, shape, view.bytes()))
            }
            Part::Bytes(v) => Arg::Bytes(v.bytes()),
            Part::Str(s) => Arg::Str(s),
            Part::Int(i) => Arg::Int(*i),
            Part::UInt(u) => Arg::UInt(*u),
            Part::Float(f) => Arg::Float(*f),
            Part::Bool(b) => Arg::Bool(*b),
            Part::None => Arg::None,
            // Never nested (see `parse_part`): hashed as its value alone if it were.
            Part::Kind(_, inner) => inner.plain(),
        }
    }
}

/// The arguments of a key, as the Python package encodes them: tuples of a kind and its
/// values: `("tensor", dtype, shape, buffer)`, `("bytes", buffer)`, `("str", s)`,
/// `("int", i)`, `("float", f)`, `("bool", b)`, `("none",)`, `("kind", name, <one of
/// those>)` for a value of a named kind, and `("named", name, <one of those>)` for keyword
/// arguments.
struct Parts {
    parts: Vec<(Option<String>, Part)>,
    // Keeps every buffer exported while the parts are hashed.
    _buffers: Vec<PyBuffer<u8>>,
}

fn parse_part(
    item: &Bound<'_, PyAny>,
    buffers: &mut Vec<PyBuffer<u8>>,
    at: &str,
) -> PyResult<(Option<String>, Part)> {
    let tuple = item
        .cast::<PyTuple>()
        .map_err(|_| PyTypeError::new_err(format!("{at}: expected a (kind, ...) tuple")))?;
    let kind: String = tuple.get_item(0)?.extract()?;
    let field = |i: usize| tuple.get_item(i);
    let part = match kind.as_str() {
        "named" => {
            let name: String = field(1)?.extract()?;
            let (_, inner) = parse_part(&field(2)?, buffers, at)?;
            return Ok((Some(name), inner));
        }
        "tensor" => {
            let dtype = dtype(&field(1)?.extract::<String>()?)?;
            let shape: Vec<u64> = field(2)?.extract()?;
            let buffer = buffer_of(&field(3)?, at)?;
            let view = View::of(&buffer)?;
            buffers.push(buffer);
            let part = Part::Tensor { dtype, shape, view };
            if let Part::Tensor { dtype, shape, view } = &part
                && !TensorRef::new(*dtype, shape, view.bytes()).is_consistent()
            {
                return Err(PyValueError::new_err(format!(
                    "{at}: {} bytes do not make a {} array of shape {shape:?}",
                    view.len,
                    dtype.name()
                )));
            }
            part
        }
        "bytes" => {
            let buffer = buffer_of(&field(1)?, at)?;
            let view = View::of(&buffer)?;
            buffers.push(buffer);
            Part::Bytes(view)
        }
        "str" => Part::Str(field(1)?.extract()?),
        "int" => {
            let v = field(1)?;
            match v.extract::<i64>() {
                Ok(i) => Part::Int(i),
                Err(_) => Part::UInt(v.extract::<u64>().map_err(|_| {
                    PyValueError::new_err(format!("{at}: an integer beyond 64 bits"))
                })?),
            }
        }
        "float" => Part::Float(field(1)?.extract()?),
        "bool" => Part::Bool(field(1)?.extract()?),
        "none" => Part::None,
        "kind" => {
            let name: String = field(1)?.extract()?;
            match parse_part(&field(2)?, buffers, at)? {
                (None, inner) if !matches!(inner, Part::Kind(..)) => {
                    Part::Kind(name, Box::new(inner))
                }
                _ => {
                    return Err(PyValueError::new_err(format!(
                        "{at}: a kind holds a plain value (not named, not another kind)"
                    )));
                }
            }
        }
        other => {
            return Err(PyValueError::new_err(format!(
                "{at}: unknown argument kind {other:?}"
            )));
        }
    };
    Ok((None, part))
}

fn parse_parts(args: &Bound<'_, PyAny>) -> PyResult<Parts> {
    let mut buffers = Vec::new();
    let mut parts = Vec::new();
    for (i, item) in args.try_iter()?.enumerate() {
        parts.push(parse_part(&item?, &mut buffers, &format!("argument {i}"))?);
    }
    Ok(Parts {
        parts,
        _buffers: buffers,
    })
}

fn builder(function: &str, version: &str, config: Option<&Fields>, parts: &Parts) -> KeyBuilder {
    let mut b = KeyBuilder::new(function, version);
    if let Some(c) = config {
        b = b.config(c);
    }
    for (name, part) in &parts.parts {
        let mut slot = None;
        let arg = part.arg(&mut slot);
        b = match name {
            Some(n) => b.named(n, arg),
            None => b.arg(arg),
        };
    }
    b
}

fn config_of(config: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Fields>> {
    match config {
        Some(c) if !c.is_none() => Ok(Some(to_fields(c, "config")?)),
        _ => Ok(None),
    }
}

/// The key of a call (16 bytes): FORMAT.md, "Output keys".
#[pyfunction]
#[pyo3(signature = (function, version, config, args))]
pub(crate) fn output_key<'py>(
    py: Python<'py>,
    function: &str,
    version: &str,
    config: Option<&Bound<'py, PyAny>>,
    args: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let config = config_of(config)?;
    let parts = parse_parts(args)?;
    let key = py.detach(|| builder(function, version, config.as_ref(), &parts).finish());
    Ok(PyBytes::new(py, &key.0))
}

/// The keys of each item of `batch` (a `("tensor", ...)` argument, or a `("kind", name,
/// ("tensor", ...))`, split along its first dimension) after the other arguments: one 16-byte
/// key per item.
#[pyfunction]
#[pyo3(signature = (function, version, config, args, batch))]
pub(crate) fn output_batch_keys<'py>(
    py: Python<'py>,
    function: &str,
    version: &str,
    config: Option<&Bound<'py, PyAny>>,
    args: &Bound<'py, PyAny>,
    batch: &Bound<'py, PyAny>,
) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    let config = config_of(config)?;
    let parts = parse_parts(args)?;
    let mut buffers = Vec::new();
    let (_, batch) = parse_part(batch, &mut buffers, "the batch")?;
    let (kind, tensor) = match &batch {
        Part::Kind(kind, inner) => (Some(kind.as_str()), &**inner),
        plain => (None, plain),
    };
    let Part::Tensor { dtype, shape, view } = tensor else {
        return Err(PyTypeError::new_err("the batch must be an array"));
    };
    let keys = py
        .detach(|| {
            builder(function, version, config.as_ref(), &parts)
                .batch_keys_of(kind, TensorRef::new(*dtype, shape, view.bytes()))
        })
        .ok_or_else(|| PyValueError::new_err("the batch needs at least one dimension"))?;
    drop(buffers);
    Ok(keys.iter().map(|k| PyBytes::new(py, &k.0)).collect())
}

/// A stored value: `(dtype, shape, data)`, the data a `bytearray` (one copy out of the cache,
/// and writable, so numpy can wrap it without another).
type Value<'py> = (&'static str, Vec<u64>, Bound<'py, PyByteArray>);

fn value_to_py<'py>(py: Python<'py>, out: &Output) -> Value<'py> {
    (
        out.dtype().name(),
        out.shape().to_vec(),
        PyByteArray::new(py, out.bytes()),
    )
}

fn tensor_of(dtype_name: &str, shape: Vec<u64>, data: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    let dtype = dtype(dtype_name)?;
    let buffer = buffer_of(data, "the value")?;
    let view = View::of(&buffer)?;
    let bytes = view.bytes().to_vec();
    let len = bytes.len();
    Tensor::new(dtype, shape.clone(), bytes).ok_or_else(|| {
        PyValueError::new_err(format!(
            "{len} bytes do not make a {dtype_name} array of shape {shape:?}"
        ))
    })
}

/// A directory of cached outputs (cache-outputs' `OutputCache`); `tunecache.memoize` uses it.
#[pyclass(frozen, module = "tunecache._tunecache", name = "OutputCache")]
pub(crate) struct PyOutputCache {
    inner: Option<Arc<OutputCache>>,
    pid: u32,
}

impl Drop for PyOutputCache {
    fn drop(&mut self) {
        // A forked child must not remove the parent's session directory.
        if std::process::id() != self.pid
            && let Some(inner) = self.inner.take()
        {
            std::mem::forget(inner);
        }
    }
}

impl PyOutputCache {
    fn cache(&self) -> &OutputCache {
        self.inner.as_deref().expect("set at construction")
    }
}

#[pymethods]
impl PyOutputCache {
    /// Opens (creates) the directory `dir`, or a session directory removed at exit when `dir`
    /// is None. `codec` is `"raw"` or `"zstd"` (level 3).
    #[new]
    #[pyo3(signature = (dir=None, *, max_bytes=10 << 30, max_entry_bytes=None, memory_bytes=256 << 20, codec="raw", wait=60.0))]
    fn new(
        py: Python<'_>,
        dir: Option<std::path::PathBuf>,
        max_bytes: u64,
        max_entry_bytes: Option<u64>,
        memory_bytes: u64,
        codec: &str,
        wait: f64,
    ) -> PyResult<Self> {
        let codec = match codec {
            "raw" => Codec::Raw,
            "zstd" => Codec::Zstd(3),
            other => {
                return Err(PyValueError::new_err(format!(
                    "codec {other:?}: expected \"raw\" or \"zstd\""
                )));
            }
        };
        let wait = Duration::try_from_secs_f64(wait)
            .map_err(|_| PyValueError::new_err("wait must be a finite number of seconds ≥ 0"))?;
        let settings = move |b: cache_outputs::OutputCacheBuilder| {
            let b = b
                .max_bytes(max_bytes)
                .memory_bytes(memory_bytes)
                .codec(codec)
                .wait(wait);
            match max_entry_bytes {
                Some(m) => b.max_entry_bytes(m),
                None => b,
            }
        };
        let opened = py.detach(move || match dir {
            Some(d) => settings(OutputCache::builder(d)).open(),
            None => OutputCache::session(None, settings),
        });
        let cache = opened.map_err(|e| CacheError::new_err(e.to_string()))?;
        Ok(PyOutputCache {
            inner: Some(Arc::new(cache)),
            pid: std::process::id(),
        })
    }

    /// The directory.
    #[getter]
    fn dir(&self) -> std::path::PathBuf {
        self.cache().dir().to_owned()
    }

    /// The value under `key`, as `(dtype, shape, bytes)`, or None.
    fn get<'py>(&self, py: Python<'py>, key: &[u8]) -> PyResult<Option<Value<'py>>> {
        let fp = fingerprint_of(key)?;
        let cache = self.cache();
        let found = py.detach(|| cache.get(&fp));
        Ok(found.map(|out| value_to_py(py, &out)))
    }

    /// Stores a value; False if it was not kept (over a limit, or the directory refused it:
    /// a warning says why).
    fn put(
        &self,
        py: Python<'_>,
        key: &[u8],
        dtype: &str,
        shape: Vec<u64>,
        data: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let fp = fingerprint_of(key)?;
        let tensor = tensor_of(dtype, shape, data)?;
        let cache = self.cache();
        Ok(py.detach(|| cache.put(&fp, tensor).0))
    }

    /// The value under `key`, or `compute()`'s (a `(dtype, shape, buffer)` tuple), stored
    /// before it is returned. One caller computes a key at a time across threads and
    /// processes; the others wait and read what it stored. An exception of `compute`
    /// propagates and nothing is stored.
    fn get_or_compute<'py>(
        &self,
        py: Python<'py>,
        key: &[u8],
        compute: &Bound<'py, PyAny>,
    ) -> PyResult<Value<'py>> {
        let fp = fingerprint_of(key)?;
        let compute = compute.clone().unbind();
        let cache = self.cache();
        let result = py.detach(|| {
            cache.get_or_compute(&fp, || {
                Python::attach(|py| -> PyResult<Tensor> {
                    let made = compute.bind(py).call0()?;
                    let (dtype, shape, data): (String, Vec<u64>, Bound<'_, PyAny>) =
                        made.extract().map_err(|_| {
                            PyTypeError::new_err("compute must return (dtype, shape, buffer)")
                        })?;
                    tensor_of(&dtype, shape, &data)
                })
            })
        });
        let out = result?;
        Ok(value_to_py(py, &out))
    }

    /// Counters and sizes: memory_hits, disk_hits, misses, computed, waited, damaged,
    /// not_stored, bytes, entries.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.cache().stats();
        let d = PyDict::new(py);
        d.set_item("memory_hits", s.memory_hits)?;
        d.set_item("disk_hits", s.disk_hits)?;
        d.set_item("misses", s.misses)?;
        d.set_item("computed", s.computed)?;
        d.set_item("waited", s.waited)?;
        d.set_item("damaged", s.damaged)?;
        d.set_item("not_stored", s.not_stored)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!(
            "<tunecache OutputCache at {}>",
            self.cache().dir().display()
        )
    }
}
