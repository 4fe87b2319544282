"""Output caching from Python: ``@memoize``, torchcache's job on tunecache's output cache.

The key of a call covers the function's name and ``version``, its ``config``, and every
argument in order: arrays (numpy, torch, anything with the buffer protocol) by dtype, shape and
a hash of all of their bytes; bytes whole; str, int, float, bool and None by value; lists,
tuples and dicts by their items, each tagged with its kind (``encode_arg``). Nothing is
sampled, so two calls share a value only if their inputs are of one kind and equal (or a
128-bit hash collides).

Values: a numpy array is stored as an array (dtype, shape, bytes); anything else (torch
tensors included, bf16 too) is pickled. One call computes a key at a time, across threads and
processes; the others wait and read its value.
"""

from __future__ import annotations

import functools
import logging
import os
import pickle
import sys
from collections.abc import Callable, Mapping
from typing import Any

from . import _tunecache as _ext
from ._cache import _leftovers, emit_warnings

log = logging.getLogger("tunecache")

# numpy dtype names and tunecache's.
_NUMPY_TO_TC = {
    "bool": "bool",
    "uint8": "u8",
    "int8": "i8",
    "uint16": "u16",
    "int16": "i16",
    "uint32": "u32",
    "int32": "i32",
    "uint64": "u64",
    "int64": "i64",
    "float16": "f16",
    "float32": "f32",
    "float64": "f64",
}
_TC_TO_NUMPY = {v: k for k, v in _NUMPY_TO_TC.items()}
_TORCH_TO_TC = {
    "torch.bool": "bool",
    "torch.uint8": "u8",
    "torch.int8": "i8",
    "torch.int16": "i16",
    "torch.int32": "i32",
    "torch.int64": "i64",
    "torch.float16": "f16",
    "torch.bfloat16": "bf16",
    "torch.float32": "f32",
    "torch.float64": "f64",
}
# A pickled value is stored as a u8 array of shape (1, n) starting with this.
_PICKLED = b"TCPICKLE1\n"


def _numpy() -> Any:
    return sys.modules.get("numpy")


def torch_parts(t: Any) -> tuple[str, tuple[int, ...], memoryview]:
    """A torch tensor as ``(dtype, shape, bytes)`` for hashing: detached, on the CPU,
    contiguous; bf16 (which has no buffer protocol, nor a numpy dtype) through its bits."""
    import torch

    name = str(t.dtype)
    dt = _TORCH_TO_TC.get(name)
    if dt is None:
        raise TypeError(f"a torch tensor of dtype {name} cannot be hashed by tunecache")
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    shape = tuple(int(d) for d in t.shape)
    if dt == "bf16" or dt == "f16":
        t = t.view(torch.int16)
    elif dt == "bool":
        t = t.view(torch.uint8)
    data = memoryview(t.numpy().reshape(-1).view("uint8"))
    return dt, shape, data


def _array_parts(a: Any) -> tuple[str, tuple[int, ...], memoryview]:
    np = _numpy()
    name = a.dtype.name
    dt = _NUMPY_TO_TC.get(name)
    if dt is None or not a.dtype.isnative:
        raise TypeError(f"a numpy array of dtype {a.dtype} cannot be hashed by tunecache")
    a = np.ascontiguousarray(a)
    return dt, tuple(int(d) for d in a.shape), memoryview(a.reshape(-1).view(np.uint8))


#: Deepest nesting of lists, tuples and dicts an argument may have.
_MAX_DEPTH = 32


def _container(kind: str, parts: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    """A list, tuple or dict: its kind, then the key of its items' own parts (each item
    tagged as an argument is), so it shares a key with nothing of another kind."""
    return ("kind", kind, ("bytes", _ext.output_key("tunecache.memoize/" + kind, "1", None, parts)))


def _type_name(t: type) -> str:
    return f"{t.__module__}.{t.__qualname__}"


def _numpy_arg(np: Any, value: Any, where: str) -> tuple[Any, ...]:
    """A numpy array or scalar. A plain array is an array; a scalar, a matrix and a masked
    array (its data, its mask and its fill value) are tagged as what they are; any other
    subclass may carry what its bytes do not, so it is refused."""
    if isinstance(value, np.generic):
        return ("kind", "numpy.scalar", ("tensor", *_array_parts(np.asarray(value))))
    if type(value) is np.ndarray:
        return ("tensor", *_array_parts(value))
    if type(value) is np.matrix:
        return ("kind", "numpy.matrix", ("tensor", *_array_parts(np.asarray(value))))
    if type(value) is np.ma.MaskedArray:
        parts = [
            ("tensor", *_array_parts(np.ma.getdata(value))),
            ("tensor", *_array_parts(np.ma.getmaskarray(value))),
            encode_arg(value.fill_value, f"{where}'s fill value"),
        ]
        return _container("numpy.ma.MaskedArray", parts)
    raise TypeError(
        f"{where} is a {_type_name(type(value))}, a numpy array subclass whose bytes may not be "
        "all that sets it apart; pass key= to memoize to say what identifies it"
    )


def _torch_arg(torch: Any, value: Any, where: str) -> tuple[Any, ...]:
    """A torch tensor (or parameter): tagged with its class and device, so it never shares a
    key with a numpy array of the same bytes, or with the same tensor on another device."""
    if type(value) not in (torch.Tensor, torch.nn.Parameter):
        raise TypeError(
            f"{where} is a {_type_name(type(value))}, a torch tensor subclass; pass key= to "
            "memoize to say what identifies it"
        )
    dt, shape, data = torch_parts(value)
    return ("kind", f"{_type_name(type(value))}:{value.device.type}", ("tensor", dt, shape, data))


def encode_arg(value: Any, where: str, depth: int = 0) -> tuple[Any, ...]:
    """One argument in the form the key builder takes: every kind of value has its own tag,
    so two arguments share a key only if they are of one kind and equal."""
    if value is None:
        return ("none",)
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, float):
        return ("float", value)
    if isinstance(value, str):
        return ("str", value)
    if isinstance(value, (bytes, bytearray)):
        return ("bytes", value)
    if isinstance(value, memoryview):
        return ("bytes", value.cast("B") if value.c_contiguous else value.tobytes())
    np = _numpy()
    if np is not None and isinstance(value, (np.ndarray, np.generic)):
        return _numpy_arg(np, value, where)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return _torch_arg(torch, value, where)
    if isinstance(value, (list, tuple, dict)):
        if depth >= _MAX_DEPTH:
            raise TypeError(f"{where} nests deeper than {_MAX_DEPTH} levels; pass key= to memoize")
        kind = type(value).__name__ if type(value) in (list, tuple, dict) else _type_name(type(value))
        if isinstance(value, dict):
            if not all(isinstance(k, str) for k in value):
                raise TypeError(f"{where} is a dict with keys that are not str; pass key= to memoize")
            items = [("named", k, encode_arg(value[k], f"{where}[{k!r}]", depth + 1)) for k in sorted(value)]
            return _container(kind, items)
        return _container(kind, [encode_arg(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)])
    raise TypeError(
        f"{where} is a {type(value).__name__}: memoize hashes arrays, bytes, str, int, float, "
        "bool, None and lists/tuples/dicts of those; pass key= to say what identifies it"
    )


def _to_value(result: Any) -> tuple[str, tuple[int, ...], Any]:
    np = _numpy()
    if np is not None and type(result) is np.ndarray and result.dtype.name in _NUMPY_TO_TC and result.dtype.isnative:
        dt, shape, data = _array_parts(result)
        # A u8 array that could be taken for a pickle is pickled itself.
        if not (dt == "u8" and len(shape) == 2 and shape[0] == 1 and bytes(data[: len(_PICKLED)]) == _PICKLED):
            return dt, shape, data
    blob = _PICKLED + pickle.dumps(_own_bytes(result), protocol=5)
    return "u8", (1, len(blob)), blob


def _own_bytes(result: Any) -> Any:
    """A torch tensor that is a view of a larger storage (a row of a batch's output), as a copy
    of its own elements: pickling a view saves its whole storage."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(result, torch.Tensor):
        own = result.numel() * result.element_size()
        if result.untyped_storage().nbytes() > own:
            return result.clone(memory_format=torch.contiguous_format)
    return result


def _from_value(dtype: str, shape: list[int], data: bytearray) -> Any:
    if dtype == "u8" and len(shape) == 2 and shape[0] == 1 and data[: len(_PICKLED)] == _PICKLED:
        return pickle.loads(memoryview(data)[len(_PICKLED) :])
    np = _numpy()
    if np is None:
        import numpy as np  # an array value was stored: numpy is needed to read it
    # The bytearray is this call's own copy: the array wraps it, writable, without another.
    return np.frombuffer(data, dtype=_TC_TO_NUMPY[dtype]).reshape(shape)


class _Outputs:
    """An output cache opened lazily, once per process (a forked child opens its own)."""

    def __init__(self, dir: str | os.PathLike[str] | None, options: Mapping[str, Any]) -> None:
        self.dir = None if dir is None else os.fspath(dir)
        self.options = dict(options)
        self._pid = -1
        self._cache: Any = None

    def get(self) -> Any:
        """The cache; None if it cannot be opened here (said once per process): the calls
        then compute, uncached."""
        if self._pid != os.getpid():
            if self._cache is not None:
                _leftovers.append(self._cache)
            self._cache = None
            self._pid = os.getpid()
            try:
                self._cache = _ext.OutputCache(self.dir, **self.options)
            except _ext.CacheError as e:
                log.warning("tunecache: memoize computes without a cache in this process: %s", e)
            finally:
                emit_warnings()
        return self._cache


class Memoized:
    """A function whose outputs are cached; see :func:`memoize`."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        dir: str | os.PathLike[str] | None,
        name: str | None,
        version: str,
        config: Mapping[str, Any] | None,
        batch: int | str | None,
        key: Callable[..., Any] | None,
        options: Mapping[str, Any],
    ) -> None:
        self.fn = fn
        self.name = name or f"{fn.__module__}.{fn.__qualname__}"
        self.version = str(version)
        self.config = dict(config) if config is not None else None
        self.batch = batch
        self.key_fn = key
        self.outputs = _Outputs(dir, options)
        self._said: set[str] = set()
        functools.update_wrapper(self, fn)

    def _parts(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        if self.key_fn is not None:
            made = self.key_fn(*args, **kwargs)
            items = made if isinstance(made, tuple) else (made,)
            return [encode_arg(v, f"key item {i}") for i, v in enumerate(items)]
        parts = [encode_arg(a, f"argument {i}") for i, a in enumerate(args)]
        for name in sorted(kwargs):
            parts.append(("named", name, encode_arg(kwargs[name], f"argument {name!r}")))
        return parts

    def key(self, *args: Any, **kwargs: Any) -> bytes:
        """The 16-byte key of a call."""
        return _ext.output_key(self.name, self.version, self.config, self._parts(args, kwargs))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.batch is not None:
            return self._call_batch(args, kwargs)
        key = self.key(*args, **kwargs)
        cache = self.outputs.get()
        if cache is None:
            return self.fn(*args, **kwargs)
        # The function's own exceptions are the caller's; the cache's never are: a value that
        # cannot be stored or read back is computed (or returned) uncached, with a warning.
        ran: list[Any] = []
        inside = [False]

        def compute() -> tuple[str, tuple[int, ...], Any]:
            inside[0] = True
            result = self.fn(*args, **kwargs)
            inside[0] = False
            ran.append(result)
            return _to_value(result)

        try:
            try:
                dtype, shape, data = cache.get_or_compute(key, compute)
            finally:
                emit_warnings()
            return _from_value(dtype, shape, data)
        except Exception as e:
            if inside[0]:
                raise
            self._uncached(e)
            return ran[0] if ran else self.fn(*args, **kwargs)

    def _uncached(self, e: BaseException) -> None:
        """Says (once per function and kind of failure) that a call went uncached."""
        what = type(e).__name__
        if what not in self._said:
            self._said.add(what)
            log.warning("tunecache: %s: a call went uncached (%s: %s)", self.name, what, e)

    def _call_batch(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        np = _numpy()
        if np is None:
            import numpy as np
        spec = self.batch
        assert spec is not None, "batch mode only"
        if isinstance(spec, int):
            batch = args[spec]
            rest_args = list(args[:spec]) + [None] + list(args[spec + 1 :])
            rest_kwargs = dict(kwargs)
        else:
            batch = kwargs[spec]
            rest_args = list(args)
            rest_kwargs = {k: v for k, v in kwargs.items() if k != spec}
            rest_kwargs[spec] = None
        torch: Any = sys.modules.get("torch")
        is_torch = torch is not None and isinstance(batch, torch.Tensor)
        if is_torch:
            batch_part = _torch_arg(torch, batch, "the batch")
        else:
            if isinstance(batch, np.ndarray) and type(batch) is not np.ndarray:
                raise TypeError(
                    f"the batch is a {_type_name(type(batch))}: batch mode takes a plain numpy array or a torch tensor"
                )
            batch = np.asarray(batch)
            batch_part = ("tensor", *_array_parts(batch))
        keys = _ext.output_batch_keys(
            self.name, self.version, self.config, self._parts(tuple(rest_args), rest_kwargs), batch_part
        )
        cache = self.outputs.get()
        found = self._found(cache, keys)
        missing = [i for i, x in enumerate(found) if x is None]
        if missing:
            sub = batch[torch.as_tensor(missing)] if is_torch else batch[np.asarray(missing, dtype=np.int64)]
            call_args = list(args)
            call_kwargs = dict(kwargs)
            if isinstance(spec, int):
                call_args[spec] = sub
            else:
                call_kwargs[spec] = sub
            out = self.fn(*call_args, **call_kwargs)
            if len(out) != len(missing):
                raise ValueError(f"{self.name}: a batch of {len(missing)} items gave {len(out)} outputs")
            for j, i in enumerate(missing):
                found[i] = out[j]
                if cache is not None:
                    self._store(cache, keys[i], out[j])
            emit_warnings()
        if is_torch:
            return torch.stack([x if isinstance(x, torch.Tensor) else torch.as_tensor(x) for x in found])
        return np.stack(found) if found else np.empty((0,))

    def _found(self, cache: Any, keys: list[bytes]) -> list[Any]:
        """The stored value of each key, or None; one the cache cannot give back is None."""
        found: list[Any] = [None] * len(keys)
        if cache is None:
            return found
        for i, k in enumerate(keys):
            try:
                got = cache.get(k)
                if got is not None:
                    found[i] = _from_value(*got)
            except Exception as e:  # noqa: BLE001 - the cache's failure: computed instead
                self._uncached(e)
        return found

    def _store(self, cache: Any, key: bytes, item: Any) -> None:
        """Stores one item's output (its own bytes); a failure leaves it uncached."""
        try:
            dtype, shape, data = _to_value(item)
            cache.put(key, dtype, list(shape), data)
        except Exception as e:  # noqa: BLE001 - the cache's failure: the call goes on
            self._uncached(e)

    def stats(self) -> dict[str, int]:
        """This process's counters: memory_hits, disk_hits, misses, computed, waited, ...
        (all zero while the cache cannot be opened)."""
        cache = self.outputs.get()
        if cache is None:
            return {k: 0 for k in ("memory_hits", "disk_hits", "misses", "computed", "waited", "damaged", "not_stored")}
        return cache.stats()


def memoize(
    fn: Callable[..., Any] | None = None,
    *,
    dir: str | os.PathLike[str] | None = None,
    name: str | None = None,
    version: str = "1",
    config: Mapping[str, Any] | None = None,
    batch: int | str | None = None,
    key: Callable[..., Any] | None = None,
    max_bytes: int = 10 << 30,
    max_entry_bytes: int | None = None,
    memory_bytes: int = 256 << 20,
    codec: str = "raw",
    wait: float = 60.0,
) -> Any:
    """Caches a function's outputs, keyed by all of its inputs.

    ``dir``: where values are kept (default: a session directory removed at exit; give a
    folder to keep them across runs). ``name`` (default: module and qualified name) and
    ``version`` (bump it when the function's results change) identify the function;
    ``config`` adds what the arguments do not carry (a frozen module's hyper-parameters,
    a weights hash). ``batch`` names the argument (index or name) that is a batch of
    independent items: each item is cached on its own and only the missing ones are computed
    (the function must return one output per item, in order). ``key`` replaces the arguments
    by what it returns (a value or a tuple of values) when they are not hashable as they are.
    """
    options = {
        "max_bytes": max_bytes,
        "max_entry_bytes": max_entry_bytes,
        "memory_bytes": memory_bytes,
        "codec": codec,
        "wait": wait,
    }

    def wrap(f: Callable[..., Any]) -> Memoized:
        return Memoized(f, dir=dir, name=name, version=version, config=config, batch=batch, key=key, options=options)

    return wrap(fn) if fn is not None else wrap
