"""A hook run once a module has executed, installed without importing it: what the ``.pth``
boot (``_inductor_boot``) and the max-autotune hook (``_inductor_select``) both need. Standard
library only, so the ``.pth`` can load it at interpreter start."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from typing import Any


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then(module)`` right after the module ``name`` executes, then leaves
    ``sys.meta_path``. ``then`` must not raise: a hook never breaks the import it follows."""

    def __init__(self, name: str, then: Callable[[Any], None]) -> None:
        self._name = name
        self._then = then

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != self._name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module
        then = self._then

        def exec_module(module: Any) -> None:
            run(module)
            then(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec

    @classmethod
    def install(cls, name: str, then: Callable[[Any], None]) -> None:
        """Waits, first in ``sys.meta_path``, for ``name`` to be imported."""
        sys.meta_path.insert(0, cls(name, then))
