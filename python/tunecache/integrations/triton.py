"""Triton: ``@triton.autotune(cache_results=True)`` results kept in tunecache.

Switch it on with ``TRITON_CACHE_MANAGER=tunecache.integrations.triton:CacheManager`` (or
``triton.knobs.cache.manager_class = CacheManager``) and ``TRITON_CACHE_AUTOTUNING=1`` (or
``cache_results=True``). Tested with Triton 3.9.0.

Triton's autotuner asks its cache manager for ``<fn>.autotune.json`` in a directory named by a
hash of Triton's version, the target, the function's source, the environment, the tuning key and
the pruned configs. This manager keeps that file as a tunecache entry instead:

- namespace ``triton/<fn>``; key ``{"hash": <directory hash>, "tuning": {<key arg>: value, ...,
  "dtype0": ...}}`` (the tuning key's fields named as the ``@autotune(key=[...])`` list names
  them, then the argument dtypes Triton appends);
- one candidate per config: the algorithm is the config written out (``B=64,num_warps=4,...``),
  the params are the config's fields, the timing is Triton's ``[p50, p20, p80]`` in ms as median,
  minimum (p20) and spread (p80 - p20) in ns; a config timed ``inf`` (out of resources) is failed;
- the scope is :func:`tunecache.default_scope` (the GPU through torch) plus the Triton version.

On ``get_file`` the file is written back from the entry into a private temporary directory and
that path handed to Triton. A file that Triton's own cache directory already holds is taken into
tunecache on first read. Every other file (kernels, groups) and the override and dump modes go
to Triton's own ``FileCacheManager``.
"""

from __future__ import annotations

import atexit
import hashlib
import itertools
import json
import math
import os
import shutil
import sys
import tempfile
import threading
from typing import Any

import triton
from triton.runtime import cache as _triton_cache

from ._common import Counts, Store, after_fork_in_child, key_value, require, version_of, warn_once

TESTED = "3.9.0"
_SUFFIX = ".autotune.json"

require(
    "triton",
    version_of(triton),
    TESTED,
    _triton_cache,
    ["CacheManager", "FileCacheManager", "get_cache_manager"],
    "triton.runtime.cache",
)
require(
    "triton",
    version_of(triton),
    TESTED,
    _triton_cache.CacheManager,
    ["get_file", "put", "get_group", "put_group"],
    "triton.runtime.cache.CacheManager",
)


#: What the cache manager served, missed and recorded in this process.
counts = Counts("triton")


def _scope() -> dict[str, Any]:
    from .._scope import default_scope

    return default_scope({"triton": version_of(triton)})


store = Store("triton", _scope)

_tmp_lock = threading.Lock()
_tmp_dir: str | None = None
_counter = itertools.count()


def _renew() -> None:
    # A forked child makes its own private directory: the parent's stays the parent's.
    global _tmp_lock, _tmp_dir
    _tmp_lock = threading.Lock()
    _tmp_dir = None
    _rendered.clear()


after_fork_in_child(_renew)


def _remove_private(path: str, owner: int) -> None:
    """At exit: removes the private directory, only in the process that made it (a forked
    child inherits the exit handler, not the directory)."""
    if os.getpid() == owner:
        shutil.rmtree(path, ignore_errors=True)


def _private_dir() -> str:
    global _tmp_dir
    with _tmp_lock:
        if _tmp_dir is None or not os.path.isdir(_tmp_dir):
            _tmp_dir = tempfile.mkdtemp(prefix="tunecache-triton-")
            atexit.register(_remove_private, _tmp_dir, os.getpid())
        return _tmp_dir


def _write_private(filename: str, text: str) -> str:
    """A file of this process's private directory holding ``text``; returns its path. Named by
    the text's hash, so a hit that was served before reuses its file (the directory does not
    grow per hit); written to a temporary name and renamed, so a reader never sees part."""
    data = text.encode("utf-8")
    name = f"{hashlib.blake2b(data, digest_size=16).hexdigest()}-{filename}"
    path = os.path.join(_private_dir(), name)
    try:
        with open(path, "rb") as f:
            if f.read(len(data) + 1) == data:
                return path  # the same text, written before
    except OSError:
        pass  # not there, or not a file: written (again) below
    tmp = f"{path}.{os.getpid()}.{next(_counter)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except OSError:
        # The name is taken by something that is not a file (a directory made there): the
        # text goes under a name of its own instead.
        path = f"{path}.{next(_counter)}"
        os.replace(tmp, path)
    return path


class CacheManager(_triton_cache.CacheManager):
    """A Triton cache manager that keeps autotuning results in tunecache."""

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        self.key = key
        self._override = override
        self._dump = dump
        self._files: _triton_cache.FileCacheManager | None = None

    def _own(self) -> _triton_cache.FileCacheManager:
        if self._files is None:
            self._files = _triton_cache.FileCacheManager(self.key, self._override, self._dump)
        return self._files

    def _ours(self, filename: str) -> bool:
        return filename.endswith(_SUFFIX) and not self._override and not self._dump

    def get_file(self, filename: str) -> str | None:
        if self._ours(filename):
            key = _key(self.key, _tuning_fields())
            served = digest = None
            try:
                # A hit whose entry is as served before: one call, no entry built in Python. The
                # digest is read before the entry, so a file is never kept under a newer digest
                # than the entry it was rendered from.
                digest = _digest(filename, key)
                served = _served_before(filename, digest)
                entry = None if served is not None else _entry(filename, key)
            except Exception as e:  # noqa: BLE001 - a miss, never a failed autotune
                warn_once("triton read", f"tunecache: a Triton autotune entry cannot be read ({e}); tuning again")
                entry = None
            if entry is not None:
                try:
                    served = _served_path(filename, entry, digest)
                except OSError as e:
                    warn_once("triton tmp", f"tunecache: cannot write a temporary file for Triton ({e})")
                except Exception as e:  # noqa: BLE001 - a miss, never a failed autotune
                    warn_once("triton read", f"tunecache: a Triton autotune entry cannot be read ({e}); tuning again")
            if served is not None:
                counts.add("served")
                return served
            counts.add("missed")
            path = self._own().get_file(filename)
            if path is not None:
                _adopt(filename, key, path)
            return path
        return self._own().get_file(filename)

    def put(self, data: Any, filename: str, binary: bool = True) -> str:
        if self._ours(filename) and not store.durable():
            warn_once(
                "triton memory",
                "tunecache: the Triton cache is in memory only; autotune results stay in Triton's cache directory",
            )
        elif self._ours(filename):
            try:
                text = data.decode("utf-8") if isinstance(data, bytes) else str(data)
                _record(filename, _key(self.key, _tuning_fields()), text)
                counts.add("recorded")
                return _write_private(filename, text)
            except Exception as e:  # noqa: BLE001 - Triton keeps its own file instead
                warn_once(
                    "triton put",
                    f"tunecache: a Triton autotune result was not recorded ({e}); kept in Triton's cache directory",
                )
        return self._own().put(data, filename, binary)

    def get_group(self, filename: str) -> dict[str, str] | None:
        return self._own().get_group(filename)

    def put_group(self, filename: str, group: dict[str, str]) -> Any:
        return self._own().put_group(filename, group)


def _tuning_fields() -> dict[str, Any]:
    """The tuning key with its fields named, read from the calling ``check_disk_cache`` (the
    manager is given only the directory hash); empty when Triton's call is not that one."""
    try:
        frame = sys._getframe(2)
        if frame.f_code.co_name != "check_disk_cache":
            return {}
        tuning_key = frame.f_locals.get("tuning_key")
        keys = list(getattr(frame.f_locals.get("self"), "keys", None) or [])
        if not isinstance(tuning_key, tuple):
            return {}
        # Autotuner.run: the key is the named arguments present, then every argument's dtype.
        present = frame.f_back.f_locals.get("_args") if frame.f_back is not None else None
        names = [k for k in keys if k in present] if isinstance(present, dict) else keys
        fields: dict[str, Any] = {}
        for i, value in enumerate(tuning_key):
            name = names[i] if i < len(names) else f"dtype{i - len(names)}"
            fields[str(name)] = key_value(value)
        return fields
    except Exception:  # noqa: BLE001 - only names for display
        return {}


def _key(directory: str, tuning: dict[str, Any]) -> dict[str, Any]:
    key: dict[str, Any] = {"hash": directory}
    if tuning:
        key["tuning"] = tuning
    return key


def _namespace(filename: str) -> str:
    return "triton/" + filename[: -len(_SUFFIX)]


def _config_of(params: dict[str, Any]) -> dict[str, Any]:
    if set(params) == {"json"}:
        return json.loads(params["json"])
    return dict(params)


def _record(filename: str, key: dict[str, Any], text: str) -> None:
    """Records what Triton wrote for ``filename`` through cache-import's Triton mapping (the
    one the importer uses too: candidate names, params, p50/p20/p80, failures)."""
    cache = store.cache()
    if cache is None:
        raise OSError("the tunecache file cannot be used")
    cache._record_triton(_namespace(filename), key, text, filename)


def _entry(filename: str, key: dict[str, Any]) -> Any:
    """The entry for ``key``, or None."""
    cache = store.cache()
    if cache is None:
        return None
    entry = cache.get(_namespace(filename), key)
    if entry is None and "tuning" in key:
        # Entries imported from Triton's own files (`tunecache import --from triton`) know
        # only the directory hash, which already covers the tuning key.
        entry = cache.get(_namespace(filename), {"hash": key["hash"]})
    return entry


def _read(filename: str, key: dict[str, Any]) -> str | None:
    """The ``<fn>.autotune.json`` text Triton wrote, rebuilt from the entry; None on a miss."""
    entry = _entry(filename, key)
    return None if entry is None else _render(entry)


#: The files already written for an entry's content: (file name, the digest of the entry's
#: canonical bytes) → its private path and what ``os.stat`` said of it once written (inode,
#: size, modification time). A hit whose entry is as it was served before reuses the file
#: without rendering it again, if the file is still the one written (a file replaced,
#: truncated or turned into something else is rendered again); the entry's digest is still
#: read from tunecache on every hit, so a newer result is served at once. Bounded.
_rendered: dict[tuple[str, int], tuple[str, tuple[int, int, int]]] = {}
_RENDERED_MAX = 4096


def _digest(filename: str, key: dict[str, Any]) -> int | None:
    """The digest of the entry :func:`_entry` would return, or None (on every hit: kept
    lean)."""
    cache = store.cache()
    if cache is None:
        return None
    namespace = _namespaces.get(filename) or _namespaces.setdefault(filename, _namespace(filename))
    digest = cache._entry_digest(namespace, key)
    if digest is None and "tuning" in key:
        digest = cache._entry_digest(namespace, {"hash": key["hash"]})
    return digest


#: Each file name's namespace, made once.
_namespaces: dict[str, str] = {}


def _served_before(filename: str, digest: int | None) -> str | None:
    """The private file already rendered from the entry whose digest is ``digest``, if any."""
    if digest is None:
        return None
    kept = _rendered.get((filename, digest))
    if kept is None:
        return None
    path, written = kept
    try:
        st = os.stat(path)  # the one system call Triton's own hit makes too
    except OSError:
        return None
    return path if (st.st_ino, st.st_size, st.st_mtime_ns) == written else None


def _served_path(filename: str, entry: Any, digest: int | None) -> str | None:
    """The private file holding ``entry`` rendered (read after its digest ``digest`` was), kept
    for the next hits; None when the entry renders nothing Triton can use."""
    text = _render(entry)
    if text is None:
        return None
    path = _write_private(filename, text)
    if digest is not None:
        st = os.stat(path)
        if len(_rendered) >= _RENDERED_MAX:
            _rendered.clear()
        _rendered[(filename, digest)] = (path, (st.st_ino, st.st_size, st.st_mtime_ns))
    return path


def _render(entry: Any) -> str | None:
    """The ``<fn>.autotune.json`` text of ``entry`` (Triton's rows, its timings in ms); None
    when it has no candidate. A config this Triton cannot build raises."""
    rows: list[list[Any]] = []
    for cand in entry.candidates:
        config = _config_of(cand.params)
        median, failed = cand.median_ns, cand.failed
        if failed is not None or median is None:
            timing = [math.inf, math.inf, math.inf]
        else:
            lo = cand.min_ns
            lo = median if lo is None else lo
            timing = [median / 1e6, lo / 1e6, (lo + (cand.spread_ns or 0.0)) / 1e6]
        rows.append([config, timing])
    if not rows:
        return None
    for config, _ in rows:
        triton.Config(**config)  # what Triton does with each row: a field it lacks is a miss here

    tuning = list(entry.key.get("tuning", {}).values()) or None
    return json.dumps({"key": tuning, "configs_timings": rows})


def _adopt(filename: str, key: dict[str, Any], path: str) -> None:
    """Takes a file from Triton's own cache directory into tunecache (its files stay)."""
    try:
        with open(path, encoding="utf-8") as f:
            _record(filename, key, f.read())
    except Exception as e:  # noqa: BLE001 - Triton still has its file
        warn_once("triton adopt", f"tunecache: {path} was not taken in ({e})")
