//! Python values to and from canonical tunecache values (FORMAT.md, "Canonical encoding").
//!
//! The conversion, documented for users in `tunecache/__init__.py`:
//!
//! - `bool` is a boolean, never an integer (`True` and `1` give different keys);
//! - `int` (and anything with `__index__`, such as numpy integers) is an integer in the signed
//!   64-bit range; beyond it, `OverflowError`;
//! - `str` is a string;
//! - `tuple` and `list` are both arrays (so a key built with either fingerprints the same);
//! - a `dict` (any mapping) is a map with `str` keys; a `None` value is left out, as an absent
//!   optional field is in Rust;
//! - a numpy dtype, or a torch dtype, is the string of its name (`"float32"`, `"bfloat16"`);
//!   numpy's `bool_` is a boolean;
//! - `float` is refused (`TypeError`): two floats that print the same may differ in their bits,
//!   and a key must hash the same everywhere; so is everything else, naming where it is.

use cache_core::cache_format::{Fields, Value};
use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyMapping, PyString, PyTuple};

/// Levels of lists and maps a key may nest (FORMAT.md, "Bounds": a key field 25).
const MAX_DEPTH: usize = 25;

/// Where a value sits in a key (`key["conv"][1]`), built on the stack as the conversion goes
/// down and rendered only for an error message: a conversion that succeeds formats nothing.
#[derive(Clone, Copy)]
enum Path<'a> {
    Root(&'a str),
    Field(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl std::fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Path::Root(name) => f.write_str(name),
            Path::Field(parent, name) => write!(f, "{parent}[{name:?}]"),
            Path::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

/// Converts a key (a mapping) to its canonical fields.
pub(crate) fn to_fields(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Fields> {
    match to_value(obj, &Path::Root(what), 0)? {
        Value::Map(fields) => Ok(fields),
        _ => Err(PyTypeError::new_err(format!(
            "{what} must be a mapping (a dict of str to values), not {}",
            type_name(obj)
        ))),
    }
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".to_owned(), |n| n.to_string())
}

fn module_of(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .module()
        .map_or_else(|_| String::new(), |m| m.to_string())
}

/// A numpy or torch dtype's name, if `obj` is one.
fn dtype_name(obj: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    let module = module_of(obj);
    let name = type_name(obj);
    if module == "numpy" && (name == "dtype" || name.starts_with("dtype["))
        || module == "numpy.dtypes"
    {
        return Ok(Some(obj.getattr("name")?.extract::<String>()?));
    }
    if module == "torch" && name == "dtype" {
        let text: String = obj.str()?.extract()?;
        return Ok(Some(
            text.strip_prefix("torch.").unwrap_or(&text).to_owned(),
        ));
    }
    Ok(None)
}

fn to_value(obj: &Bound<'_, PyAny>, path: &Path<'_>, depth: usize) -> PyResult<Value> {
    if obj.is_instance_of::<PyBool>() {
        return Ok(Value::Bool(obj.extract::<bool>()?));
    }
    if obj.is_instance_of::<PyInt>() {
        return int_value(obj, path);
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::Str(s.to_str()?.to_owned()));
    }
    if obj.is_instance_of::<PyFloat>() {
        return Err(PyTypeError::new_err(format!(
            "{path} is a float ({}): floats are refused in keys, since equal-looking floats may \
             differ in their bits; use an int (e.g. scaled) or a str",
            obj.repr()
                .map_or_else(|_| "?".to_owned(), |r| r.to_string())
        )));
    }
    let nested = |depth: usize| -> PyResult<usize> {
        if depth >= MAX_DEPTH {
            Err(PyValueError::new_err(format!(
                "{path} nests more than {MAX_DEPTH} levels of lists and maps"
            )))
        } else {
            Ok(depth + 1)
        }
    };
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        let d = nested(depth)?;
        let mut items = Vec::new();
        for (i, item) in obj.try_iter()?.enumerate() {
            let item = item?;
            let at = Path::Index(path, i);
            if item.is_none() {
                return Err(PyTypeError::new_err(format!(
                    "{at} is None: None is allowed only as a map value (where it means absent)"
                )));
            }
            items.push(to_value(&item, &at, d)?);
        }
        return Ok(Value::List(items));
    }
    if let Ok(map) = obj.cast::<PyDict>() {
        let d = nested(depth)?;
        // Straight over the dict (no list of item tuples built first): keys are converted on
        // every lookup, so this is the hot path of `Cache.get`.
        let mut fields = Fields::new();
        for (k, v) in map.iter() {
            field(&mut fields, &k, &v, path, d)?;
        }
        return Ok(Value::Map(fields));
    }
    if let Some(name) = dtype_name(obj)? {
        return Ok(Value::Str(name));
    }
    if module_of(obj) == "numpy" && type_name(obj) == "bool" {
        return Ok(Value::Bool(obj.is_truthy()?));
    }
    if let Ok(map) = obj.cast::<PyMapping>() {
        let d = nested(depth)?;
        return map_value(map.items()?.try_iter()?, path, d);
    }
    if obj.hasattr("__index__")? {
        return int_value(&obj.call_method0("__index__")?, path);
    }
    Err(PyTypeError::new_err(format!(
        "{path} is a {}: a key holds bool, int, str, tuple/list, dict and dtypes only",
        type_name(obj)
    )))
}

fn map_value(
    items: Bound<'_, pyo3::types::PyIterator>,
    path: &Path<'_>,
    depth: usize,
) -> PyResult<Value> {
    let mut fields = Fields::new();
    for pair in items {
        let pair = pair?;
        let (k, v): (Bound<'_, PyAny>, Bound<'_, PyAny>) = pair.extract()?;
        field(&mut fields, &k, &v, path, depth)?;
    }
    Ok(Value::Map(fields))
}

/// Adds one `name: value` pair of a map; a `None` value is left out (an absent field).
fn field(
    fields: &mut Fields,
    k: &Bound<'_, PyAny>,
    v: &Bound<'_, PyAny>,
    path: &Path<'_>,
    depth: usize,
) -> PyResult<()> {
    let Ok(name) = k.cast::<PyString>() else {
        return Err(PyTypeError::new_err(format!(
            "{path} has a {} key ({}): map keys must be str",
            type_name(k),
            k.repr().map_or_else(|_| "?".to_owned(), |r| r.to_string())
        )));
    };
    let name = name.to_str()?;
    if v.is_none() {
        return Ok(());
    }
    let at = Path::Field(path, name);
    fields.insert(name, to_value(v, &at, depth)?);
    Ok(())
}

fn int_value(obj: &Bound<'_, PyAny>, path: &Path<'_>) -> PyResult<Value> {
    obj.extract::<i64>().map(Value::Int).map_err(|_| {
        PyOverflowError::new_err(format!(
            "{path} = {} is outside the signed 64-bit range a key integer has",
            obj.repr()
                .map_or_else(|_| "?".to_owned(), |r| r.to_string())
        ))
    })
}

/// A canonical value as a Python object: lists as lists, maps as dicts.
pub(crate) fn to_py<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    use pyo3::IntoPyObjectExt;
    match value {
        Value::Bool(b) => b.into_bound_py_any(py),
        Value::Int(i) => i.into_bound_py_any(py),
        Value::Str(s) => s.into_bound_py_any(py),
        Value::List(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_py(py, item)?)?;
            }
            Ok(list.into_any())
        }
        Value::Map(fields) => Ok(fields_to_py(py, fields)?.into_any()),
    }
}

/// Fields as a dict.
pub(crate) fn fields_to_py<'py>(py: Python<'py>, fields: &Fields) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (name, value) in fields.iter() {
        dict.set_item(name, to_py(py, value)?)?;
    }
    Ok(dict)
}
