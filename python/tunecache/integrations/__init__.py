"""Drop-in adapters: tunecache behind the plug points of the frameworks users already tune in.

- :mod:`tunecache.integrations.triton`: ``TRITON_CACHE_MANAGER=tunecache.integrations.triton:CacheManager``
  keeps ``@triton.autotune(cache_results=True)`` results in tunecache.
- :mod:`tunecache.integrations.inductor`: ``install()`` (or the opt-in ``.pth`` hook) serves
  and records max-autotune's template selections through tunecache, and backs Inductor's remote
  autotune cache with it.
- :mod:`tunecache.integrations.helion`:
  ``HELION_REMOTE_CACHE_BACKEND=tunecache.integrations.helion.Backend``.
- :mod:`tunecache.integrations.warpconvnet`: ``install()`` replaces WarpConvNet's benchmark
  cache; ``import_file()`` takes its ``benchmark_cache_generic.msgpack`` files in.

Each adapter checks the plug point it fills when it is imported or installed and raises
:class:`PlugPointError` (naming the framework's version and the versions it was tested with)
when the framework changed it. Once installed, an adapter never fails the framework's call: a
cache that cannot be used, or an entry that cannot be read, is a miss with one warning.

A cache silently not used is the complaint each adapter answers: :func:`status` returns what
each adapter used in this process served, missed and recorded; with ``TUNECACHE_LOG=info`` a
process says it in one line per adapter at exit; and an adapter whose framework tuned without
asking it says so once.
"""

from ._common import PlugPointError, status

__all__ = ["PlugPointError", "status"]
