"""Helion: autotuned best configs kept in tunecache through Helion's remote cache backend.

Switch it on with ``HELION_REMOTE_CACHE_BACKEND=tunecache.integrations.helion.Backend`` and
``HELION_AUTOTUNE_CACHE=RemoteAutotuneCache`` (or ``StrictRemoteAutotuneCache``). Tested with
Helion 1.5.1.

Helion hands the backend its cache key's stable hash and the JSON text of its best-config record
(the config, the key's fields: hardware, specialization, source hash, ...). The backend keeps it
in namespace ``helion``, key ``{"hash": <stable hash>}``, as a recorded value; scope: this machine
(:func:`tunecache.default_scope`) and the Helion version. ``list()`` gives the records newest first,
which Helion's autotuner uses to warm-start a search on a similar kernel. A record that is not a
JSON object with a ``config`` is a miss with one warning (Helion would raise on it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import helion
from helion.autotuner import remote_cache as _remote

from ._common import Counts, Store, require, version_of, warn_once

TESTED = "1.5.1"
NAMESPACE = "helion"

require(
    "helion",
    version_of(helion),
    TESTED,
    _remote,
    ["RemoteCacheBackend", "RemoteAutotuneCache", "_load_remote_backend"],
    "helion.autotuner.remote_cache",
)
require(
    "helion",
    version_of(helion),
    TESTED,
    _remote.RemoteCacheBackend,
    ["get", "put", "list"],
    "helion.autotuner.remote_cache.RemoteCacheBackend",
)


def _scope() -> dict[str, Any]:
    from .._scope import default_scope

    return default_scope({"helion": version_of(helion)})


store = Store("helion", _scope)


def _usable(text: str) -> bool:
    try:
        record = json.loads(text)
    except ValueError:
        return False
    if not isinstance(record, dict):
        return False
    config = record.get("config")  # Config.to_json(): JSON text of an object
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError:
            return False
    return isinstance(config, dict)


#: What the backend served, missed and recorded in this process.
counts = Counts("helion")


class Backend(_remote.RemoteCacheBackend):
    """Helion's ``RemoteCacheBackend`` on a tunecache file."""

    def get(self, key: str) -> str | None:
        try:
            text = store.get_value(NAMESPACE, {"hash": str(key)})
        except Exception as e:  # noqa: BLE001 - a miss, never a failed kernel
            warn_once("helion get", f"tunecache: a Helion entry cannot be read ({e}); Helion tunes again")
            counts.add("missed")
            return None
        if text is not None and not _usable(text):
            warn_once(
                "helion bad",
                f"tunecache: the Helion entry {key} is not a best-config record; Helion tunes again",
            )
            text = None
        counts.add("missed" if text is None else "served")
        return text

    def put(self, key: str, data: str) -> None:
        if not _usable(data):
            warn_once("helion put value", f"tunecache: Helion's record for {key} is not a best-config record; not kept")
            return
        try:
            store.put_value(NAMESPACE, {"hash": str(key)}, data)
            counts.add("recorded")
        except Exception as e:  # noqa: BLE001 - Helion keeps its local file
            warn_once("helion put", f"tunecache: a Helion result was not recorded ({e})")

    def list(self, max_results: int | None = None) -> Iterable[str]:
        try:
            texts = [t for _, t in store.values(NAMESPACE) if _usable(t)]
        except Exception as e:  # noqa: BLE001 - warm start is optional
            warn_once("helion list", f"tunecache: Helion entries cannot be listed ({e})")
            return []
        return texts if max_results is None else texts[: max(0, max_results)]
