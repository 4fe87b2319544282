"""Tuning from Python: ``@autotune`` and :class:`Autotuned`, in the shape of WarpConvNet's
``make_autotuned_op``.

A call maps its arguments to a key (``key=``), looks the key up, and runs the recorded
winner. On a miss, one thread of one process measures the candidates (samples interleaved
across candidates, so a change in machine load lands on all of them), records each result,
makes them durable, and the others wait for it. A hit is served from a memo on the Python side
(one dict lookup and the call), dropped whenever the cache changes.
"""

from __future__ import annotations

import functools
import logging
import math
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._cache import Cache

log = logging.getLogger("tunecache")


class TuningError(RuntimeError):
    """Tuning could not be done: every candidate failed, or a miss came while measuring is not
    allowed (a CUDA graph being captured, ``torch.compile`` tracing) and no default was
    declared."""


@dataclass(frozen=True, eq=False)
class Candidate:
    """One way to compute the operation: a stable ``name``, the ``fn`` to call with the
    operation's arguments, and its launch ``params`` (part of its identity)."""

    name: str
    fn: Callable[..., Any]
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def identity(self) -> tuple[str, tuple[tuple[str, Any], ...]]:
        return (self.name, _freeze(dict(self.params)))


def _freeze(value: Any) -> Any:
    """A hashable form of a key value (dicts sorted, lists as tuples)."""
    if isinstance(value, Mapping):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def _candidates(spec: Any) -> list[Candidate]:
    if isinstance(spec, Mapping):
        out = [Candidate(name, fn) for name, fn in spec.items()]
    else:
        out = []
        for c in spec:
            if isinstance(c, Candidate):
                out.append(c)
            elif isinstance(c, tuple) and len(c) in (2, 3):
                out.append(Candidate(*c))
            elif callable(c):
                out.append(Candidate(getattr(c, "__name__", repr(c)), c))
            else:
                raise TypeError(f"a candidate is a Candidate, (name, fn[, params]) or a function, not {c!r}")
    if not out:
        raise ValueError("autotune needs at least one candidate")
    seen = set()
    for c in out:
        if c.identity in seen:
            raise ValueError(f"two candidates are named {c.name!r} with the same params")
        seen.add(c.identity)
    return out


def _usable(sample: Any) -> float | None:
    """A timer's sample in nanoseconds, or None if it is no time at all (NaN, infinite,
    negative, not a number): such a sample is dropped, never recorded."""
    try:
        ns = float(sample)
    except (TypeError, ValueError):
        return None
    return ns if math.isfinite(ns) and ns >= 0 else None


def perf_counter_timer(fn: Callable[[], Any]) -> float:
    """Times one call with the monotonic clock, in nanoseconds."""
    start = time.perf_counter_ns()
    fn()
    return float(time.perf_counter_ns() - start)


def cuda_event_timer(fn: Callable[[], Any]) -> float:
    """Times one call with CUDA events on the current stream (torch), in nanoseconds."""
    import torch

    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) * 1e6


def _uses_cuda(args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor) and a.is_cuda:
            return True
    return False


def measuring_forbidden() -> str | None:
    """Why measuring must not happen now (a CUDA graph capture, ``torch.compile`` tracing),
    or None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and getattr(compiler, "is_compiling", None) and compiler.is_compiling():
        return "torch.compile is tracing"
    try:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return "a CUDA graph is being captured"
    except Exception:  # noqa: BLE001 - no CUDA runtime: nothing is being captured
        pass
    return None


class Autotuned:
    """An operation tuned through a :class:`Cache`; call it like the function it stands for.

    ``key`` maps the call's arguments to a key (a dict of bool, int, str, tuples, dtypes).
    ``timer`` times one call in nanoseconds (default: CUDA events when an argument is a CUDA
    tensor, else the monotonic clock). Each candidate runs ``warmup`` times, then ``repeat``
    timed rounds interleave the candidates. ``default`` names the candidate to use when a
    miss comes while measuring is not allowed. Processes sharing the cache file wait at most
    ``wait`` seconds for the one tuning a key.
    """

    def __init__(
        self,
        cache: Cache,
        namespace: str,
        candidates: Any,
        key: Callable[..., Mapping[str, Any]],
        *,
        timer: Callable[[Callable[[], Any]], float] | None = None,
        warmup: int = 1,
        repeat: int = 7,
        default: str | None = None,
        wait: float = 60.0,
        flush_timeout: float = 10.0,
    ) -> None:
        self.cache = cache
        self.namespace = namespace
        self.candidates = _candidates(candidates)
        self.key = key
        self.timer = timer
        self.warmup = max(0, int(warmup))
        self.repeat = max(1, int(repeat))
        self.wait = wait
        self.flush_timeout = flush_timeout
        self._by_identity = {c.identity: c for c in self.candidates}
        self._set = [(c.name, dict(c.params)) for c in self.candidates]
        self.default: Candidate | None = None
        if default is not None:
            named = [c for c in self.candidates if c.name == default]
            if not named:
                raise ValueError(f"default {default!r} is not one of the candidates")
            self.default = named[0]
        self._memo: dict[Any, Candidate] = {}
        #: Under ``consistency="fleet"``: the key of each memoized choice, for ``Cache.sync``.
        self._keys: dict[Any, Mapping[str, Any]] = {}
        #: How many candidate measurements this object made (for tests and reports).
        self.measured = 0
        cache._listen(self)
        self.call = self._make_call()

    def _make_call(self) -> Callable[..., Any]:
        """A plain function doing what calling this object does, without the cost of an
        instance call (what ``@autotune`` returns)."""
        keyfn = self.key
        miss = self._miss

        def call(*args: Any, **kwargs: Any) -> Any:
            key = keyfn(*args, **kwargs)
            try:
                memo_key: Any = tuple(key.items())
                hit = self._memo.get(memo_key)
            except TypeError:
                memo_key = _freeze(key)
                hit = self._memo.get(memo_key)
            if hit is not None:
                return hit.fn(*args, **kwargs)
            return miss(key, memo_key, args, kwargs)

        call.tuned = self  # type: ignore[attr-defined]
        return call

    def _invalidate(self) -> None:
        # Under fleet consistency a choice changes only at Cache.sync (the epoch), never
        # because something was recorded or read meanwhile.
        if self.cache.consistency != "fleet":
            self._memo = {}

    def _sync(self, timeout: float, report: dict[str, Any]) -> None:
        """``Cache.sync``: the memoized choices checked against the fleet's entries in one
        round trip; the changed ones replace the memo at once."""
        memo = self._memo
        keys = [(mk, self._keys[mk]) for mk in memo if mk in self._keys]
        if not keys:
            return
        view = self.cache.fleet_view(self.namespace, [k for _, k in keys], timeout)
        if view is None:
            report["error"] = report["error"] or "the fleet's entries could not be read"
            return
        report["keys"] += len(keys)
        fresh = dict(memo)
        for (mk, _), entry in zip(keys, view, strict=True):
            best = self._best_of(entry) if entry is not None else None
            if best is not None and best is not memo[mk]:
                fresh[mk] = best
                report["changed"] += 1
        self._memo = fresh

    def _fleet_winner(self, key: Mapping[str, Any], memo_key: Any, best: Candidate) -> Candidate:
        """Under ``consistency="fleet"``, the winner of the fleet's entry for ``key`` (this
        process's results published there first); ``best`` without a fleet to read."""
        if self.cache.consistency != "fleet":
            return best
        self._keys[memo_key] = dict(key)
        view = self.cache.fleet_view(self.namespace, [key], self.flush_timeout)
        fleet = self._best_of(view[0]) if view and view[0] is not None else None
        return fleet if fleet is not None else best

    def _best_of(self, entry: Any) -> Candidate | None:
        """The best current candidate of an entry (stored best first) that did not fail."""
        for c in entry.candidates:
            if c.failed is None:
                found = self._by_identity.get((c.algorithm, _freeze(c.params)))
                if found is not None:
                    return found
        return None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.call(*args, **kwargs)

    def choose(self, *args: Any, **kwargs: Any) -> Candidate:
        """The candidate a call with these arguments runs (tuning it first on a miss)."""
        key = self.key(*args, **kwargs)
        return self._resolve(key, _freeze(key), args, kwargs)

    # -- the slow path ---------------------------------------------------------------------

    def _recorded(self, key: Mapping[str, Any]) -> tuple[Candidate | None, list[Candidate]]:
        """The best recorded candidate of the current set, and the candidates not yet
        recorded for ``key``."""
        entry = self.cache.get(self.namespace, key)
        if entry is None:
            return None, list(self.candidates)
        seen = set()
        best = None
        for c in entry.candidates:
            ident = (c.algorithm, _freeze(c.params))
            # A winner another tool chose (an imported config) is no measurement: it is
            # measured with the missing ones, and serves only while measuring is forbidden.
            if c.chosen_by is None:
                seen.add(ident)
            if best is None and c.failed is None and ident in self._by_identity:
                best = self._by_identity[ident]
        missing = [c for c in self.candidates if c.identity not in seen]
        return best, missing

    def _miss(self, key: Mapping[str, Any], memo_key: Any, args: Any, kwargs: Any) -> Any:
        return self._resolve(key, memo_key, args, kwargs).fn(*args, **kwargs)

    def _resolve(self, key: Mapping[str, Any], memo_key: Any, args: Any, kwargs: Any) -> Candidate:
        best, missing = self._recorded(key)
        if best is not None and not missing:
            best = self._fleet_winner(key, memo_key, best)
            self._memo[memo_key] = best
            return best
        why = measuring_forbidden()
        if why is not None:
            if best is not None:
                return best
            if self.default is not None:
                return self.default
            raise TuningError(
                f"{self.namespace}: no recorded winner for {dict(key)} and {why}; tune this "
                "key before capturing or compiling, or declare default="
            )
        # The key's claim (across processes, or this process's threads when the cache has no
        # file to share it through) makes one caller measure it while the others wait.
        best, missing = self._recorded(key)
        unmeasured: Candidate | None = None
        if missing:
            claim = self.cache.claim(self.namespace, key, self.wait)
            try:
                if claim.state == "held":
                    # Another process may have tuned it while we waited.
                    self.cache.refresh()
                    best, missing = self._recorded(key)
                if missing:
                    best, missing, unmeasured = self._tune_for_fleet(key, best, missing, args, kwargs)
            finally:
                claim.release()
        if best is None and unmeasured is not None:
            # The timer gave nothing usable: run a candidate that works, unmeasured and
            # not remembered, so the next call measures again.
            return unmeasured
        if best is None:
            raise TuningError(
                f"{self.namespace}: every candidate failed for {dict(key)}; see cache.get(...).candidates for why"
            )
        best = self._fleet_winner(key, memo_key, best)
        self._memo[memo_key] = best
        return best

    def _tune_for_fleet(
        self, key: Mapping[str, Any], best: Candidate | None, missing: list[Candidate], args: Any, kwargs: Any
    ) -> tuple[Candidate | None, list[Candidate], Candidate | None]:
        """Measures what is missing for ``key``, once for every process sharing the cache's
        server: takes the key's fleet lease (and publishes before letting it go), or waits
        for the process that holds it and uses what it published."""
        unmeasured: Candidate | None = None
        fleet = self.cache.fleet_claim(self.namespace, key, self.wait)
        try:
            if fleet.state != "alone":
                # The entry the server holds (or another process just published) is here now.
                best, missing = self._recorded(key)
            if missing:
                unmeasured = self._measure(key, missing, args, kwargs)
                try:
                    self.cache.flush(self.flush_timeout)
                except Exception:  # noqa: BLE001 - kept in memory; saved later
                    pass
                best, missing = self._recorded(key)
                if fleet.state == "lead":
                    try:
                        fleet.finish(self.flush_timeout)
                    except Exception:  # noqa: BLE001 - published later by the background thread
                        pass
        finally:
            fleet.release()
        return best, missing, unmeasured

    def _measure(self, key: Mapping[str, Any], todo: list[Candidate], args: Any, kwargs: Any) -> Candidate | None:
        """Measures ``todo`` for ``key`` and records each result. Samples the timer gives as no
        time (NaN, infinite, negative) are dropped; a candidate left with none is recorded as
        failed. If no candidate got a usable sample, the timer is at fault, not them: nothing
        is recorded for them, and the first that ran is returned for this call."""
        timer = self.timer or (cuda_event_timer if _uses_cuda(args, kwargs) else perf_counter_timer)
        samples: dict[Candidate, list[float]] = {c: [] for c in todo}
        spent: dict[Candidate, int] = {c: 0 for c in todo}
        alive = list(todo)
        dropped: list[Any] = []

        def fail(c: Candidate, why: str) -> None:
            alive.remove(c)
            self.cache.put(self.namespace, key, c.name, c.params, failed=why, candidates=self._set)

        for c in list(alive):
            start = time.perf_counter_ns()
            try:
                for _ in range(self.warmup):
                    c.fn(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - a failing candidate is recorded as failed
                fail(c, f"{type(e).__name__}: {e}")
            spent[c] += time.perf_counter_ns() - start
        for round_ in range(self.repeat):
            # Interleave: each round visits every candidate, starting one further along.
            order = alive[round_ % len(alive) :] + alive[: round_ % len(alive)] if alive else []
            for c in order:
                start = time.perf_counter_ns()
                try:
                    raw = timer(functools.partial(c.fn, *args, **kwargs))
                except Exception as e:  # noqa: BLE001 - a candidate that raises is recorded as failed
                    fail(c, f"{type(e).__name__}: {e}")
                else:
                    ns = _usable(raw)
                    if ns is None:
                        dropped.append(raw)
                    else:
                        samples[c].append(ns)
                spent[c] += time.perf_counter_ns() - start
        if dropped:
            log.warning(
                "tunecache: %s %s: the timer gave %d samples that are no time (%s); they were dropped",
                self.namespace,
                dict(key),
                len(dropped),
                ", ".join(sorted({repr(x)[:40] for x in dropped})),
            )
        if alive and not any(samples[c] for c in alive):
            log.warning(
                "tunecache: %s %s: the timer gave no usable sample; nothing was recorded and %s runs unmeasured",
                self.namespace,
                dict(key),
                alive[0].name,
            )
            return alive[0]
        for c in list(alive):
            if not samples[c]:
                fail(c, "the timer gave no usable sample for it (NaN, infinite or negative)")
        policy = self._policy(timer)
        for c in alive:
            self._record(key, c, samples[c], spent[c], policy)
        return None

    def _policy(self, timer: Callable[[Callable[[], Any]], float]) -> dict[str, Any]:
        """How these results were measured (FORMAT.md, "Measurement policy"): the timer, the
        samples and warm-up runs asked for, interleaved."""
        if timer is perf_counter_timer:
            name = "wall"
        elif timer is cuda_event_timer:
            name = "cuda-events"
        else:
            name = f"{getattr(timer, '__module__', '?')}.{getattr(timer, '__qualname__', repr(timer))}"
        return {"timer": name, "samples": self.repeat, "warmup_runs": self.warmup, "interleaved": True}

    def _record(self, key: Mapping[str, Any], c: Candidate, s: list[float], spent: int, policy: dict[str, Any]) -> None:
        median = statistics.median(s)
        mad = statistics.median(abs(x - median) for x in s)
        self.measured += 1
        self.cache.put(
            self.namespace,
            key,
            c.name,
            c.params,
            median_ns=median,
            min_ns=min(s),
            spread_ns=mad,
            samples=len(s),
            tuning_ns=spent,
            candidates=self._set,
            policy=policy,
        )

    def __repr__(self) -> str:
        names = ", ".join(c.name for c in self.candidates)
        return f"<Autotuned {self.namespace} [{names}]>"


def autotune(
    cache: Cache,
    *,
    namespace: str,
    candidates: Any,
    key: Callable[..., Mapping[str, Any]],
    **options: Any,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator form of :class:`Autotuned`. The decorated function is the reference
    implementation: it becomes a candidate named after it unless ``candidates`` already has
    that name. Returns a plain function (cheaper to call than the object) with the
    ``Autotuned`` as its ``tuned`` attribute and its ``choose``."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        cands = _candidates(candidates)
        name = getattr(fn, "__name__", "reference")
        if all(c.name != name for c in cands):
            cands = [Candidate(name, fn)] + cands
        tuned = Autotuned(cache, namespace, cands, key, **options)
        call = functools.wraps(fn)(tuned.call)
        call.tuned = tuned  # type: ignore[attr-defined]
        call.choose = tuned.choose  # type: ignore[attr-defined]
        return call

    return wrap
