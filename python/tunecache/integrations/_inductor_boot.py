"""Imported by ``tunecache-inductor.pth`` at interpreter start when ``TUNECACHE_INDUCTOR=1`` (the
``.pth`` line imports nothing otherwise). It waits, without importing anything, for
``torch._inductor.remote_cache`` to be imported and then installs the tunecache backend
(:func:`tunecache.integrations.inductor.install`). A failure is one warning, never a failed
interpreter start."""

from __future__ import annotations

import os
import sys

from tunecache.integrations._after_import import AfterImport

_TARGET = "torch._inductor.remote_cache"


def _install(module: object) -> None:
    try:
        from tunecache.integrations import inductor

        inductor.install()
    except Exception as e:  # noqa: BLE001 - never break the interpreter
        import logging

        logging.getLogger("tunecache").warning("tunecache: the Inductor hook was not installed: %s", e)


if os.environ.get("TUNECACHE_INDUCTOR") == "1":
    if _TARGET in sys.modules:
        from tunecache.integrations import inductor as _inductor

        _inductor.install()
    else:
        AfterImport.install(_TARGET, _install)
