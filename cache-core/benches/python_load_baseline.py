#!/usr/bin/env python3
"""Baseline for the `load_100k` benchmark: the same file read the WarpConvNet way.

WarpConvNet loads its cache with `msgpack.unpackb` and builds `{namespace: {key: value}}`
dicts (warpconvnet/utils/benchmark_cache.py, load_cache). This does the same with a tunecache
file: unpack the envelope, unpack the payload, index every entry by namespace and key
fingerprint. It checks no checksum and recomputes no fingerprint, which tunecache does.

    TUNECACHE_BENCH_WRITE_FILE=/tmp/big100k.tcache cargo bench -p cache-core --bench store
    python3 cache-core/benches/python_load_baseline.py /tmp/big100k.tcache
"""
import statistics
import sys
import time

import msgpack


def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    envelope = msgpack.unpackb(raw, raw=False)
    payload = msgpack.unpackb(envelope[4], raw=False)
    namespaces = {}
    for scope in payload["scopes"]:
        for ns, entries in scope["namespaces"].items():
            table = namespaces.setdefault(ns, {})
            for entry in entries:
                table[entry["fp"]] = entry
    return namespaces


def main():
    path = sys.argv[1]
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    load(path)  # warm the page cache
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        namespaces = load(path)
        times.append(time.perf_counter() - start)
    count = sum(len(t) for t in namespaces.values())
    print(f"python msgpack + dicts: {count} entries, median {statistics.median(times) * 1e3:.1f} ms, "
          f"min {min(times) * 1e3:.1f} ms over {runs} runs (msgpack {msgpack.version})")


if __name__ == "__main__":
    main()
