"""WarpConvNet's cache values as tunecache entries, without WarpConvNet: the mapping both the
drop-in and the importer use, WarpConvNet's registered migrations, and its file format.

WarpConvNet keeps ``{namespace: {key: value}}`` and writes keys and values in a tagged form
(``_to_msgpack``): a tuple is ``{"__t__": "T", "d": [...]}``, a set ``{"__t__": "S", ...}``, a
sparse-conv config ``{"__t__": "SCC", "li": ..., ...}``, enums and dtypes their names. Here every
entry is kept in that tagged form, made canonical (tunecache keys refuse floats and null
array items) by three more tags: ``{"__t__": "F", "r": repr}`` for a float, ``{"__t__": "N"}`` for
``None``, ``{"__t__": "B", "hex": ...}`` for bytes. Mapping (IMPORTS in FORMAT.md):

- key: ``{"k": <tagged key>}``;
- a best-first list of ``(algo, params, metric_ms)`` tuples (the sparse-conv namespaces): one
  candidate per tuple, algorithm ``algo``, params the tagged params, median ``metric`` ms in ns
  (a metric that is no time: failed);
- a best-first list of ``{"params": dict, "metric": ms}`` (``make_autotuned_op``): the same with
  algorithm ``@params``;
- anything else (a params dict, the fallback namespace's ``[algo, params]``): one recorded
  candidate ``value`` with ``{"json": <tagged value as JSON>}``.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Callable, Iterator
from typing import Any

from ._common import VALUE, newest_value

FILE_NAME = "benchmark_cache_generic.msgpack"
PARAMS = "@params"


class FormatError(ValueError):
    """A WarpConvNet cache file tunecache cannot take in (the message names file and place)."""


# -- tagged form <-> canonical -------------------------------------------------------------


def canon(form: Any) -> Any:
    if form is None:
        return {"__t__": "N"}
    if isinstance(form, bool) or isinstance(form, str):
        return form
    if isinstance(form, int):
        return form if -(2**63) <= form < 2**63 else {"__t__": "I", "r": str(form)}
    if isinstance(form, float):
        return {"__t__": "F", "r": repr(form)}
    if isinstance(form, (bytes, bytearray)):
        return {"__t__": "B", "hex": bytes(form).hex()}
    if isinstance(form, (list, tuple)):
        return [canon(v) for v in form]
    if isinstance(form, dict):
        out = {}
        for k, v in form.items():
            if not isinstance(k, str):
                raise FormatError(f"a map key {k!r} is not a string")
            out[k] = canon(v)
        return out
    raise FormatError(f"a {type(form).__name__} value cannot be kept")


def uncanon(value: Any) -> Any:
    if isinstance(value, list):
        return [uncanon(v) for v in value]
    if isinstance(value, dict):
        tag = value.get("__t__")
        if tag == "N" and len(value) == 1:
            return None
        if tag == "F" and set(value) == {"__t__", "r"}:
            return float(value["r"])
        if tag == "I" and set(value) == {"__t__", "r"}:
            return int(value["r"])
        if tag == "B" and set(value) == {"__t__", "hex"}:
            return bytes.fromhex(value["hex"])
        return {k: uncanon(v) for k, v in value.items()}
    return value


# -- values <-> candidates -------------------------------------------------------------------


def _triple(item: Any) -> tuple[str, dict, Any] | None:
    if isinstance(item, dict) and item.get("__t__") == "T" and set(item) == {"__t__", "d"}:
        d = item["d"]
        if isinstance(d, list) and len(d) == 3 and isinstance(d[0], str) and isinstance(d[1], dict) and _number(d[2]):
            return d[0], d[1], d[2]
    return None


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _params_metric(item: Any) -> tuple[dict, Any] | None:
    if isinstance(item, dict) and set(item) == {"params", "metric"}:
        if isinstance(item["params"], dict) and _number(item["metric"]):
            return item["params"], item["metric"]
    return None


def candidates(form: Any) -> list[tuple[str, dict, dict]]:
    """The ``(algorithm, params, timing)`` puts a tagged value becomes; ``timing`` is the
    keyword arguments of ``Cache.put``."""
    if isinstance(form, list) and form:
        triples = [_triple(i) for i in form]
        if all(t is not None for t in triples):
            return [(a, canon(p), _timing(m)) for a, p, m in triples]  # type: ignore[misc]
        pairs = [_params_metric(i) for i in form]
        if all(p is not None for p in pairs):
            return [(PARAMS, canon(p), _timing(m)) for p, m in pairs]  # type: ignore[misc]
    text = json.dumps(canon(form), sort_keys=True, separators=(",", ":"))
    return [(VALUE, {"json": text}, {"median_ns": 0.0, "samples": 0})]


def _timing(metric: Any) -> dict:
    m = float(metric)
    if math.isfinite(m) and m >= 0:
        return {"median_ns": m * 1e6}
    return {"failed": f"WarpConvNet metric {m!r}"}


def value_of(entry: Any) -> Any:
    """The tagged value an entry holds (the inverse of :func:`candidates`)."""
    text = newest_value(entry)
    if text is not None:
        return uncanon(json.loads(text))
    cands = list(entry.candidates)
    out = []
    for c in cands:
        metric = math.inf if c.median_ns is None else c.median_ns / 1e6
        params = uncanon(c.params)
        if c.algorithm == PARAMS:
            out.append({"params": params, "metric": metric})
        else:
            out.append({"__t__": "T", "d": [c.algorithm, params, metric]})
    return out


def key_of(key_form: Any) -> dict:
    return {"k": canon(key_form)}


def key_form_of(entry: Any) -> Any:
    return uncanon(entry.key["k"])


# -- WarpConvNet's registered migrations, on the tagged form -------------------------------

_RENAMES_V8_V9 = {"production": "mask_gemm", "production_fwd_as_dgrad": "mask_gemm_fwd_as_dgrad"}


def _v8_v9(namespaces: dict[str, list]) -> dict[str, list]:
    for pairs in namespaces.values():
        for pair in pairs:
            value = pair[1]
            if not isinstance(value, list):
                continue
            for item in value:
                t = _triple(item)
                if t is not None and t[0] in _RENAMES_V8_V9:
                    item["d"][0] = _RENAMES_V8_V9[t[0]]
    return namespaces


#: ``from_major -> (to_major, step)``, as WarpConvNet 1.8.2 registers them.
MIGRATIONS: dict[int, tuple[int, Callable[[dict[str, list]], dict[str, list]]]] = {8: (9, _v8_v9)}


def major(version: Any) -> int:
    """WarpConvNet's reading of a file version: the digits before the first dot (``"v3.0"``, 3.0
    and ``"3"`` are 3; none is 1)."""
    digits = re.sub(r"[^0-9.]", "", str(version)).split(".")
    return int(digits[0]) if digits and digits[0] else 1


def migrate(namespaces: dict[str, list], source: str, have: int, want: int) -> dict[str, list]:
    if have > want:
        raise FormatError(f"{source}: version {have} is newer than {want}, which this import writes")
    while have < want:
        step = MIGRATIONS.get(have)
        if step is None:
            raise FormatError(
                f"{source}: WarpConvNet registers no migration from version {have} toward {want} "
                f"(its own loader drops this file); import it with version={have} or tune again"
            )
        to, fn = step
        namespaces = fn(namespaces)
        have = to
    return namespaces


# -- the file ------------------------------------------------------------------------------


def read_file(path: str) -> tuple[int, dict[str, list]]:
    """``(major version, {namespace: [[key form, value form], ...]})`` of a WarpConvNet file,
    checked whole; raises :class:`FormatError` naming the file and the place."""
    import msgpack

    try:
        # Opened without blocking and checked before reading: a FIFO or a device is refused,
        # never waited on or read without end.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise FormatError(f"{path}: not a regular file")
            data = f.read()
    except OSError as e:
        raise FormatError(f"{path}: cannot be read: {e}") from e
    try:
        doc = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as e:
        raise FormatError(f"{path}: not a msgpack document: {e}") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("namespaces"), dict):
        raise FormatError(f"{path}: not a WarpConvNet benchmark cache (no 'namespaces' map at the top)")
    out: dict[str, list] = {}
    for ns, pairs in doc["namespaces"].items():
        if not isinstance(ns, str):
            raise FormatError(f"{path}: namespace name {ns!r} is not a string")
        if isinstance(pairs, dict):
            pairs = [[k, v] for k, v in pairs.items()]
        if not isinstance(pairs, list):
            raise FormatError(f"{path}: namespace {ns!r} is not a list of [key, value] pairs")
        for i, pair in enumerate(pairs):
            if not isinstance(pair, list) or len(pair) != 2:
                raise FormatError(f"{path}: namespace {ns!r} item {i} is not a [key, value] pair")
        out[ns] = pairs
    return major(doc.get("version", "1.0")), out


def puts(path: str, namespaces: dict[str, list]) -> Iterator[tuple[str, dict, Any, list]]:
    """``(namespace, key, value form, candidates)`` for every pair, each checked."""
    for ns, pairs in namespaces.items():
        for i, (k, v) in enumerate(pairs):
            try:
                yield ns, key_of(k), v, candidates(v)
            except FormatError as e:
                raise FormatError(f"{path}: namespace {ns!r} item {i}: {e}") from e
            except RecursionError as e:
                raise FormatError(f"{path}: namespace {ns!r} item {i}: nested too deep") from e
