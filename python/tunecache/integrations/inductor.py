"""Inductor: max-autotune's template selection and the configs of Triton's heuristic kernels,
kept in tunecache.

``install()`` (in the compiling process) does both:

- **max-autotune's selection** (the GEMM choice between Triton, C++ or CUTLASS templates and
  ATen kernels, which Inductor otherwise benchmarks in every process whose cache directory does
  not hold its timings): see :mod:`tunecache.integrations._inductor_select`. A selection
  tunecache holds is served with nothing benchmarked; every selection Inductor benchmarks is
  recorded, and reaches other machines through ``TUNECACHE_REMOTE``.
- **the remote autotune cache** (the configs of Triton's pointwise and reduction kernels): it
  sets ``backend_override_cls`` of ``torch._inductor.remote_cache.RemoteAutotuneCache`` and
  ``RemoteBundledAutotuneCache`` to :class:`Backend`; with ``TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE=1``
  (or ``config.autotune_remote_cache = True``) Inductor then reads and writes those configs
  through tunecache, and no Redis is needed.

Inductor's compile workers are separate processes: ``write_pth(site_packages)`` writes an opt-in
``tunecache-inductor.pth`` that installs the hook in every interpreter of that environment where
``TUNECACHE_INDUCTOR=1`` is set, when ``torch._inductor.remote_cache`` is first imported (nothing
is imported before that). Tested with torch 2.15.0.

Values stay opaque: each is the JSON text Inductor wrote, kept as a recorded value in namespace
``inductor/autotune`` (or ``inductor/bundled-autotune``) under key ``{"key": <Inductor's key>}``;
scope: this machine (:func:`tunecache.default_scope`) with the torch and Triton versions. A value
that is not a JSON object is a miss with one warning (Inductor would raise on it).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
from torch._inductor import remote_cache as _remote

from . import _inductor_select
from ._common import Counts, Store, require, version_of, warn_once

TESTED = "2.15.0"
PTH_NAME = "tunecache-inductor.pth"

require(
    "torch",
    version_of(torch),
    TESTED,
    _remote,
    ["RemoteCacheBackend", "RemoteAutotuneCache", "RemoteBundledAutotuneCache"],
    "torch._inductor.remote_cache",
)
require(
    "torch",
    version_of(torch),
    TESTED,
    _remote.RemoteAutotuneCache,
    ["backend_override_cls"],
    "torch._inductor.remote_cache.RemoteAutotuneCache",
)


_inductor_select.check(version_of(torch), TESTED)

#: What the remote autotune cache's backend served, missed and recorded in this process.
counts = Counts("inductor-remote-cache")


def _scope() -> dict[str, Any]:
    from .._scope import default_scope

    extra = {"torch": version_of(torch)}
    triton = sys.modules.get("triton")
    if triton is not None:
        extra["triton"] = version_of(triton)
    return default_scope(extra)


store = Store("inductor", _scope)


def _usable(data: bytes) -> bool:
    try:
        return isinstance(json.loads(data), dict)
    except ValueError:
        return False


class Backend(_remote.RemoteCacheBackend):
    """Inductor's bytes backend on a tunecache file; one per remote cache object."""

    namespace = "inductor/autotune"

    def _get(self, key: str) -> bytes | None:
        try:
            text = store.get_value(self.namespace, {"key": str(key)})
        except Exception as e:  # noqa: BLE001 - a miss, never a failed compile
            warn_once("inductor get", f"tunecache: an Inductor entry cannot be read ({e}); Inductor tunes again")
            return None
        if text is None:
            counts.add("missed")
            return None
        data = text.encode("utf-8")
        if not _usable(data):
            warn_once("inductor bad", f"tunecache: the Inductor entry {key} is not a JSON object; Inductor tunes again")
            counts.add("missed")
            return None
        counts.add("served")
        return data

    def _put(self, key: str, data: bytes) -> None:
        if not _usable(data):
            warn_once("inductor put value", f"tunecache: Inductor's value for {key} is not a JSON object; not kept")
            return
        try:
            store.put_value(self.namespace, {"key": str(key)}, bytes(data).decode("utf-8"))
            counts.add("recorded")
        except Exception as e:  # noqa: BLE001 - Inductor keeps its local cache
            warn_once("inductor put", f"tunecache: an Inductor result was not recorded ({e})")


class BundledBackend(Backend):
    namespace = "inductor/bundled-autotune"


def install() -> None:
    """Serves and records max-autotune's selections through tunecache, and makes Inductor's
    remote autotune caches use tunecache, in this process."""
    _remote.RemoteAutotuneCache.backend_override_cls = Backend
    _remote.RemoteBundledAutotuneCache.backend_override_cls = BundledBackend
    _inductor_select.install()


def installed() -> bool:
    return _remote.RemoteAutotuneCache.backend_override_cls is Backend and _inductor_select.installed()


def write_pth(site_packages: str | os.PathLike[str]) -> str:
    """Writes ``tunecache-inductor.pth`` into ``site_packages`` (opt-in, for compile workers);
    returns its path. Remove the file to undo. Written whole and linked into place; one already
    there is kept; anything else at that name (a link, another file) raises
    ``FileExistsError`` and is left alone."""
    path = os.path.join(os.fspath(site_packages), PTH_NAME)
    # Imports nothing unless TUNECACHE_INDUCTOR=1: every other interpreter start of the
    # environment stays as fast as without it (and quiet if tunecache is removed later).
    text = _PTH_TEXT
    # Never through a link, never over another file: a regular file with these bytes is
    # already done; anything else at the name is the user's and is refused. The file is
    # written whole beside the name, then linked to it (a link never replaces anything).
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        import stat

        if stat.S_ISREG(st.st_mode):
            with open(path, "rb") as f:
                found = f.read(len(text) + 1)
            if found == text:
                return path
            if found == _PTH_TEXT_BEFORE:
                # An earlier version's file, ours byte for byte: brought up to date in place.
                _write_new(site_packages, path, text, replace=True)
                return path
        raise FileExistsError(f"{path} exists and is not the file tunecache writes; left alone")
    _write_new(site_packages, path, text, replace=False)
    return path


#: What ``write_pth`` writes: the boot module is imported only when ``TUNECACHE_INDUCTOR=1``.
_PTH_TEXT = (
    b'import os; os.environ.get("TUNECACHE_INDUCTOR") == "1" and __import__("tunecache.integrations._inductor_boot")\n'
)
#: What earlier versions wrote (imported tunecache at every interpreter start).
_PTH_TEXT_BEFORE = b"import tunecache.integrations._inductor_boot\n"


def _write_new(site_packages: str | os.PathLike[str], path: str, text: bytes, replace: bool) -> None:
    """Writes ``text`` whole beside ``path``, then links it to ``path`` (which never replaces
    anything) or, with ``replace``, renames it over ``path`` (only ever over our own file)."""
    tmp = os.path.join(os.fspath(site_packages), f".{PTH_NAME}.tmp.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
