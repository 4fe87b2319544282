"""Imported by ``tunecache-inductor.pth`` at interpreter start. With ``TUNECACHE_INDUCTOR=1`` it
waits, without importing anything, for ``torch._inductor.remote_cache`` to be imported and then
installs the tunecache backend (:func:`tunecache.integrations.inductor.install`); otherwise it
does nothing. A failure is one warning, never a failed interpreter start."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

_TARGET = "torch._inductor.remote_cache"


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module):
            run(module)
            try:
                from tunecache.integrations import inductor

                inductor.install()
            except Exception as e:  # noqa: BLE001 - never break the interpreter
                import logging

                logging.getLogger("tunecache").warning("tunecache: the Inductor hook was not installed: %s", e)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if os.environ.get("TUNECACHE_INDUCTOR") == "1":
    if _TARGET in sys.modules:
        from tunecache.integrations import inductor as _inductor

        _inductor.install()
    else:
        sys.meta_path.insert(0, _Finder())
