"""WarpConvNet: its benchmark cache on a tunecache file, and its cache files taken in.

``install()`` (after importing WarpConvNet, before its first tuned op) replaces
``warpconvnet.utils.benchmark_cache.GenericBenchmarkCache`` and the module's cache object with
:class:`BenchmarkCache`: the same API (``get_namespace``, ``update_entry``, ``save_cache``,
``load_cache``, ``mark_dirty``, ``register_value_validator``, ``register_on_merge_callback``),
with the results in ``<cache dir>/benchmark_cache_generic.tcache``: every result journaled when
recorded (crash-safe), shared by every process and rank without lost updates, versioned by
WarpConvNet's cache version (the file's schema), and open to ``tunecache list/explain/diff``.
A WarpConvNet file already in that directory is taken in when the tunecache file is new.

``import_file(path)`` (and ``python -m tunecache.integrations.warpconvnet FILE``) takes a
``benchmark_cache_generic.msgpack`` in, all or nothing, through WarpConvNet's registered
migrations. The mapping is in :mod:`tunecache.integrations._wcn_format`. Tested with
WarpConvNet 1.8.2 (cache version 18).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import _wcn_format as fmt
from ._common import after_fork_in_child, log, require, warn_once

TESTED = "1.8.2"
APP = "warpconvnet"
TCACHE_NAME = "benchmark_cache_generic.tcache"


def _module() -> Any:
    import warpconvnet.utils.benchmark_cache as bc

    require(
        "warpconvnet",
        _wcn_version(),
        TESTED,
        bc,
        [
            "GenericBenchmarkCache",
            "_generic_benchmark_cache",
            "_to_msgpack",
            "_from_msgpack",
            "_sanitize_for_pickle",
            "WARPCONVNET_BENCHMARK_CACHE_VERSION",
            "get_generic_benchmark_cache",
        ],
        "warpconvnet.utils.benchmark_cache",
    )
    return bc


def _wcn_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("warpconvnet")
    except Exception:  # noqa: BLE001 - no distribution metadata: a source tree
        return "(source tree)"


def _current_major() -> int:
    return fmt.major(_module().WARPCONVNET_BENCHMARK_CACHE_VERSION)


def _scope() -> dict[str, Any]:
    from .._scope import default_scope

    return default_scope({"warpconvnet": _wcn_version()})


_open_lock = threading.Lock()
_open: dict[tuple[str, int], Any] = {}


def _renew() -> None:
    global _open_lock
    _open_lock = threading.Lock()


after_fork_in_child(_renew)


def _cache_at(path: Path, schema: int) -> Any:
    """One tunecache handle per file and schema in this process."""
    from .._cache import Cache

    with _open_lock:
        c = _open.get((str(path), schema))
        if c is None or c.closed:
            c = _open[(str(path), schema)] = Cache(APP, schema=schema, scope=_scope(), path=path)
        return c


class BenchmarkCache:
    """WarpConvNet's ``GenericBenchmarkCache`` on a tunecache file."""

    def __init__(self, cache_dir: str | None = None) -> None:
        bc = _module()
        override = os.environ.get("WARPCONVNET_BENCHMARK_CACHE_DIR_OVERRIDE")
        cache_dir = override or cache_dir or bc.WARPCONVNET_BENCHMARK_CACHE_DIR
        self.cache_dir = Path(cache_dir).expanduser().resolve()
        self.cache_file = self.cache_dir / TCACHE_NAME
        self.lock = threading.Lock()
        self._validators: dict[str, Callable[[Any], None]] = {}
        self._on_merge_callbacks: list[Callable[[str, dict], None]] = []
        self.pending_changes = False
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            warn_once("wcn dir", f"tunecache: {self.cache_dir}: {e}")
        self._cache = _cache_at(self.cache_file, _current_major())
        self._adopt()
        self._results: dict[str, dict[Any, Any]] = self.load_cache()

    def _adopt(self) -> None:
        theirs = self.cache_dir / fmt.FILE_NAME
        if len(self._cache) == 0 and theirs.is_file():
            try:
                n = import_file(str(theirs), self._cache)
                log.info("tunecache: took %d WarpConvNet entries in from %s", n, theirs)
            except Exception as e:  # noqa: BLE001 - WarpConvNet then tunes again
                warn_once("wcn adopt", f"tunecache: {e}")

    # -- the API WarpConvNet's callers use ---------------------------------------------------

    def register_on_merge_callback(self, callback: Callable[[str, dict], None]) -> None:
        self._on_merge_callbacks.append(callback)

    def register_value_validator(self, namespace: str, validator: Callable[[Any], None]) -> None:
        if not callable(validator):
            raise TypeError("validator must be callable")
        self._validators[namespace] = validator

    def _validate_value(self, namespace: str, value: Any) -> None:
        validator = self._validators.get(namespace)
        if validator is not None:
            validator(value)

    def load_cache(self) -> dict[str, dict[Any, Any]]:
        """Every namespace this scope holds, as WarpConvNet's objects."""
        bc = _module()
        out: dict[str, dict[Any, Any]] = {}
        try:
            self._cache.refresh()
            entries = self._cache.entries()
        except Exception as e:  # noqa: BLE001 - a miss, never a failed op
            warn_once("wcn load", f"tunecache: the WarpConvNet cache cannot be read ({e})")
            return out
        for ns, entry in entries:
            try:
                key = bc._from_msgpack(fmt.key_form_of(entry))
                out.setdefault(ns, {})[key] = bc._from_msgpack(fmt.value_of(entry))
            except Exception as e:  # noqa: BLE001 - that entry is a miss
                warn_once("wcn entry", f"tunecache: a WarpConvNet entry of {ns} cannot be read ({e})")
        return out

    def get_namespace(self, namespace: str) -> dict[Any, Any]:
        with self.lock:
            mine = self._results.get(namespace)
            if mine:
                return dict(mine)
        found = self.load_cache().get(namespace, {})
        if found:
            with self.lock:
                self._results.setdefault(namespace, {}).update(found)
        return dict(found)

    def update_entry(self, namespace: str, key: Any, value: Any, force: bool = False) -> None:
        bc = _module()
        with self.lock:
            self._validate_value(namespace, value)
            value = bc._sanitize_for_pickle(value)
            self._results.setdefault(namespace, {})[key] = value
        self._record(namespace, key, value)
        if force:
            self._sync()

    def save_cache(
        self, cache_results: dict[str, dict[Any, Any]], force: bool = False, suppress_logging: bool = False
    ) -> None:
        bc = _module()
        with self.lock:
            for ns, kv in cache_results.items():
                for v in kv.values():
                    self._validate_value(ns, v)
            batch = [(ns, k, bc._sanitize_for_pickle(v)) for ns, kv in cache_results.items() for k, v in kv.items()]
            for ns, k, v in batch:
                self._results.setdefault(ns, {})[k] = v
        for ns, k, v in batch:
            self._record(ns, k, v)
        if force:
            self._sync(quiet=suppress_logging)

    def mark_dirty(self) -> None:
        """Nothing to do: every result is journaled when recorded."""

    def _save_on_exit(self) -> None:
        self._sync(quiet=True, notify=False)

    # -- storage --------------------------------------------------------------------------------

    def _record(self, namespace: str, key: Any, value: Any) -> None:
        bc = _module()
        try:
            key_form = fmt.key_of(bc._to_msgpack(key))
            cands = fmt.candidates(bc._to_msgpack(value))
            every = [(a, p) for a, p, _ in cands]
            for algo, params, timing in cands:
                self._cache.put(namespace, key_form, algo, params, candidates=every, **timing)
            self.pending_changes = True
        except Exception as e:  # noqa: BLE001 - WarpConvNet keeps it in memory and goes on
            warn_once("wcn record", f"tunecache: a WarpConvNet result of {namespace} was not recorded ({e})")

    def _sync(self, quiet: bool = False, notify: bool = True) -> None:
        """Makes what was recorded durable, reads what other processes recorded, and tells the
        merge callbacks (WarpConvNet's forced-save contract)."""
        try:
            self._cache.flush(10.0)
            self.pending_changes = False
        except Exception as e:  # noqa: BLE001 - kept in memory, saved later
            if not quiet:
                log.warning("tunecache: WarpConvNet results not yet on disk: %s", e)
        if not notify:
            return
        merged = self.load_cache()
        with self.lock:
            for ns, kv in self._results.items():
                merged.setdefault(ns, {}).update(kv)
            self._results = merged
        for cb in self._on_merge_callbacks:
            try:
                for ns, kv in merged.items():
                    cb(ns, kv)
            except Exception as e:  # noqa: BLE001 - as WarpConvNet does
                log.debug("on_merge callback error: %s", e)


def install(cache_dir: str | None = None) -> BenchmarkCache:
    """Makes WarpConvNet's benchmark cache this tunecache-backed one; returns it. Results the
    replaced object held in memory are recorded in it."""
    bc = _module()
    old = bc._generic_benchmark_cache
    bc.GenericBenchmarkCache = BenchmarkCache
    if isinstance(old, BenchmarkCache):
        return old
    new = BenchmarkCache(cache_dir) if cache_dir is not None else BenchmarkCache()
    if old is not None:
        try:
            old._shutdown_requested = True
            new.save_cache(getattr(old, "_results", {}) or {})
        except Exception as e:  # noqa: BLE001 - a partial take-over is warned of, never raised
            warn_once("wcn install", f"tunecache: WarpConvNet's in-memory results were not all taken over ({e})")
    bc._generic_benchmark_cache = new
    return new


def import_file(path: str, cache: Any = None, version: int | None = None) -> int:
    """Takes a WarpConvNet cache file into ``cache`` (default: WarpConvNet's tunecache file for
    that version at tunecache's default location), migrated to ``version`` (default: the
    installed WarpConvNet's, else the file's own) through WarpConvNet's registered migrations.
    All or nothing: a file that cannot be taken in whole raises :class:`FormatError` naming it
    and the place. Returns how many entries changed (0 when imported before)."""
    have, namespaces = fmt.read_file(path)
    if version is None:
        version = cache.schema if cache is not None else _installed_major(have)
    namespaces = fmt.migrate(namespaces, path, have, version)
    batch = list(fmt.puts(path, namespaces))
    if cache is None:
        from .._cache import Cache

        cache = Cache(APP, schema=version, scope=_scope())
    elif cache.schema != version:
        raise fmt.FormatError(f"{path}: migrated to version {version}, but the cache is at schema {cache.schema}")
    # All or nothing: every item is checked as a put would check it before the first is
    # recorded, and a refusal names the file and the item.
    counts: dict[str, int] = {}
    for ns, key, _, cands in batch:
        item = counts.get(ns, 0)
        counts[ns] = item + 1
        for algo, params, timing in cands:
            try:
                cache._rust.check_put(ns, key, algo, params, **timing)
            except Exception as e:
                raise fmt.FormatError(f"{path}: namespace {ns!r} item {item}: {e}; nothing was imported") from e
    changed = 0
    for ns, key, _, cands in batch:
        entry = cache.get(ns, key)
        if entry is not None and _same(entry, cands):
            continue
        every = [(a, p) for a, p, _ in cands]
        for algo, params, timing in cands:
            cache.put(ns, key, algo, params, candidates=every, **timing)
        changed += 1
    cache.flush(30.0)
    return changed


def import_into(cache: Any, path: str) -> dict[str, Any]:
    """``Cache.import_from("warpconvnet", path)``: :func:`import_file` into ``cache`` (the
    ``tunecache.importers`` entry point), in ``import_from``'s result form."""
    return {"imported": import_file(path, cache), "files": 1, "notes": []}


def _installed_major(default: int) -> int:
    try:
        return _current_major()
    except Exception:  # noqa: BLE001 - WarpConvNet is not installed: keep the file's version
        return default


def _same(entry: Any, cands: list) -> bool:
    have = {(c.algorithm, _text(c.params), c.median_ns, c.failed) for c in entry.candidates}
    if any(a == fmt.VALUE for a, _, _ in cands):
        # A recorded value: the same when the newest one is the same text.
        newest = fmt.value_of(entry) if any(c.algorithm == fmt.VALUE for c in entry.candidates) else None
        return newest == fmt.uncanon(json.loads(cands[0][1]["json"]))
    want = set()
    for algo, params, timing in cands:
        median = timing.get("median_ns")
        failed = timing.get("failed")
        want.add((algo, _text(params), median, failed))
    return have == want


def _text(params: Any) -> str:
    return json.dumps(params, sort_keys=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tunecache.integrations.warpconvnet", description="Take WarpConvNet cache files into tunecache."
    )
    p.add_argument("files", nargs="+")
    p.add_argument("--cache-file", help="the tunecache file (default: tunecache's location for app warpconvnet)")
    p.add_argument("--version", type=int, help="the WarpConvNet cache version to migrate to")
    args = p.parse_args(argv)
    from .._cache import Cache

    for f in args.files:
        try:
            have, _ = fmt.read_file(f)
            version = args.version if args.version is not None else _installed_major(have)
            cache = Cache(APP, schema=version, scope=_scope(), path=args.cache_file)
            n = import_file(f, cache, version)
            cache.close()
        except Exception as e:  # noqa: BLE001 - said, exit 1
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(f"{f}: {n} entries taken in (version {version})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
