"""Python-side benchmarks (reported, not asserted), each against a plain dict lookup measured
in the same run: a hit through @autotune, Cache.get, and memoize's hashing throughput.

    python python/benches/bench.py        # after `maturin develop --release -m python/Cargo.toml`
"""

from __future__ import annotations

import functools
import statistics
import tempfile
import timeit

import numpy as np

import tunecache


def best_of(stmt, number: int, repeat: int = 7) -> float:
    """Median seconds per call over `repeat` runs of `number` calls."""
    runs = timeit.repeat(stmt, number=number, repeat=repeat)
    return statistics.median(runs) / number


def main() -> None:
    tmp = tempfile.mkdtemp()
    cache = tunecache.Cache("bench", path=f"{tmp}/b.tcache")
    key = {"m": 512, "n": 256, "k": 64, "dtype": "float16"}
    cache.put("mm", key, "tiled", {"bm": 64}, median_ns=1000.0)
    table = {(512, 256, 64, "float16"): "tiled"}
    shape = (512, 256, 64, "float16")

    def kernel(m, n, k, dtype):
        return None

    op = tunecache.Autotuned(
        cache,
        "mm",
        {"tiled": kernel, "naive": kernel},
        key=lambda m, n, k, dtype: {"m": m, "n": n, "k": k, "dtype": dtype},
        repeat=3,
    )
    op(512, 256, 64, "float16")

    n = 200_000
    dict_hit = best_of(lambda: table[shape], n)
    dict_and_call = best_of(lambda: kernel(*shape) if table[shape] else None, n)
    keyfn = op.key
    key_alone = best_of(lambda: keyfn(512, 256, 64, "float16"), n)
    autotune_hit = best_of(lambda: op(512, 256, 64, "float16"), n)
    fast = op.call
    decorator_hit = best_of(lambda: fast(512, 256, 64, "float16"), n)
    get_hit = best_of(lambda: cache.get("mm", key), n)
    get_miss = best_of(lambda: cache.get("mm", {"m": 1}), n)

    rows = [
        ("dict lookup (baseline)", dict_hit),
        ("dict lookup + call (baseline)", dict_and_call),
        ("the key function alone (user code)", key_alone),
        ("Autotuned object hit (key fn + memo + call)", autotune_hit),
        ("@autotune function hit (key fn + memo + call)", decorator_hit),
        ("Cache.get hit (key conversion + lookup)", get_hit),
        ("Cache.get miss", get_miss),
    ]
    print(f"{'operation':45} {'time':>10} {'vs dict':>8}")
    for name, t in rows:
        print(f"{name:45} {t * 1e9:8.1f} ns {t / dict_hit:7.1f}x")

    out = tunecache.OutputCache(f"{tmp}/out")
    for size in (4 << 10, 1 << 20, 64 << 20):
        a = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
        mv = memoryview(a)
        reps = max(3, (256 << 20) // size)
        parts = [("tensor", "u8", (size,), mv)]
        t = best_of(functools.partial(tunecache._tunecache.output_key, "f", "1", None, parts), reps, 5)
        copy = best_of(a.copy, reps, 5)
        print(
            f"memoize key of {size:>9} B: {size / t / 2**30:6.2f} GiB/s"
            f"   (numpy copy of the same: {size / copy / 2**30:6.2f} GiB/s)"
        )
    del out
    cache.close()


if __name__ == "__main__":
    main()
