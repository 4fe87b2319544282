"""Max-autotune through tunecache on a GPU (issue 51's device check, for the GPU issue).

Compiles a small model of a few GEMM shapes with mode="max-autotune" twice, each in a fresh
process with Inductor's cache directory wiped, the tunecache adapter installed: the first
benchmarks and records (Triton templates and ATen), the second must benchmark nothing. Prints
Inductor's counters, tunecache's status and the wall time of each compile, as JSON lines.

    python .dev/inductor_max_autotune_gpu.py [workdir]

Needs torch with CUDA and triton, and the tunecache package (maturin develop) in this env.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, os, time
import torch
from torch._dynamo.utils import counters
from tunecache.integrations import inductor
import tunecache.integrations as ti
inductor.install()
torch.manual_seed(0)
m = torch.nn.Sequential(
    torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024),
    torch.nn.GELU(), torch.nn.Linear(1024, 512),
).cuda().half().eval()
x = torch.randn(256, 1024, device="cuda", dtype=torch.half)
t = time.time()
with torch.no_grad():
    y = torch.compile(m, mode="max-autotune")(x)
    torch.cuda.synchronize()
first_call = time.time() - t
print(json.dumps({
    "first_call_s": round(first_call, 2),
    "autotune": counters["inductor"]["select_algorithm_autotune"],
    "precompile": counters["inductor"]["select_algorithm_precompile"],
    "status": ti.status(),
    "checksum": float(y.float().sum()),
    "device": torch.cuda.get_device_name(),
    "torch": torch.__version__,
}))
"""


def main() -> int:
    work = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="tc-inductor-gpu-")
    results = []
    for run in ("first", "second"):
        inductor_dir = os.path.join(work, "inductor")
        shutil.rmtree(inductor_dir, ignore_errors=True)
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": inductor_dir,
            "TUNECACHE_INDUCTOR_PATH": os.path.join(work, "inductor.tcache"),
            "TUNECACHE_LOG": "info",
        }
        started = time.time()
        out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=1200)
        line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "{}"
        result = {"run": run, "rc": out.returncode, "wall_s": round(time.time() - started, 2), **json.loads(line)}
        if out.returncode != 0:
            result["stderr_tail"] = out.stderr[-2000:]
        print(json.dumps(result), flush=True)
        results.append(result)
    ok = (
        len(results) == 2
        and all(r["rc"] == 0 for r in results)
        and results[0].get("autotune", 0) > 0
        and results[1].get("autotune") == 0
        and results[1].get("precompile") == 0
    )
    print(json.dumps({"ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
