"""The Python quickstart docs/python.md quotes, runnable: a cache, a tuned operation and a memoized one.

    python python/examples/quickstart.py [CACHE_DIR]

Run it twice: the second run measures nothing and computes nothing.
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

import tunecache


def matmul_naive(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.zeros((a.shape[0], b.shape[1]), dtype=a.dtype)
    for i in range(a.shape[0]):
        out[i] = a[i] @ b
    return out


def matmul_blas(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a @ b


def matmul_einsum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.einsum("ik,kj->ij", a, b)


def main() -> None:
    folder = sys.argv[1] if len(sys.argv) > 1 else os.path.join(tempfile.gettempdir(), "tunecache-quickstart")
    cache = tunecache.Cache(
        "quickstart", schema=1, path=os.path.join(folder, "quickstart.tcache"), scope=tunecache.default_scope()
    )

    # One result recorded by hand, then read back.
    cache.put("notes", {"what": "hello"}, "manual", {"v": 1}, median_ns=1.0)
    print("recorded:", cache.get("notes", {"what": "hello"}).best)

    # A tuned operation: each shape is measured once, then every call is a memoised hit.
    matmul = tunecache.Autotuned(
        cache,
        "matmul",
        {"naive": matmul_naive, "blas": matmul_blas, "einsum": matmul_einsum},
        key=lambda a, b: {"m": a.shape[0], "k": a.shape[1], "n": b.shape[1], "dtype": a.dtype},
        repeat=5,
    )
    rng = np.random.default_rng(0)
    for m in (16, 64):
        a = rng.standard_normal((m, 32), dtype=np.float32)
        b = rng.standard_normal((32, 48), dtype=np.float32)
        for _ in range(3):
            out = matmul(a, b)
        assert np.allclose(out, a @ b, atol=1e-4)
        best = cache.get("matmul", {"m": m, "k": 32, "n": 48, "dtype": "float32"}).best
        print(f"matmul m={m}: {best.algorithm} at {best.median_ns:.0f} ns")
    print("candidates measured in this run:", matmul.measured)

    # A memoized function: outputs keyed by every byte of the inputs.
    calls = []

    @tunecache.memoize(dir=os.path.join(folder, "outputs"), version="1")
    def normalize(x: np.ndarray) -> np.ndarray:
        calls.append(1)
        return (x - x.mean()) / x.std()

    x = np.arange(1000, dtype=np.float64)
    y = normalize(x)
    assert np.allclose(normalize(x), y)
    print("normalize computed", len(calls), "time(s) in this run")
    cache.close()


if __name__ == "__main__":
    main()
