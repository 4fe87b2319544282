"""The scope of this machine: what results measured here may be shared across."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any


def default_scope(extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A scope for this machine: the CUDA device through torch when torch is imported and
    sees one (name, compute capability, CUDA and torch versions), else the CPU (model, core
    count, architecture). ``extra`` fields (a library version, a kernel-source hash) are added.
    """
    import platform
    import sys

    scope: dict[str, Any] = {}
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        i = torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(i)
        scope = {
            "backend": "cuda",
            "device": torch.cuda.get_device_name(i),
            "cc": f"{major}.{minor}",
            "cuda": str(torch.version.cuda),
            "torch": str(torch.__version__),
        }
    else:
        model = "unknown cpu"
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                for line in f:
                    if line.startswith("model name") and ":" in line:
                        model = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
        scope = {
            "backend": "cpu",
            "device": model,
            "cores": os.cpu_count() or 1,
            "arch": platform.machine(),
        }
    if extra:
        scope.update(extra)
    return scope
