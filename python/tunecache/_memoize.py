"""Output caching from Python: ``@memoize``, torchcache's job on tunecache's output cache.

The key of a call covers the function's name and ``version``, its ``config``, and every
argument in order: arrays (numpy, torch, anything with the buffer protocol) by dtype, shape and
a hash of all of their bytes; bytes whole; str, int, float, bool and None by value; lists,
tuples and dicts of those by their canonical key encoding. Nothing is sampled, so two calls
share a value only if their inputs are equal (or a 128-bit hash collides).

Values: a numpy array is stored as an array (dtype, shape, bytes); anything else (torch
tensors included, bf16 too) is pickled. One call computes a key at a time, across threads and
processes; the others wait and read its value.
"""

from __future__ import annotations

import functools
import os
import pickle
import sys
from typing import Any, Callable, Mapping

from . import _tunecache as _ext
from ._cache import _leftovers, emit_warnings

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


def encode_arg(value: Any, where: str) -> tuple[Any, ...]:
    """One argument in the form the key builder takes."""
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
        dt, shape, data = _array_parts(np.asarray(value))
        return ("tensor", dt, shape, data)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        dt, shape, data = torch_parts(value)
        return ("tensor", dt, shape, data)
    if isinstance(value, (list, tuple, dict)):
        try:
            return ("bytes", _ext.canonical_key({"v": value}))
        except (TypeError, ValueError, OverflowError) as e:
            raise TypeError(f"{where}: {e}; pass key= to memoize to say what identifies it") from e
    raise TypeError(
        f"{where} is a {type(value).__name__}: memoize hashes arrays, bytes, str, int, float, "
        "bool, None and lists/dicts of those; pass key= to say what identifies it"
    )


def _to_value(result: Any) -> tuple[str, tuple[int, ...], Any]:
    np = _numpy()
    if np is not None and type(result) is np.ndarray and result.dtype.name in _NUMPY_TO_TC and result.dtype.isnative:
        dt, shape, data = _array_parts(result)
        # A u8 array that could be taken for a pickle is pickled itself.
        if not (dt == "u8" and len(shape) == 2 and shape[0] == 1 and bytes(data[: len(_PICKLED)]) == _PICKLED):
            return dt, shape, data
    blob = _PICKLED + pickle.dumps(result, protocol=5)
    return "u8", (1, len(blob)), blob


def _from_value(dtype: str, shape: list[int], data: bytearray) -> Any:
    if dtype == "u8" and len(shape) == 2 and shape[0] == 1 and data[: len(_PICKLED)] == _PICKLED:
        return pickle.loads(memoryview(data)[len(_PICKLED):])
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
        if self._pid != os.getpid():
            if self._cache is not None:
                _leftovers.append(self._cache)
            try:
                self._cache = _ext.OutputCache(self.dir, **self.options)
            finally:
                emit_warnings()
            self._pid = os.getpid()
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
        cache = self.outputs.get()
        key = self.key(*args, **kwargs)

        def compute() -> tuple[str, tuple[int, ...], Any]:
            return _to_value(self.fn(*args, **kwargs))

        try:
            dtype, shape, data = cache.get_or_compute(key, compute)
        finally:
            emit_warnings()
        return _from_value(dtype, shape, data)

    def _call_batch(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        np = _numpy()
        if np is None:
            import numpy as np
        args = list(args)
        if isinstance(self.batch, int):
            batch = args[self.batch]
            rest_args = args[: self.batch] + [None] + args[self.batch + 1 :]
            rest_kwargs = dict(kwargs)
        else:
            batch = kwargs[self.batch]
            rest_args = args
            rest_kwargs = {k: v for k, v in kwargs.items() if k != self.batch}
            rest_kwargs[self.batch] = None
        torch = sys.modules.get("torch")
        is_torch = torch is not None and isinstance(batch, torch.Tensor)
        if is_torch:
            dt, shape, data = torch_parts(batch)
        else:
            batch = np.asarray(batch)
            dt, shape, data = _array_parts(batch)
        cache = self.outputs.get()
        keys = _ext.output_batch_keys(
            self.name, self.version, self.config, self._parts(tuple(rest_args), rest_kwargs), ("tensor", dt, shape, data)
        )
        found: list[Any] = [None] * len(keys)
        missing = []
        for i, k in enumerate(keys):
            got = cache.get(k)
            if got is None:
                missing.append(i)
            else:
                found[i] = _from_value(*got)
        if missing:
            sub = batch[torch.as_tensor(missing)] if is_torch else batch[np.asarray(missing, dtype=np.int64)]
            call_args = list(args)
            call_kwargs = dict(kwargs)
            if isinstance(self.batch, int):
                call_args[self.batch] = sub
            else:
                call_kwargs[self.batch] = sub
            out = self.fn(*call_args, **call_kwargs)
            if len(out) != len(missing):
                raise ValueError(
                    f"{self.name}: a batch of {len(missing)} items gave {len(out)} outputs"
                )
            for j, i in enumerate(missing):
                item = out[j]
                dtype, ishape, idata = _to_value(item)
                cache.put(keys[i], dtype, list(ishape), idata)
                found[i] = item
            emit_warnings()
        if is_torch:
            return torch.stack([x if isinstance(x, torch.Tensor) else torch.as_tensor(x) for x in found])
        return np.stack(found) if found else np.empty((0,))

    def stats(self) -> dict[str, int]:
        """This process's counters: memory_hits, disk_hits, misses, computed, waited, ..."""
        return self.outputs.get().stats()


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
