"""Inductor's max-autotune selection served from tunecache: the choice between GEMM templates
(Triton, C++, CUTLASS) and ATen kernels that ``torch._inductor.select_algorithm.
AlgorithmSelectorCache`` benchmarks, which Inductor keeps only in a local timing file.

Two plug points of ``select_algorithm`` (torch 2.9 and later; tested with 2.15.0):

- ``add_feedback_saver``: after Inductor benchmarks a selection, every choice's timing is
  recorded as an entry of namespace ``inductor/max-autotune`` (one candidate per choice: its
  name as the algorithm, ``{"hash": <choice.hash_key()>, "op": <op>}`` as params, Inductor's
  timing as the median, the policy ``{"timer": "inductor", "device": <device type>}``), in the
  scope of :mod:`tunecache.integrations.inductor` (this machine, torch and Triton versions).
  These are measurements: they reach the shared tier (``TUNECACHE_REMOTE``) like any other.
- ``add_preprocessing_fn``: before Inductor benchmarks, the choices are looked up by key
  ``{"inputs": <Inductor's inputs key>, "layout": <the output layout>, "choices": <a hash of
  every choice's hash_key>}``. A hit whose stored candidates are exactly these choices hands
  Inductor the stored winner alone: Inductor then takes it without precompiling or
  benchmarking anything (and without the epilogue-fusion benchmarks a multi-template choice
  would need). A changed choice list is another key: a miss, and Inductor benchmarks all.

Inductor's counters ``select_algorithm_autotune`` and ``select_algorithm_precompile`` say
whether anything was benchmarked; ``tunecache.integrations.status()["inductor-max-autotune"]``
says what was served, missed and recorded; at exit, a selection Inductor benchmarked without
asking tunecache (its preprocessing functions cleared, say) is said once.
"""

from __future__ import annotations

import hashlib
import math
import sys
from typing import Any

from ._after_import import AfterImport
from ._common import Counts, PlugPointError, require, version_of, warn_once

NAMESPACE = "inductor/max-autotune"
_MODULE = "torch._inductor.select_algorithm"


def _bypassed(counts: Counts) -> str | None:
    from torch._dynamo.utils import counters

    tuned = counters["inductor"]["select_algorithm_autotune"]
    if tuned > counts.missed:
        return (
            f"tunecache: Inductor benchmarked {tuned - counts.missed} max-autotune selection(s) "
            "without asking tunecache (they ran before install(), or Inductor's preprocessing "
            "functions were cleared)"
        )
    return None


counts = Counts("inductor-max-autotune", _bypassed)
_installed = False


_tested = ("unknown", "unknown")


def check(torch_version: str, tested: str) -> None:
    """Raises ``PlugPointError`` unless ``select_algorithm`` has both plug points (once it is
    imported; until then, when it is)."""
    global _tested
    _tested = (torch_version, tested)
    module = sys.modules.get(_MODULE)
    if module is not None and hasattr(module, "AlgorithmSelectorCache"):
        _require(module)


def _require(module: Any) -> None:
    require(
        "torch",
        _tested[0],
        _tested[1],
        module,
        ["add_feedback_saver", "add_preprocessing_fn", "create_inputs_key"],
        _MODULE,
    )


def _select() -> Any:
    return sys.modules[_MODULE]


def _identify(choices: list[Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The selection's key, and its choices by ``hash_key()``."""
    by_hash: dict[str, Any] = {}
    for c in choices:
        by_hash[str(c.hash_key())] = c
    digest = hashlib.sha256("\n".join(sorted(by_hash)).encode("utf-8")).hexdigest()[:32]
    first = choices[0]
    key = {
        "inputs": str(_select().create_inputs_key(first.input_nodes)),
        "layout": str(first.layout),
        "choices": digest,
    }
    return key, by_hash


def _serve(choices: list[Any]) -> list[Any]:
    """Inductor's preprocessing step: the stored winner alone, or the choices as they are."""
    if len(choices) < 2:
        return choices
    from .inductor import store

    try:
        key, by_hash = _identify(choices)
        cache = store.cache()
        entry = None if cache is None else cache.get(NAMESPACE, key)
    except Exception as e:  # noqa: BLE001 - a miss, never a failed compile
        warn_once("inductor select get", f"tunecache: a max-autotune selection cannot be looked up ({e})")
        counts.add("missed")
        return choices
    winner = None if entry is None else _winner(entry, by_hash)
    if winner is None:
        counts.add("missed")
        return choices
    counts.add("served")
    return [winner]


def _winner(entry: Any, by_hash: dict[str, Any]) -> Any:
    """The choice the entry ranks first, if the entry holds exactly these choices."""
    stored = {str(c.params.get("hash")) for c in entry.candidates}
    if stored != set(by_hash):
        return None
    best = entry.best
    if best is None or best.failed is not None:
        return None
    return by_hash.get(str(best.params.get("hash")))


def _record(timings: dict[Any, float], name: str, input_nodes: Any, choices: list[Any], *rest: Any) -> None:
    """Inductor's feedback step: every choice's timing, recorded."""
    if len(choices) < 2:
        return
    from .inductor import store

    try:
        cache = store.cache()
        if cache is None:
            return
        key, by_hash = _identify(choices)
        device = getattr(getattr(choices[0].layout, "device", None), "type", "unknown")
        ordered = sorted(by_hash.items())
        ids = [(str(c.name), {"hash": h, "op": str(name)}) for h, c in ordered]
        policy = {"timer": "inductor", "device": str(device)}
        for (algo, params), (_, c) in zip(ids, ordered, strict=True):
            ms = timings.get(c)
            if ms is None:
                continue
            ms = float(ms)
            if math.isfinite(ms) and ms >= 0:
                cache.put(NAMESPACE, key, algo, params, median_ns=ms * 1e6, samples=1, candidates=ids, policy=policy)
            else:
                cache.put(NAMESPACE, key, algo, params, failed=f"Inductor timed it {ms}", candidates=ids, policy=policy)
        counts.add("recorded")
    except Exception as e:  # noqa: BLE001 - Inductor keeps its local timings
        warn_once("inductor select put", f"tunecache: a max-autotune selection was not recorded ({e})")


def install() -> None:
    """Adds the lookup and the recording to Inductor's algorithm selector (once): now if
    ``select_algorithm`` is imported, else as soon as it is. Importing it here could run in the
    middle of torch's own imports (the ``.pth`` hook installs while ``remote_cache`` loads)."""
    global _installed
    if _installed:
        return
    _installed = True
    module = sys.modules.get(_MODULE)
    if module is not None and hasattr(module, "AlgorithmSelectorCache"):
        _hook(module)
    else:
        AfterImport.install(_MODULE, _hook_safely)


def _hook(module: Any) -> None:
    _require(module)
    module.add_preprocessing_fn(_serve)
    module.add_feedback_saver(_record)


def _hook_safely(module: Any) -> None:
    """:func:`_hook`, said once if it fails: never a failed torch import."""
    try:
        _hook(module)
    except PlugPointError as e:
        warn_once("inductor select plug point", str(e))
    except Exception as e:  # noqa: BLE001 - never break torch's import
        warn_once("inductor select hook", f"tunecache: the max-autotune hook was not installed: {e}")


def installed() -> bool:
    return _installed


__all__ = ["NAMESPACE", "counts", "install", "installed", "version_of"]
