"""Other tools' caches brought in: Triton's own files serve the Triton adapter, shipped vLLM
configs become a system tier that a measurement here overrides, and a damaged file is refused
whole with its name and line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import python, run

FIXTURES = Path(__file__).resolve().parents[2] / "cache-import" / "tests" / "fixtures"


def test_tritons_own_files_imported_serve_the_adapter_without_a_benchmark_call(tmp_path):
    pytest.importorskip("triton")
    from test_integration_triton import tune

    plain = tune(tmp_path, TRITON_CACHE_MANAGER=None)
    assert plain["calls"] == 6
    import tunecache
    from tunecache.integrations.triton import _scope

    cache = tunecache.Cache("triton", path=tmp_path / "tc" / "triton.tcache", scope=_scope())
    done = cache.import_from("triton", tmp_path / "triton", scope=_scope())
    assert (done["imported"], done["files"]) == (2, 2), done
    again = cache.import_from("triton", tmp_path / "triton", scope=_scope())
    assert again["imported"] == 2
    cache.close()
    # Triton's own directory gone: only the imported entries can spare the benchmark.
    shutil.rmtree(tmp_path / "triton")
    adopted = tune(tmp_path)
    assert adopted["calls"] == 0, adopted
    assert adopted["launched"] == plain["launched"]


def test_shipped_vllm_configs_as_a_system_tier_answer_until_measured_here(tmp_path, cli):
    shipped = tmp_path / "shipped.tcache"
    run(cli, "--cache-file", str(shipped), "--app", "vllm", "import", "--from", "vllm", str(FIXTURES / "real" / "vllm"))
    bundle = tmp_path / "vllm.tcb"
    run(cli, "--cache-file", str(shipped), "bundle", "create", "-o", str(bundle))
    code = r"""
import json, sys, tunecache
c = tunecache.Cache("vllm", path=sys.argv[1], scope={"device_name": "NVIDIA_H200"})
key = {"E": 8, "N": 14336, "M": 64}
shipped = c.get("vllm/fused_moe", key).best
out = {"shipped": [shipped.chosen_by, shipped.params, shipped.median_ns]}
mine = dict(shipped.params, num_warps=8)
c.put("vllm/fused_moe", key, "@config", mine, median_ns=1000.0, samples=5)
best = c.get("vllm/fused_moe", key).best
out["measured"] = [best.chosen_by, best.params, best.median_ns]
print(json.dumps(out))
"""
    text = (FIXTURES / "real" / "vllm" / "E=8,N=14336,device_name=NVIDIA_H200.json").read_text()
    expected = json.loads(text)["64"]
    out = json.loads(python(code, str(tmp_path / "user.tcache"), env={"TUNECACHE_SYSTEM_PATH": str(bundle)}).stdout)
    assert out["shipped"] == ["vllm config", expected, None]
    assert out["measured"] == [None, dict(expected, num_warps=8), 1000.0]
    # The user's own file holds the measurement and nothing of the shipped tier.
    listed = run(cli, "--cache-file", str(tmp_path / "user.tcache"), "list").stdout
    assert listed.count("vllm/fused_moe") == 1 and "chosen" not in listed, listed


def test_a_damaged_file_is_refused_whole_naming_file_and_line(tmp_path):
    import tunecache

    src = tmp_path / "configs"
    shutil.copytree(FIXTURES / "real" / "vllm", src)
    bad = src / "E=8,N=14336,device_name=NVIDIA_H200.json"
    bad.write_text(bad.read_text().replace('"num_warps": 4,', '"num_warps": 4', 1))
    cache = tunecache.Cache("vllm", path=tmp_path / "c.tcache", scope={})
    with pytest.raises(ValueError, match=r"E=8,N=14336,device_name=NVIDIA_H200\.json:\d+: .*nothing was imported"):
        cache.import_from("vllm", src)
    assert cache.entries() == []
    with pytest.raises(ValueError, match="not a format"):
        cache.import_from("parquet", src)
