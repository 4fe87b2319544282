"""Importing other tools' caches at scale: `tunecache import --from FORMAT` against `tunecache
import` of JSON lines of the same entries, in the same run (reported, not asserted).

    cargo build --release -p cache-cli
    python python/benches/bench_imports.py [target/release/tunecache] [entries]

For each source (a TunableOp result file of N rows, one entry each; a vLLM config directory of
N/100 files of 100 batch sizes each): the source is written, imported into an empty cache
(wall time, peak RSS of the process), exported as JSON lines, and those lines imported into
another empty cache. Peak RSS is also given above a baseline: the same binary importing a
one-row file (the binary, its allocator and the empty cache).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time


def run(*args: str) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of one process."""
    start = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"{args} failed: {proc.stderr.read().decode() if proc.stderr else status}")
    return wall, usage.ru_maxrss * 1024


def size_of(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def tunableop(dir_: str, n: int) -> str:
    path = os.path.join(dir_, "tunableop_results0.csv")
    with open(path, "w") as f:
        f.write("Validator,PT_VERSION,2.15.0\nValidator,CUBLASLT_VERSION,130200\nValidator,CUDA_DEVICE,NVIDIA H200\n")
        for i in range(n):
            m, k = 64 + i % 997, 128 + i // 997
            f.write(f"GemmTunableOp_Half_NT,nt_{m}_{4096}_{k},Gemm_Cublaslt_{i % 211},{0.01 + (i % 89) / 1000:.3f}\n")
    return dir_


def vllm(dir_: str, n: int) -> str:
    for f in range(max(1, n // 100)):
        doc = {
            str(m): {
                "BLOCK_SIZE_M": 16 << (m % 4),
                "BLOCK_SIZE_N": 64,
                "BLOCK_SIZE_K": 128,
                "GROUP_SIZE_M": 1 + m % 16,
                "num_warps": 4,
                "num_stages": 3,
            }
            for m in range(1, 101)
        }
        name = f"E={8 + f % 64},N={256 * (1 + f // 64)},device_name=NVIDIA_H200.json"
        with open(os.path.join(dir_, name), "w") as out:
            json.dump(doc, out, indent=4)
            out.write("\n")
    return dir_


def bench(exe: str, fmt: str, make, n: int, baseline_rss: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "src")
        os.makedirs(src)
        make(src, n)
        source_bytes = size_of(src)
        a, b = os.path.join(tmp, "a.tcache"), os.path.join(tmp, "b.tcache")
        t_from, rss_from = run(exe, "--cache-file", a, "--app", "bench", "import", "--from", fmt, src)
        lines = os.path.join(tmp, "lines.jsonl")
        run(exe, "--cache-file", a, "export", "-o", lines)
        t_lines, rss_lines = run(exe, "--cache-file", b, "--app", "bench", "import", lines)
        entries = sum(1 for _ in open(lines))
        mib = 1 << 20
        print(
            f"{fmt:>10}: {entries} entries, source {source_bytes / mib:.1f} MiB,"
            f" JSON lines {size_of(lines) / mib:.1f} MiB"
        )
        print(
            f"{'':>10}  import --from {fmt}: {t_from:.3f} s, peak RSS {rss_from / mib:.1f} MiB "
            f"({rss_from / source_bytes:.2f}x source; {(rss_from - baseline_rss) / mib:.1f} MiB above baseline = "
            f"{(rss_from - baseline_rss) / source_bytes:.2f}x source)"
        )
        print(
            f"{'':>10}  the cache file it makes: {size_of(a) / mib:.1f} MiB ({size_of(a) / source_bytes:.2f}x source)"
        )
        print(f"{'':>10}  import of JSON lines: {t_lines:.3f} s, peak RSS {rss_lines / mib:.1f} MiB")
        print(f"{'':>10}  time ratio (--from / JSON lines): {t_from / t_lines:.2f}")


def main() -> None:
    exe = sys.argv[1] if len(sys.argv) > 1 else "target/release/tunecache"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000
    with tempfile.TemporaryDirectory() as tmp:
        one = tunableop(tmp, 1)
        _, baseline = run(
            exe, "--cache-file", os.path.join(tmp, "c.tcache"), "--app", "bench", "import", "--from", "tunableop", one
        )
    print(f"baseline (a one-row import): peak RSS {baseline / (1 << 20):.1f} MiB")
    bench(exe, "tunableop", tunableop, n, baseline)
    bench(exe, "vllm", vllm, n, baseline)


if __name__ == "__main__":
    main()
