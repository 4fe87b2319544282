"""The exceptions tunecache raises, so a caller can tell apart what it must decide on.

Every one is a :class:`CacheError` (an ``OSError``); each also derives from the built-in
exception a caller would already catch for its kind.
"""

from __future__ import annotations

from ._tunecache import CacheError


class RefusedEntryError(CacheError, ValueError):
    """An entry no reader could read back (non-finite timings, nesting or size beyond a
    reader's bounds, an invalid namespace name): nothing of it was recorded."""


class ForeignFileError(CacheError):
    """A file or JSON lines of another application, or of a newer schema than this cache's:
    left as they are, nothing taken from them."""


class LockTimeoutError(CacheError, TimeoutError):
    """Another process held the cache's lock (or a save did not finish) for longer than the
    wait: what was recorded is kept in memory and saved later."""


class SharedTierUnreachableError(CacheError, ConnectionError):
    """The shared tier did not answer within its budget (down, frozen, unreachable): the
    local cache still holds every result."""
