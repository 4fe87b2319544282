"""Output caching from Python: keys over every input, values back as they went in."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import python

import tunecache


def test_arrays_in_arrays_out_and_every_byte_counts(tmp_path):
    calls = []

    @tunecache.memoize(dir=tmp_path / "out")
    def forward(x, scale=1):
        calls.append(1)
        return x * scale

    x = np.arange(1000, dtype=np.float32).reshape(10, 100)
    y = forward(x, scale=2)
    assert np.array_equal(y, x * 2) and y.dtype == np.float32 and y.shape == (10, 100)
    assert np.array_equal(forward(x, scale=2), y) and len(calls) == 1
    x2 = x.copy()
    x2[9, 99] += 1  # the last byte only
    forward(x2, scale=2)
    forward(x.astype(np.float64), scale=2)
    forward(x.reshape(100, 10), scale=2)
    forward(x, scale=3)
    assert len(calls) == 5
    forward(x[:, ::2], scale=2)  # a non-contiguous view is hashed by its values
    assert np.array_equal(forward(np.ascontiguousarray(x[:, ::2]), scale=2), x[:, ::2] * 2)
    assert len(calls) == 6
    y[0, 0] = -1  # a returned array is writable and the cache's copy is not changed
    assert forward(x, scale=2)[0, 0] == 0


def test_other_values_round_trip_by_pickle(tmp_path):
    @tunecache.memoize(dir=tmp_path / "out")
    def many(blob: bytes, n: int, opts: dict):
        return {"len": len(blob) * n, "arr": np.ones(3), "opts": opts}

    first = many(b"abc", 2, {"k": [1, 2]})
    again = many(b"abc", 2, {"k": [1, 2]})
    assert again["len"] == 6 and np.array_equal(again["arr"], np.ones(3)) and again["opts"] == {"k": [1, 2]}
    assert first["len"] == again["len"]
    assert many.stats()["computed"] == 1
    # A u8 array that looks like a stored pickle comes back as itself.
    tricky = np.frombuffer(b"TCPICKLE1\nnot a pickle", dtype=np.uint8).reshape(1, -1)

    @tunecache.memoize(dir=tmp_path / "out2")
    def ident(n):
        return tricky.copy()

    assert np.array_equal(ident(1), tricky) and np.array_equal(ident(1), tricky)


def test_unhashable_arguments_are_refused_with_a_way_out(tmp_path):
    @tunecache.memoize(dir=tmp_path / "out")
    def f(obj):
        return 1

    with pytest.raises(TypeError, match="argument 0 is a object.*key="):
        f(object())

    @tunecache.memoize(dir=tmp_path / "out", key=lambda obj: ("fixed", 1))
    def g(obj):
        return np.zeros(2)

    assert np.array_equal(g(object()), np.zeros(2))


def test_version_and_config_are_part_of_the_key(tmp_path):
    x = np.ones(4, dtype=np.int32)
    keys = {
        tunecache.memoize(dir=tmp_path, name="f", version=v, config=c)(lambda a: a).key(x)
        for v in ("1", "2")
        for c in (None, {"hidden": 64})
    }
    assert len(keys) == 4


def test_batch_mode_computes_only_missing_items(tmp_path):
    seen = []

    @tunecache.memoize(dir=tmp_path / "out", batch=0)
    def embed(batch, scale):
        seen.append(len(batch))
        return batch.astype(np.float64) * scale

    a = np.arange(12, dtype=np.int64).reshape(4, 3)
    assert np.array_equal(embed(a, 2), a * 2.0)
    b = np.concatenate([a[2:], np.full((2, 3), 99, dtype=np.int64)])
    assert np.array_equal(embed(b, 2), b * 2.0)
    assert seen == [4, 2], "the second batch computed only its two new items"
    assert np.array_equal(embed(a[::-1].copy(), 2), a[::-1] * 2.0) and seen == [4, 2]


CHILD = """
import sys, time, numpy as np, tunecache
@tunecache.memoize(dir={dir!r}, name="slow")
def slow(x):
    with open({counter!r}, "a") as f:
        f.write("x\\n")
    time.sleep(0.5)
    return x + 1
print(slow(np.arange(10))[-1])
"""


def test_two_processes_compute_a_key_once(tmp_path):
    counter = tmp_path / "n.txt"
    code = CHILD.format(dir=str(tmp_path / "shared"), counter=str(counter))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert outs == ["10", "10"]
    assert counter.read_text().count("x") == 1
    assert python(code).stdout.strip() == "10"
    assert counter.read_text().count("x") == 1


def test_a_session_cache_is_removed_at_exit(tmp_path):
    out = python(
        "import numpy as np, tunecache\n"
        "f = tunecache.memoize(lambda x: x * 2)\n"
        "f(np.ones(3))\n"
        "print(f.outputs.get().dir)\n",
        env={"TMPDIR": str(tmp_path)},
    )
    assert not os.path.exists(out.stdout.strip())


@pytest.mark.torch
def test_torch_tensors_bf16_included():
    torch = pytest.importorskip("torch")
    t = torch.arange(8, dtype=torch.bfloat16)
    dt, shape, data = tunecache.torch_parts(t)
    assert dt == "bf16" and shape == (8,) and len(data) == 16

    @tunecache.memoize
    def double(x):
        return x * 2

    assert torch.equal(double(t), t * 2)
    assert double.stats()["computed"] == 1
    u = t.clone()
    u[-1] = 100
    double(u)
    assert double.stats()["computed"] == 2
