"""Inductor's max-autotune selection through tunecache, with the real torch on the CPU (C++ GEMM
templates and ATen, freezing on, under no_grad): a small model of two GEMM shapes compiled in
separate processes, Inductor's cache directory fresh each time. The first benchmarks and
records; the next benchmarks nothing and computes the same; a changed C++ template is a miss;
without the adapter Inductor benchmarks (so the test can fail); and a fresh cache file with
the shared tier configured benchmarks nothing either."""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest
from conftest import run
from test_remote import redis, redis_server  # noqa: F401 - fixtures

pytest.importorskip("torch")

pytestmark = pytest.mark.torch

MODEL = r"""
import json, os
import torch
import torch._inductor.config as cfg
from torch._dynamo.utils import counters
cfg.freezing = True
if os.environ.get("ADAPTER") == "1":
    from tunecache.integrations import inductor
    inductor.install()
import tunecache.integrations as ti
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32)).eval()
x = torch.randn(16, 64)
with torch.no_grad():
    y = torch.compile(m, mode="max-autotune")(x)
    want = m(x)
print(json.dumps({
    "autotune": counters["inductor"]["select_algorithm_autotune"],
    "precompile": counters["inductor"]["select_algorithm_precompile"],
    "status": ti.status().get("inductor-max-autotune"),
    "y": y.tolist(),
    "close": bool(torch.allclose(y, want, atol=1e-4)),
}))
"""


def compile_once(tmp_path, cache_file: str, adapter: bool = True, **env: str) -> dict:
    inductor_dir = tmp_path / "inductor"
    shutil.rmtree(inductor_dir, ignore_errors=True)
    e = {
        **os.environ,
        "TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS": "CPP,ATEN",
        "TORCHINDUCTOR_CACHE_DIR": str(inductor_dir),
        "TUNECACHE_INDUCTOR_PATH": str(tmp_path / cache_file),
        "ADAPTER": "1" if adapter else "0",
        "TUNECACHE_LOG": "info",
        **env,
    }
    out = run(sys.executable, "-c", MODEL, env=e, timeout=600)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["stderr"] = out.stderr
    assert result["close"], "the compiled model computes what the eager one does"
    return result


def test_a_selection_recorded_once_is_never_benchmarked_again(tmp_path, redis):  # noqa: F811
    remote = {"TUNECACHE_REMOTE": redis}
    first = compile_once(tmp_path, "a.tcache", **remote)
    assert first["autotune"] == 2, first["stderr"]
    assert first["status"] == {"served": 0, "missed": 2, "recorded": 2}
    assert "tunecache: inductor-max-autotune: served 0, missed 2, recorded 2" in first["stderr"]

    # Inductor's cache directory wiped: nothing benchmarked, nothing precompiled, same outputs.
    second = compile_once(tmp_path, "a.tcache", **remote)
    assert (second["autotune"], second["precompile"]) == (0, 0), second["stderr"]
    assert second["status"] == {"served": 2, "missed": 0, "recorded": 0}
    assert second["y"] == first["y"]

    # A changed choice (the C++ template's cache blocking): a miss, benchmarked and recorded.
    changed = compile_once(tmp_path, "a.tcache", TORCHINDUCTOR_CPP_GEMM_CACHE_BLOCKING="1,1,1", **remote)
    assert changed["autotune"] == 2, changed["stderr"]
    assert changed["status"] == {"served": 0, "missed": 2, "recorded": 2}

    # Without the adapter, the same compile benchmarks again: what the test would see if
    # tunecache were bypassed.
    off = compile_once(tmp_path, "a.tcache", adapter=False, **remote)
    assert off["autotune"] == 2, off["stderr"]

    # Another machine: a fresh cache file, the shared tier configured.
    other = compile_once(tmp_path, "b.tcache", **remote)
    assert (other["autotune"], other["precompile"]) == (0, 0), other["stderr"]
    assert other["status"] == {"served": 2, "missed": 0, "recorded": 0}
    assert other["y"] == first["y"]


def test_a_selection_benchmarked_without_asking_tunecache_is_said(tmp_path):
    """An installed adapter whose plug point was taken away (preprocessing cleared) says so."""
    code = MODEL.replace(
        "import tunecache.integrations as ti",
        "import tunecache.integrations as ti\n"
        "from torch._inductor import select_algorithm\n"
        "select_algorithm.clear_preprocessing_fns()",
    )
    e = {
        **os.environ,
        "TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS": "CPP,ATEN",
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
        "TUNECACHE_INDUCTOR_PATH": str(tmp_path / "c.tcache"),
        "ADAPTER": "1",
    }
    out = run(sys.executable, "-c", code, env=e, timeout=600)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["autotune"] == 2
    assert "benchmarked 2 max-autotune selection(s) without asking tunecache" in out.stderr, out.stderr
