"""tunecache: a persistent, versioned, migratable autotune cache and an output cache for
kernel libraries, on a Rust core.

- :class:`Cache`: the results of tuning, per application, scope, namespace and key; safe across
  threads, processes (fork included), crashes and upgrades; readable by the ``tunecache`` CLI
  and by Rust.
- :func:`autotune` / :class:`Autotuned`: pick the fastest candidate per key, measured once.
- :func:`memoize`: cache a function's outputs keyed by every input.

Keys are dicts, converted as FORMAT.md's canonical encoding says, so their fingerprints equal
the Rust ones (:func:`fingerprint`): ``bool`` is distinct from ``int``; integers must fit in a
signed 64-bit integer (else ``OverflowError``); ``str`` as is; tuples and lists are both
arrays; dicts have ``str`` keys and a ``None`` value is left out (an absent field); numpy and
torch dtypes become their names (``"float32"``); floats are refused (``TypeError``): equal-looking
floats may differ in their bits, and a key must hash the same everywhere.
"""

from ._autotune import (
    Autotuned,
    Candidate,
    TuningError,
    autotune,
    cuda_event_timer,
    measuring_forbidden,
    perf_counter_timer,
)
from ._cache import Cache, flush_all, flush_on_sigterm
from ._errors import (
    ForeignFileError,
    LockTimeoutError,
    RefusedEntryError,
    SharedTierUnreachableError,
)
from ._memoize import Memoized, memoize, torch_parts
from ._scope import default_scope
from ._tunecache import (
    CacheError,
    Claim,
    Entry,
    OutputCache,
    __version__,
    candidate_set_fingerprint,
    canonical_key,
    fingerprint,
    scope_fingerprint,
)
from ._tunecache import (
    Candidate as RecordedCandidate,
)

__all__ = [
    "Autotuned",
    "Cache",
    "CacheError",
    "Candidate",
    "Claim",
    "Entry",
    "ForeignFileError",
    "LockTimeoutError",
    "Memoized",
    "OutputCache",
    "RecordedCandidate",
    "RefusedEntryError",
    "SharedTierUnreachableError",
    "TuningError",
    "__version__",
    "autotune",
    "canonical_key",
    "candidate_set_fingerprint",
    "cuda_event_timer",
    "default_scope",
    "fingerprint",
    "flush_all",
    "flush_on_sigterm",
    "measuring_forbidden",
    "memoize",
    "perf_counter_timer",
    "scope_fingerprint",
    "torch_parts",
]
