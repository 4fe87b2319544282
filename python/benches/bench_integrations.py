"""The framework adapters' hits against each framework's own cache hit, measured in the same
run (reported, not asserted), and the first lookup in a fresh process against 100k entries.

    maturin develop --release -m python/Cargo.toml   # a debug build is several times slower
    PYTHONPATH=target/frameworks/warpconvnet-1.8.2 python python/benches/bench_integrations.py

(needs torch, triton and helion, as the test environment has them; WarpConvNet's cache module
is fetched by the test command into target/frameworks)

- Triton: ``get_file`` + ``json.load`` of ``<fn>.autotune.json`` (what ``check_disk_cache``
  does on a hit): ``FileCacheManager`` against the tunecache manager (temporary file included).
- Inductor: ``LocalAutotuneCache.get`` of a best-config file against ``RemoteAutotuneCache.get``
  with the tunecache backend.
- Helion: reading and parsing a ``<hash>.best_config`` file against ``Backend.get`` + parse.
- WarpConvNet: ``get_namespace(ns).get(key)`` on its own cache against the drop-in.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import timeit


def per_call(fn, number: int = 2000, repeat: int = 7) -> float:
    return statistics.median(timeit.repeat(fn, number=number, repeat=repeat)) / number


def report(name: str, theirs: float, ours: float) -> None:
    print(f"{name:<12} framework {theirs * 1e6:9.2f} us   tunecache {ours * 1e6:9.2f} us   ratio {ours / theirs:5.2f}x")


ROWS = [
    [
        {
            "kwargs": {"BLOCK": b},
            "num_warps": 4,
            "num_ctas": 1,
            "num_stages": 3,
            "maxnreg": None,
            "pre_hook": None,
            "ir_override": None,
        },
        [0.01 * b, 0.009 * b, 0.011 * b],
    ]
    for b in (32, 64, 128, 256)
]


def triton_hit(tmp: str) -> None:
    os.environ["TRITON_CACHE_DIR"] = f"{tmp}/triton"
    os.environ["TUNECACHE_TRITON_PATH"] = f"{tmp}/tc/triton.tcache"
    from triton.runtime.cache import FileCacheManager

    from tunecache.integrations import triton as adapter

    doc = json.dumps({"key": [1024], "configs_timings": ROWS})
    theirs_m, ours_m = FileCacheManager("A" * 52), adapter.CacheManager("B" * 52)
    theirs_m.put(doc, "k.autotune.json", binary=False)
    ours_m.put(doc, "k.autotune.json", binary=False)

    def hit(m):
        with open(m.get_file("k.autotune.json")) as f:
            json.load(f)["configs_timings"]

    report("triton", per_call(lambda: hit(theirs_m)), per_call(lambda: hit(ours_m)))


def inductor_hit(tmp: str) -> None:
    os.environ["TUNECACHE_INDUCTOR_PATH"] = f"{tmp}/tc/inductor.tcache"
    from torch._inductor import remote_cache as rc

    from tunecache.integrations import inductor as adapter

    value = {"XBLOCK": 128, "num_warps": 8, "num_stages": 1, "configs_hash": "c" * 64, "found_by_coordesc": False}
    local = rc.LocalAutotuneCache("local")
    path = f"{tmp}/x.best_config"
    local.put(path, value)
    adapter.install()
    remote = rc.RemoteAutotuneCache("remote")
    remote.put("k", value)
    report("inductor", per_call(lambda: local.get(path)), per_call(lambda: remote.get("k")))


def helion_hit(tmp: str) -> None:
    os.environ["TUNECACHE_HELION_PATH"] = f"{tmp}/tc/helion.tcache"
    from tunecache.integrations import helion as adapter

    record = json.dumps({"config": json.dumps({"block_sizes": [64], "num_warps": 4}), "key": {}}, indent=2)
    path = f"{tmp}/h.best_config"
    with open(path, "w") as f:
        f.write(record)
    backend = adapter.Backend()
    backend.put("h", record)

    def theirs():
        with open(path) as f:
            json.loads(f.read())

    report("helion", per_call(theirs), per_call(lambda: json.loads(backend.get("h"))))


def warpconvnet_hit(tmp: str) -> None:
    try:
        import warpconvnet.utils.benchmark_cache as bc
    except ImportError:
        print("warpconvnet  (not on PYTHONPATH: skipped)")
        return
    from tunecache.integrations import warpconvnet as adapter

    value = [("mask_gemm", {"tile_id": 41}, 0.12), ("explicit_gemm", {}, 0.4)]
    theirs = bc.GenericBenchmarkCache(cache_dir=f"{tmp}/wcn-theirs")
    ours = adapter.BenchmarkCache(f"{tmp}/wcn-ours")
    for c in (theirs, ours):
        for i in range(64):
            c.update_entry("AB_gather_scatter", (i, 64, 128), value)
    key = (7, 64, 128)
    report(
        "warpconvnet",
        per_call(lambda: theirs.get_namespace("AB_gather_scatter").get(key)),
        per_call(lambda: ours.get_namespace("AB_gather_scatter").get(key)),
    )
    theirs._save_on_exit()


KILLED = r"""
import os, signal, sys, time
import warpconvnet.utils.benchmark_cache as bc
if sys.argv[3] == "tunecache":
    from tunecache.integrations import warpconvnet
    warpconvnet.install(sys.argv[1])
else:
    bc._generic_benchmark_cache = bc.GenericBenchmarkCache(sys.argv[1])
for batch in range(2):
    for i in range(25):
        bc.generic_benchmark_update_entry("ns", (int(sys.argv[2]), batch, i), [("mask_gemm", {}, 0.1)])
    time.sleep(1.0)
os.kill(os.getpid(), signal.SIGKILL)
"""


def killed_ranks(tmp: str) -> None:
    """8 processes record 2 batches of 25 results a second apart and are SIGKILLed: how many
    of the 400 results survive, WarpConvNet's own cache against the drop-in."""
    try:
        import warpconvnet.utils.benchmark_cache as bc
    except ImportError:
        return
    from tunecache.integrations import warpconvnet as adapter

    for mode in ("warpconvnet", "tunecache"):
        d = f"{tmp}/killed-{mode}"
        procs = [
            subprocess.Popen([sys.executable, "-c", KILLED, d, str(p), mode], stderr=subprocess.DEVNULL)
            for p in range(8)
        ]
        for p in procs:
            p.wait()
        reader = adapter.BenchmarkCache(d) if mode == "tunecache" else bc.GenericBenchmarkCache(d)
        print(f"killed ranks {mode:<12} {len(reader.get_namespace('ns'))} of 400 results kept")


FIRST = r"""
import json, os, sys, time
t0 = time.perf_counter()
from tunecache.integrations import triton as adapter
t1 = time.perf_counter()
m = adapter.CacheManager(sys.argv[1])
with open(m.get_file("k.autotune.json")) as f:
    assert json.load(f)["configs_timings"]
t2 = time.perf_counter()
print(f"{(t1 - t0) * 1e3:.1f} {(t2 - t1) * 1e3:.1f}")
"""


def first_lookup(tmp: str, n: int = 100_000) -> None:
    import tunecache
    from tunecache.integrations.triton import _scope

    # What Triton writes for one kernel, recorded as the adapter records it (one mapping).
    doc = json.dumps({"key": None, "configs_timings": ROWS})
    for size in (1, n):
        path = f"{tmp}/first-{size}.tcache"
        c = tunecache.Cache("triton", path=path, scope=_scope())
        for i in range(size):
            c._record_triton("triton/k", {"hash": f"H{i}"}, doc, "k.autotune.json")
        c.close()
        env = {**os.environ, "TUNECACHE_TRITON_PATH": path}
        out = subprocess.run(
            [sys.executable, "-c", FIRST, f"H{size // 2}"], env=env, capture_output=True, text=True, check=True
        )
        imp, first = out.stdout.split()
        print(f"first lookup, fresh process, {size:>6} entries: import {imp} ms, open + first hit {first} ms")


def main() -> None:
    tmp = tempfile.mkdtemp()
    triton_hit(tmp)
    inductor_hit(tmp)
    helion_hit(tmp)
    warpconvnet_hit(tmp)
    killed_ranks(tmp)
    first_lookup(tmp)


if __name__ == "__main__":
    main()
