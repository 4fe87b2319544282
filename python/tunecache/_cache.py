"""The cache: a thin layer over the Rust `Cache` for what Python users rely on.

- Warnings of the core go to the ``tunecache`` logger (``logging``).
- Safe after ``os.fork()``: pending results are saved (bounded) and saves are held around the
  fork, so the child never inherits the parent's file lock and sees what was recorded before
  it; the child leaves the parent's object alone (its saver thread exists only in the parent)
  and opens its own on first use.
- Picklable by configuration: a worker process that unpickles a ``Cache`` opens the same file,
  once: every task that brings the same pickled cache shares one object in that process.
- Results are flushed (bounded) at interpreter exit, and on SIGTERM once
  :func:`flush_on_sigterm` was called; in a process ``multiprocessing`` started (whose end
  skips atexit, and which a pool terminates with SIGTERM) both are armed on first use.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from . import _tunecache as _ext

log = logging.getLogger("tunecache")

#: How long the exit and SIGTERM flushes wait, in seconds, for a lock whose holders make no
#: progress (a stuck or frozen process).
EXIT_FLUSH_TIMEOUT = 5.0
#: How long they wait in all while other processes' saves ahead of them are landing (a pool
#: of hundreds of workers ending together queues for one lock), in seconds.
EXIT_BUDGET = 120.0
#: How long the flush before a fork waits, in seconds.
FORK_FLUSH_TIMEOUT = 2.0

_live: weakref.WeakSet[Cache] = weakref.WeakSet()
# Rust objects a forked child inherited: never dropped in the child (dropping one would wait
# for a saver thread that only exists in the parent).
_leftovers: list[Any] = []


def emit_warnings() -> None:
    """Logs the warnings the core queued since the last call."""
    for level, message in _ext.drain_warnings():
        if level == "error":
            log.error("%s", message)
        else:
            log.warning("%s", message)


def _migrations_json(app: str, schema: int, migrations: Any) -> str | None:
    if migrations is None:
        return None
    if isinstance(migrations, (str, os.PathLike)):
        with open(migrations, encoding="utf-8") as f:
            return f.read()
    if isinstance(migrations, Mapping):
        return json.dumps(dict(migrations))
    steps = [dict(s) for s in migrations]
    return json.dumps({"app": app, "current": schema, "steps": steps})


def _plugin_importer(format: str) -> Callable[..., dict[str, Any]] | None:
    """The importer another package registered for ``format`` (entry point group
    ``tunecache.importers``), if any."""
    from importlib.metadata import entry_points

    name = format.lower().replace("_", "-")
    for point in entry_points(group="tunecache.importers"):
        if point.name.lower().replace("_", "-") == name:
            loaded: Callable[..., dict[str, Any]] = point.load()
            return loaded
    return None


class Cache:
    """A persistent autotune cache for one application and scope.

    ``Cache(app, schema=1, migrations=None, scope=None, path=None, read_only=False)`` opens
    ``path`` (default: ``~/.cache/tunecache/<app>.tcache``, or ``TUNECACHE_DIR``). It never
    raises because of its location: a file that cannot be used degrades to memory and logs a
    warning (``health()["mode"]`` says so). ``migrations`` are the declarative steps that bring
    older files to ``schema``: a list of step dicts (``{"from": 1, "to": 2, "ops": [...]}``), a
    whole migration file as a dict, or the path of one (the CLI's format). ``scope`` is a dict
    describing what the results are valid for (device, driver, library version); see
    :func:`tunecache.default_scope`. ``consistency="fleet"`` (with a shared tier, ``remote=``)
    makes every process run the fleet's winner for a key: the one of the entry the shared tier
    holds (this process's results merged there first), taken on a key's first call and again
    at :meth:`sync`, the epoch; between two syncs a key's choice never changes. ``trust`` is a
    trust policy file (``tunecache keys policy``): a generation pinned with
    ``TUNECACHE_GENERATION`` is used only if its signatures satisfy it (default:
    ``TUNECACHE_TRUST``, if set).
    """

    def __init__(
        self,
        app: str,
        *,
        schema: int = 1,
        migrations: Any = None,
        scope: Mapping[str, Any] | None = None,
        path: str | os.PathLike[str] | None = None,
        read_only: bool = False,
        remote: str | None = None,
        save_delay: float | None = None,
        lock_timeout: float | None = None,
        consistency: str = "local",
        trust: str | os.PathLike[str] | None = None,
    ) -> None:
        if consistency not in ("local", "fleet"):
            raise ValueError(f"consistency must be 'local' or 'fleet', not {consistency!r}")
        self._config: dict[str, Any] = {
            "app": app,
            "schema": schema,
            "migrations": _migrations_json(app, schema, migrations),
            "scope": dict(scope) if scope is not None else None,
            "path": os.fspath(path) if path is not None else None,
            "read_only": read_only,
            "remote": remote,
            "save_delay": save_delay,
            "lock_timeout": lock_timeout,
            "consistency": consistency,
            "trust": os.fspath(trust) if trust is not None else None,
        }
        self._start()

    @property
    def consistency(self) -> str:
        """``"local"`` or ``"fleet"`` (see the class documentation)."""
        return str(self._config.get("consistency", "local"))

    def _start(self) -> None:
        """Opens the Rust cache from `_config` (construction and unpickling alike)."""
        self._listeners: weakref.WeakSet[Any] = weakref.WeakSet()
        self._closed = False
        self._c: Any = None
        self._c = self._open()
        _live.add(self)
        _arm_in_worker()

    def _open(self) -> Any:
        cfg = self._config
        try:
            return _ext.Cache(
                cfg["app"],
                cfg["schema"],
                migrations=cfg["migrations"],
                scope=cfg["scope"],
                path=cfg["path"],
                read_only=cfg["read_only"],
                remote=cfg["remote"],
                save_delay=cfg["save_delay"],
                lock_timeout=cfg["lock_timeout"],
                trust=cfg.get("trust"),
            )
        finally:
            emit_warnings()

    @property
    def _rust(self) -> Any:
        c = self._c
        if c is None:
            if self._closed:
                raise _ext.CacheError("the cache is closed")
            # A forked child: open our own.
            c = self._c = self._open()
            self._invalidate()
            _arm_in_worker()
        return c

    def _invalidate(self) -> None:
        for listener in list(self._listeners):
            listener._invalidate()

    def _listen(self, listener: Any) -> None:
        """Registers an object whose ``_invalidate()`` runs whenever this cache changes."""
        self._listeners.add(listener)

    # -- reading and recording -------------------------------------------------------------

    def get(self, namespace: str, key: Mapping[str, Any]) -> _ext.Entry | None:
        """The entry recorded for ``key`` in ``namespace``, or None."""
        return self._rust.get(namespace, key)

    def put(
        self,
        namespace: str,
        key: Mapping[str, Any],
        algorithm: str,
        params: Mapping[str, Any] | None = None,
        *,
        median_ns: float | None = None,
        min_ns: float | None = None,
        spread_ns: float = 0.0,
        samples: int = 1,
        failed: str | None = None,
        tuning_ns: int | None = None,
        candidates: Iterable[tuple[str, Mapping[str, Any]]] | None = None,
        policy: Mapping[str, Any] | None = None,
    ) -> _ext.Entry:
        """Records one candidate's measurement (``median_ns``, ...) or failure (``failed``:
        why) for ``key``, merged with what the entry holds; returns the merged entry.
        ``candidates`` (every ``(algorithm, params)`` of the tuning run) sets the entry's
        candidate-set checksum; ``policy`` says how it was measured (a dict: ``timer``,
        ``samples``, ...; results of policies that differ are never ranked against each
        other)."""
        if _armed_pid != os.getpid():
            _arm_in_worker()
        try:
            entry = self._rust.put(
                namespace,
                key,
                algorithm,
                params,
                median_ns=median_ns,
                min_ns=min_ns,
                spread_ns=spread_ns,
                samples=samples,
                failed=failed,
                tuning_ns=tuning_ns,
                candidates=None if candidates is None else list(candidates),
                policy=None if policy is None else dict(policy),
            )
        finally:
            self._invalidate()
        return entry

    def _record_triton(self, namespace: str, key: Mapping[str, Any], text: str, source: str) -> None:
        """Records one ``<fn>.autotune.json`` document Triton wrote as ``key``'s entry, measured
        here, through the one Triton mapping (cache-import's); ``ValueError`` names ``source``
        and the line of a document that is not Triton's."""
        if _armed_pid != os.getpid():
            _arm_in_worker()
        try:
            _ext.record_triton(self._rust, namespace, key, text, source)
        finally:
            self._invalidate()

    def _entry_digest(self, namespace: str, key: Mapping[str, Any]) -> int | None:
        """A digest of the entry :meth:`get` would return (its canonical bytes hashed), or None:
        what an adapter made from an entry can be reused while the digest is unchanged."""
        return _ext.entry_digest(self._rust, namespace, key)

    def entries(self, namespace: str | None = None) -> list[tuple[str, _ext.Entry]]:
        """Every ``(namespace, entry)`` of this cache's scope, sorted."""
        return self._rust.entries(namespace)

    def import_lines(self, text: str, source: str = "<python>", keep_origin: bool = False) -> int:
        """Merges JSON lines (``tunecache export``'s format), all or nothing; returns how many
        entries. ``keep_origin`` keeps each line's origin instead of marking it imported."""
        try:
            return self._rust.import_lines(text, source, keep_origin)
        finally:
            self._invalidate()
            emit_warnings()

    def import_from(
        self,
        format: str,
        path: str | os.PathLike[str],
        scope: Mapping[str, Any] | None = None,
        namespace: str | None = None,
    ) -> dict[str, Any]:
        """Merges another tool's cache files, all or nothing: ``format`` is ``vllm``,
        ``sglang``, ``triton``, ``tunableop``, ``kernel-tuner``, ``xla`` or ``autoheuristic`` (IMPORTS.md has
        each mapping); ``scope`` adds fields where the source says none (Triton's files say
        nothing of the device). A damaged file raises ``ValueError`` naming it and its line.
        Returns ``{"imported": entries, "files": files read, "notes": [...]}``.

        A format that needs Python (another framework's own code) is an importer registered
        under the ``tunecache.importers`` entry point, found by name: ``warpconvnet`` takes a
        ``benchmark_cache_generic.msgpack`` in through WarpConvNet's registered migrations
        (:func:`tunecache.integrations.warpconvnet.import_file`); ``imported`` is then the
        entries that changed."""
        plugin = _plugin_importer(format)
        if plugin is not None:
            try:
                return plugin(self, os.fspath(path))
            finally:
                self._invalidate()
        try:
            return self._rust.import_from(format, os.fspath(path), scope, namespace)
        finally:
            self._invalidate()
            emit_warnings()

    def export_lines(self) -> str:
        """This scope's entries as JSON lines (``tunecache export``'s format)."""
        return self._rust.export_lines()

    def claim(self, namespace: str, key: Mapping[str, Any], wait: float = 60.0) -> _ext.Claim:
        """Claims ``key`` across processes (see ``Claim``); waits at most ``wait`` seconds."""
        return self._rust.claim(namespace, key, wait)

    def fleet_claim(self, namespace: str, key: Mapping[str, Any], wait: float = 60.0) -> _ext.FleetClaim:
        """Before measuring ``key`` (missing here and on the shared tier): takes its fleet
        lease (``state == "lead"``: measure, record, then ``finish()`` publishes and lets the
        others go on), or waits at most ``wait`` seconds for the process that holds it
        (``"published"``: its entry is in this cache now). ``"alone"``: no coordination
        (no shared tier, server unavailable, the wait ran out): measure here."""
        return self._rust.fleet_claim(namespace, key, wait)

    def fleet_view(
        self, namespace: str, keys: Sequence[Mapping[str, Any]], timeout: float = 10.0
    ) -> list[_ext.Entry | None] | None:
        """The fleet's entries for ``keys``: this cache's own are published first (waiting at
        most ``timeout`` seconds), then the shared tier is read in one round trip; one per key
        (None where the fleet lacks it). None when there is no shared tier or it cannot be
        read within its budget."""
        try:
            return self._rust.fleet_view(namespace, list(keys), timeout)
        finally:
            emit_warnings()

    def sync(self, timeout: float = 10.0) -> dict[str, Any]:
        """The epoch of ``consistency="fleet"``: every ``@autotune`` on this cache checks the
        keys it has chosen against the fleet's entries (one round trip each) and takes each
        changed winner. Call it where every process of a job is at the same point (after a
        step's barrier). Returns ``{"keys": n, "changed": n, "error": str | None}``; on an
        error the choices are kept."""
        report: dict[str, Any] = {"keys": 0, "changed": 0, "error": None}
        if not timeout >= 0 or timeout == float("inf"):
            raise ValueError(f"timeout must be a finite number of seconds >= 0, not {timeout!r}")
        # One bound for the whole sync, not one per @autotune.
        deadline = time.monotonic() + timeout
        for listener in list(self._listeners):
            sync = getattr(listener, "_sync", None)
            if sync is not None:
                sync(max(0.0, deadline - time.monotonic()), report)
        return report

    def refresh(self) -> None:
        """Reads what other processes saved since the last read."""
        try:
            self._rust.refresh()
        finally:
            self._invalidate()
            emit_warnings()

    def flush(self, timeout: float | None = None) -> None:
        """Makes every recorded result durable, waiting at most ``timeout`` seconds; raises
        ``CacheError`` if they are not (they stay in memory and are saved later)."""
        try:
            self._rust.flush(timeout)
        finally:
            emit_warnings()

    def publish(self, timeout: float = 2.0) -> None:
        """Sends what this process recorded to the shared tier (``remote=`` or
        ``TUNECACHE_REMOTE``), waiting at most ``timeout`` seconds; raises ``CacheError`` if it
        could not (the results stay queued and local files are unaffected)."""
        try:
            self._rust.publish(timeout)
        finally:
            emit_warnings()

    def close(self) -> None:
        """Saves what is pending and closes; later calls raise ``CacheError``."""
        if self._closed:
            return
        self._closed = True
        c, self._c = self._c, None
        _live.discard(self)
        self._invalidate()
        try:
            if c is not None:
                c.close()
        finally:
            emit_warnings()

    # -- state -----------------------------------------------------------------------------

    @property
    def app(self) -> str:
        return self._config["app"]

    @property
    def schema(self) -> int:
        return self._config["schema"]

    @property
    def path(self) -> str | None:
        """The file, or None when the cache is in memory only."""
        p = self._rust.path
        return None if p is None else os.fspath(p)

    @property
    def scope(self) -> dict[str, Any]:
        return self._rust.scope

    @property
    def closed(self) -> bool:
        return self._closed

    def health(self) -> dict[str, Any]:
        """Mode (``persistent``, ``read-only``, ``memory``), path, why it is not persistent,
        the last failed save, quarantined files, pending results, migration, shared tier."""
        return self._rust.health()

    def __len__(self) -> int:
        return len(self._rust)

    def __enter__(self) -> Cache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._closed:
            return f"<tunecache.Cache {self.app} (closed)>"
        return repr(self._rust)

    def __reduce__(self) -> tuple[Callable[..., Cache], tuple[dict[str, Any]]]:
        # By configuration: the receiving process opens the same file.
        return (_from_config, (dict(self._config),))

    # -- process events --------------------------------------------------------------------

    def _before_fork(self) -> None:
        c = self._c
        if c is not None:
            # The child opens the file afresh: save first (bounded), so it sees everything
            # recorded before the fork; then hold the saver so no lock is held across it.
            try:
                c.flush(FORK_FLUSH_TIMEOUT)
            except Exception:  # noqa: BLE001 - a fork must not fail because of a cache
                pass
            c.pause_saves()

    def _after_fork_parent(self) -> None:
        c = self._c
        if c is not None:
            c.resume_saves()

    def _after_fork_child(self) -> None:
        c, self._c = self._c, None
        if c is not None:
            _leftovers.append(c)
        self._invalidate()


# The caches this process unpickled, by configuration: every task a pool sends the same
# pickled cache gets one object per process (one saver, one exit flush), as a module-level
# cache would; one object per task, dropped with the task, left its last results to a saver
# the worker's exit could cut short.
_unpickled: dict[str, Cache] = {}


def _from_config(config: dict[str, Any]) -> Cache:
    key = json.dumps(config, sort_keys=True, default=str)
    cache = _unpickled.get(key)
    if cache is not None and not cache._closed:
        return cache
    cache = Cache.__new__(Cache)
    cache._config = config
    cache._start()
    _unpickled[key] = cache
    return cache


def _before_fork() -> None:
    for cache in list(_live):
        cache._before_fork()


def _after_fork_parent() -> None:
    for cache in list(_live):
        cache._after_fork_parent()


def _after_fork_child() -> None:
    for cache in list(_live):
        cache._after_fork_child()


os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_parent,
    after_in_child=_after_fork_child,
)


def flush_all(timeout: float = EXIT_FLUSH_TIMEOUT, budget: float = EXIT_BUDGET) -> None:
    """Flushes every open cache of this process before it ends: each waits ``timeout`` seconds
    for a lock whose holders make no progress, and while other processes' saves ahead of it
    are landing, up to ``budget`` seconds in all; failures are logged, never raised."""
    # Not inside itself: a SIGTERM that arrives while an exit flush runs on this thread waits
    # for it (see `flush_on_sigterm`) instead of flushing again from the middle of it.
    if getattr(_flushing, "active", False):
        return
    _flushing.active = True
    try:
        for cache in list(_live):
            c = cache._c
            if c is None or cache._closed:
                continue
            try:
                if c.mode() != "persistent":
                    continue
                c.flush(timeout, budget)
            except Exception as e:  # noqa: BLE001 - at exit, report and go on
                log.warning("tunecache: results of %s are not all on disk: %s", cache.app, e)
        emit_warnings()
    finally:
        _flushing.active = False
    pending = _sigterm_pending
    if pending is not None:
        _end_as_sigterm(*pending)


atexit.register(flush_all)

# The process a worker's exit hooks were armed in (see `_arm_in_worker`).
_armed_pid: int | None = None


def _arm_in_worker() -> None:
    """In a process that ``multiprocessing`` started (a ``Process``, a ``Pool`` worker, under
    fork, spawn or forkserver), whose end skips ``atexit`` (``os._exit``) and whose pool
    terminates it with SIGTERM: flush every cache when it ends. A multiprocessing finalizer
    runs at the end of the child's ``_bootstrap``; SIGTERM gets the extension's native flush
    (a handler that wakes a thread of ours, which flushes and then ends the process as SIGTERM
    does), but only while SIGTERM is at its default (a handler someone installed is left
    alone). Once per process; nothing outside such a child."""
    global _armed_pid
    if _armed_pid == os.getpid():
        return
    import sys

    mp = sys.modules.get("multiprocessing")
    if mp is None or mp.parent_process() is None:
        return
    _armed_pid = os.getpid()
    from multiprocessing import util

    util.Finalize(None, flush_all, exitpriority=100)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        # Natively: a Python handler runs only on the main thread between bytecodes, and a
        # pool worker blocked on its task queue when `Pool.terminate` sends SIGTERM may never
        # get there (the worker, and the pool's join, then hang for ever).
        _ext.arm_sigterm_flush(EXIT_FLUSH_TIMEOUT)


_sigterm_lock = threading.Lock()
_sigterm_previous: Any = None
# A SIGTERM received during a flush, acted on when the flush ends.
_sigterm_pending: Any = None
# Whether this thread is inside `flush_all`.
_flushing = threading.local()


def _end_as_sigterm(signum: int, frame: Any) -> None:
    """After the SIGTERM flush: what the handler before ours did, or the default (the process
    ends of SIGTERM)."""
    global _sigterm_pending
    _sigterm_pending = None
    prev = _sigterm_previous
    if callable(prev):
        prev(signum, frame)
    elif prev == signal.SIG_IGN:
        return
    else:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def flush_on_sigterm(timeout: float = EXIT_FLUSH_TIMEOUT) -> None:
    """Installs a SIGTERM handler (from the main thread) that flushes every open cache (each
    within ``timeout`` seconds) and then does what the previous handler did: calls it, or ends
    the process as SIGTERM does by default. Opt-in: a library should not take a signal
    without being asked."""
    global _sigterm_previous
    with _sigterm_lock:
        previous = signal.getsignal(signal.SIGTERM)
        if getattr(previous, "_tunecache", False):
            return
        _sigterm_previous = previous

        def handler(signum: int, frame: Any) -> None:
            global _sigterm_pending
            # A SIGTERM that arrives while a flush runs on this thread (an exit flush, or the
            # first SIGTERM's: a pool terminating its workers can send two) must not flush
            # again from the middle of it, which could wait on itself for ever: it is kept,
            # and acted on when that flush ends.
            if getattr(_flushing, "active", False):
                _sigterm_pending = (signum, frame)
                return
            flush_all(timeout)
            _end_as_sigterm(signum, frame)

        handler._tunecache = True  # type: ignore[attr-defined]
        signal.signal(signal.SIGTERM, handler)
