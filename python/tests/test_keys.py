"""Key conversion: the fingerprints equal the Rust ones (FORMAT.md's vectors)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import ROOT

import tunecache

VECTORS = json.loads((ROOT / "cache-format" / "tests" / "data" / "fingerprint_vectors.json").read_text())


@pytest.mark.parametrize("vector", VECTORS["keys"], ids=lambda v: v["fingerprint"][:8])
def test_format_vectors(vector):
    assert tunecache.canonical_key(vector["input"]).hex() == vector["canonical"]
    assert tunecache.fingerprint(vector["input"]) == vector["fingerprint"]


def test_scope_and_candidate_set_vectors():
    text = (ROOT / "FORMAT.md").read_text()
    scope = {"device": "NVIDIA H100 80GB HBM3", "cc": "9.0", "sm_count": 132, "driver": "560.35.03"}
    assert tunecache.scope_fingerprint(scope) == "1c851737ad36febf0d9f4edf832700dd"
    assert "1c851737ad36febf0d9f4edf832700dd" in text


def test_bool_is_not_int_and_tuple_is_list():
    assert tunecache.fingerprint({"x": True}) != tunecache.fingerprint({"x": 1})
    assert tunecache.fingerprint({"s": (1, 2)}) == tunecache.fingerprint({"s": [1, 2]})


def test_none_is_absent():
    assert tunecache.fingerprint({"a": 1, "b": None}) == tunecache.fingerprint({"a": 1})


def test_numpy_values_and_dtypes():
    key = {"m": np.int64(128), "dtype": np.dtype("float16"), "flag": np.bool_(True)}
    assert tunecache.fingerprint(key) == tunecache.fingerprint({"m": 128, "dtype": "float16", "flag": True})


def test_refusals_name_the_place():
    with pytest.raises(TypeError, match=r'key\["conv"\]\["scale"\] is a float'):
        tunecache.fingerprint({"conv": {"scale": 0.5}})
    with pytest.raises(OverflowError, match="64-bit"):
        tunecache.fingerprint({"n": 2**63})
    assert tunecache.fingerprint({"n": 2**63 - 1})
    with pytest.raises(OverflowError):
        tunecache.fingerprint({"n": -(2**63) - 1})
    with pytest.raises(TypeError, match="map keys must be str"):
        tunecache.fingerprint({1: 2})
    with pytest.raises(TypeError, match="must be a mapping"):
        tunecache.fingerprint([1, 2])
    with pytest.raises(TypeError, match=r"\[1\] is None"):
        tunecache.fingerprint({"s": [1, None]})
    with pytest.raises(TypeError, match="object"):
        tunecache.fingerprint({"o": object()})


def test_deep_keys_are_refused_not_a_crash():
    deep: object = 1
    for _ in range(100):
        deep = [deep]
    with pytest.raises(ValueError, match="nests more than"):
        tunecache.fingerprint({"d": deep})


def test_cli_prints_the_same_fingerprint(cli, tmp_path):
    from conftest import run

    key = {"m": 512, "n": 256, "dtype": "float32", "shape": [1, 2]}
    f = tmp_path / "c.tcache"
    run(
        cli,
        "put",
        "--cache-file",
        str(f),
        "--app",
        "k",
        "-n",
        "mm",
        "-k",
        json.dumps(key),
        "--algo",
        "a",
        "--median-ns",
        "5",
    )
    line = json.loads(run(cli, "export", "--cache-file", str(f)).stdout)
    assert line["fingerprint"] == tunecache.fingerprint(key)


@pytest.mark.torch
def test_torch_dtypes():
    torch = pytest.importorskip("torch")
    assert tunecache.fingerprint({"dtype": torch.bfloat16}) == tunecache.fingerprint({"dtype": "bfloat16"})
