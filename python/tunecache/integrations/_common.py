"""What the adapters share: the plug-point check, one lazily opened cache per framework, values
kept as recorded JSON text, and warnings said once.

A framework's value that tunecache cannot rank (Inductor's and Helion's best configs) is kept as
one candidate ``value`` whose params hold the JSON text (``{"json": text}``), recorded rather
than measured (median 0, samples 0): the newest such candidate is the value. Recorded values stay
on this machine's files; the shared tier carries measurements only.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

log = logging.getLogger("tunecache")

#: The algorithm name of a recorded (not measured) framework value.
VALUE = "value"


class PlugPointError(RuntimeError):
    """The installed framework no longer has the plug point an adapter fills."""


def version_of(module: Any) -> str:
    """The module's ``__version__``, else its distribution's version, else ``unknown``."""
    version = getattr(module, "__version__", None)
    if version is None:
        from importlib import metadata

        try:
            version = metadata.version(module.__name__.split(".")[0])
        except Exception:  # noqa: BLE001 - only shown in messages and scopes
            version = "unknown"
    return str(version)


def require(
    framework: str,
    version: str,
    tested: str,
    owner: Any,
    names: Iterable[str],
    where: str,
) -> None:
    """Raises :class:`PlugPointError` unless ``owner`` has every attribute in ``names``."""
    missing = [n for n in names if not hasattr(owner, n)]
    if missing:
        raise PlugPointError(
            f"tunecache: {framework} {version} has no {', '.join(missing)} in {where}; "
            f"the adapter was tested with {framework} {tested}. "
            f"Pin a tested version or update tunecache."
        )


_warned: set[str] = set()
_warned_lock = threading.Lock()
_stores: weakref.WeakSet[Store] = weakref.WeakSet()
_fork_hooks: list[Callable[[], None]] = []
_counts: dict[str, Counts] = {}


def after_fork_in_child(hook: Callable[[], None]) -> None:
    """Runs ``hook`` in a forked child (the adapters renew their module locks there: a lock
    another thread held at the fork would never be released in the child)."""
    _fork_hooks.append(hook)


def _renew_locks() -> None:
    global _warned_lock
    _warned_lock = threading.Lock()
    for store in list(_stores):
        store._lock = threading.Lock()
    for counts in list(_counts.values()):
        counts._lock = threading.Lock()
        # What this process did: a forked child starts from nothing, not its parent's counts.
        counts.served = counts.missed = counts.recorded = 0
    for hook in _fork_hooks:
        hook()


os.register_at_fork(after_in_child=_renew_locks)


#: The most conditions remembered: past it, a new condition is logged at debug level only, so
#: the set cannot grow without bound whatever a caller passes.
MAX_CONDITIONS = 256


class Counts:
    """What one adapter did in this process: decisions ``served`` from tunecache (the framework
    tuned nothing for them), ``missed`` (the framework tuned), and ``recorded`` into tunecache.
    ``check`` (optional) says, at exit, what the framework did without asking the adapter."""

    def __init__(self, adapter: str, check: Callable[[Counts], str | None] | None = None) -> None:
        self.adapter = adapter
        self.served = 0
        self.missed = 0
        self.recorded = 0
        self.check = check
        self._lock = threading.Lock()
        _counts[adapter] = self

    def add(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.__dict__[what] += n

    def as_dict(self) -> dict[str, int]:
        with self._lock:
            return {"served": self.served, "missed": self.missed, "recorded": self.recorded}


def status() -> dict[str, dict[str, int]]:
    """Each adapter used in this process: ``{"served": n, "missed": n, "recorded": n}``."""
    return {name: c.as_dict() for name, c in sorted(_counts.items())}


def _logs_info() -> bool:
    """Whether ``TUNECACHE_LOG`` asks for info lines (``info``, ``debug``, ``trace``, as a level
    or a ``target=level`` directive)."""
    text = os.environ.get("TUNECACHE_LOG", "").lower()
    return any(level in text for level in ("info", "debug", "trace"))


def _at_exit() -> None:
    """One line per adapter with ``TUNECACHE_LOG=info``; and, always, one warning per adapter
    whose framework tuned without asking it (a cache silently not used)."""
    import sys

    for name, counts in sorted(_counts.items()):
        try:
            said = counts.check(counts) if counts.check is not None else None
        except Exception:  # noqa: BLE001 - at exit, a check that fails says nothing
            said = None
        if said:
            warn_once(f"{name} bypassed", said)
        if _logs_info():
            c = counts.as_dict()
            sys.stderr.write(
                f"tunecache: {name}: served {c['served']}, missed {c['missed']}, recorded {c['recorded']}\n"
            )


atexit.register(_at_exit)


def warn_once(condition: str, message: str) -> None:
    """Logs ``message`` once per ``condition`` in this process. ``condition`` names what went
    wrong (``"triton put"``), never the details (an error's text, a key): those go in the
    message, so a condition that recurs with new details is still said once."""
    with _warned_lock:
        if condition in _warned:
            return
        if len(_warned) >= MAX_CONDITIONS:
            log.debug("%s", message)
            return
        _warned.add(condition)
    log.warning("%s", message)


class Store:
    """The tunecache file of one framework: ``TUNECACHE_<NAME>_PATH`` or tunecache's default
    location for ``app``, opened on first use with the scope ``scope()`` returns; the shared
    tier from ``TUNECACHE_REMOTE`` as everywhere. A cache that cannot be opened is ``None``
    (said once): the adapter then misses."""

    def __init__(self, app: str, scope: Any) -> None:
        self.app = app
        self._scope = scope
        self._cache: Any = None
        self._lock = threading.Lock()
        self._failed = False
        _stores.add(self)

    def cache(self) -> Any:
        c = self._cache
        if c is not None or self._failed:
            return c
        with self._lock:
            if self._cache is None and not self._failed:
                from .._cache import Cache

                try:
                    path = os.environ.get(f"TUNECACHE_{self.app.upper()}_PATH") or None
                    self._cache = Cache(self.app, scope=self._scope(), path=path)
                except Exception as e:  # noqa: BLE001 - never fail the framework's call
                    self._failed = True
                    warn_once(
                        "open",
                        f"tunecache: the {self.app} cache cannot be used ({e}); "
                        f"{self.app} tunes as it would without tunecache",
                    )
            return self._cache

    def durable(self) -> bool:
        """Whether results recorded now reach a file (the cache is not degraded to memory)."""
        c = self.cache()
        try:
            return c is not None and c.health()["mode"] == "persistent"
        except Exception:  # noqa: BLE001 - health unreadable: not durable
            return False

    def reset(self) -> None:
        """Forgets the open cache (tests; a changed ``TUNECACHE_<NAME>_PATH``)."""
        with self._lock:
            c, self._cache, self._failed = self._cache, None, False
        if c is not None:
            c.close()

    # -- recorded values ---------------------------------------------------------------------

    def get_value(self, namespace: str, key: Mapping[str, Any]) -> str | None:
        """The newest recorded value's JSON text for ``key``, or None."""
        c = self.cache()
        if c is None:
            return None
        entry = c.get(namespace, key)
        return None if entry is None else newest_value(entry)

    def put_value(self, namespace: str, key: Mapping[str, Any], text: str) -> None:
        c = self.cache()
        if c is None:
            return
        c.put(namespace, key, VALUE, {"json": text}, median_ns=0.0, samples=0)

    def values(self, namespace: str) -> list[tuple[int, str]]:
        """Every recorded value of ``namespace`` as ``(recorded_at, text)``, newest first."""
        c = self.cache()
        if c is None:
            return []
        out = []
        for _, entry in c.entries(namespace):
            text = newest_value(entry)
            if text is not None:
                out.append((entry.recorded_at, text))
        out.sort(key=lambda t: t[0], reverse=True)
        return out


def newest_value(entry: Any) -> str | None:
    best: tuple[int, str] | None = None
    for cand in entry.candidates:
        text = cand.params.get("json") if cand.algorithm == VALUE else None
        if isinstance(text, str) and (best is None or cand.measured_at >= best[0]):
            best = (cand.measured_at, text)
    return None if best is None else best[1]


def key_value(value: Any) -> Any:
    """``value`` as a canonical key or params value: floats (refused by the canonical encoding)
    and other leaves become their ``repr``; tuples become arrays; ``None`` stays only as a map
    value (absent)."""
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
        return repr(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [key_value(v) if v is not None else "None" for v in value]
    if isinstance(value, dict):
        return {str(k): key_value(v) for k, v in value.items()}
    return repr(value)
