"""The Triton adapter, driving Triton's own Autotuner disk-cache path on the CPU: a stand-in
driver names a CUDA target (Triton hashes it into the directory key), the bench function counts
its calls, and the kernel launch after tuning is recorded instead of run (there is no GPU)."""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest
from conftest import run

pytest.importorskip("triton")

SCRIPT = r"""
import json, os, sys
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.runtime import driver

class Driver:
    def get_current_target(self): return GPUTarget("cuda", 90, 32)
    def get_benchmarker(self): raise AssertionError("the test's bench function is used")
    def __getattr__(self, n): raise AttributeError(n)

driver.set_active(Driver())
calls = []
def bench(fn, quantiles):
    calls.append(1)
    return [float(len(calls)), 0.5 * len(calls), 1.5 * len(calls)]

configs = [triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((32, 4), (64, 8), (128, 8))]

@triton.autotune(configs=configs, key=["n"], cache_results=True, do_bench=bench)
@triton.jit
def scale(x, n, BLOCK: tl.constexpr):
    pass

launched = []
scale.fn.run = lambda *a, **k: launched.append(k["BLOCK"])
for n in (1024, 4096):
    scale.run(None, n)
import tunecache.integrations as ti
print(json.dumps({"calls": len(calls), "launched": launched, "status": ti.status().get("triton")}))
"""


def tune(tmp_path, **env) -> dict:
    e = {
        "TRITON_CACHE_DIR": str(tmp_path / "triton"),
        "TUNECACHE_TRITON_PATH": str(tmp_path / "tc" / "triton.tcache"),
        "TRITON_CACHE_MANAGER": "tunecache.integrations.triton:CacheManager",
    }
    e.update(env)
    script = tmp_path / "tune_scale.py"  # Triton reads a @jit function's source from its file
    script.write_text(SCRIPT)
    full = {k: v for k, v in {**os.environ, **e}.items() if v is not None}
    out = run(sys.executable, str(script), env=full, timeout=120)
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "stderr": out.stderr}


def test_a_second_process_makes_no_benchmark_call_even_with_tritons_cache_wiped(tmp_path, cli):
    first = tune(tmp_path)
    assert first["calls"] == 6 and first["launched"] == [32, 32]
    assert first["status"] == {"served": 0, "missed": 2, "recorded": 2}, first
    shutil.rmtree(tmp_path / "triton")
    second = tune(tmp_path)
    assert second["calls"] == 0, second
    assert second["status"] == {"served": 2, "missed": 0, "recorded": 0}, second
    assert second["launched"] == first["launched"]
    # No autotune file went to Triton's own directory.
    assert not list((tmp_path / "triton").rglob("*.autotune.json"))
    text = run(cli, "--cache-file", str(tmp_path / "tc" / "triton.tcache"), "list").stdout
    assert "triton/scale" in text and '"tuning":{"n":1024}' in text and '"tuning":{"n":4096}' in text
    assert "BLOCK=32,num_warps=4" in text and "1.000 ms" in text, text


def test_the_entry_holds_every_config_with_tritons_timings(tmp_path):
    tune(tmp_path)
    import tunecache
    from tunecache.integrations.triton import _scope

    c = tunecache.Cache("triton", path=tmp_path / "tc" / "triton.tcache", read_only=True, scope=_scope())
    entries = c.entries("triton/scale")
    assert len(entries) == 2
    for _, entry in entries:
        cands = entry.candidates
        assert [x.params["kwargs"]["BLOCK"] for x in cands] == [32, 64, 128]
        # The bench's k-th call returns [k, k/2, 3k/2] ms: p50 the median, p20 the minimum,
        # p80 - p20 the spread.
        calls = 1 if entry.key["tuning"]["n"] == 1024 else 4
        for k, x in enumerate(cands, calls):
            assert x.median_ns == pytest.approx(k * 1e6)
            assert x.min_ns == pytest.approx(k * 0.5e6) and x.spread_ns == pytest.approx(k * 1e6)
        assert set(entry.key) == {"hash", "tuning"}


def test_a_file_in_tritons_own_directory_is_taken_in(tmp_path):
    plain = tune(tmp_path, TRITON_CACHE_MANAGER=None)
    assert plain["calls"] == 6
    assert list((tmp_path / "triton").rglob("*.autotune.json"))
    adopted = tune(tmp_path)
    assert adopted["calls"] == 0
    shutil.rmtree(tmp_path / "triton")
    again = tune(tmp_path)
    assert again["calls"] == 0


def test_kernel_files_go_to_tritons_own_manager(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    from tunecache.integrations.triton import CacheManager

    m = CacheManager("K" * 52)
    path = m.put(b"\x7fELF", "k.cubin")
    assert path.startswith(str(tmp_path / "triton")) and m.get_file("k.cubin") == path
    m.put_group("k.json", {"k.cubin": path})
    assert m.get_group("k.json") == {"k.cubin": path}


def test_a_damaged_entry_is_a_miss_with_one_warning_and_triton_tunes(tmp_path):
    tune(tmp_path)
    import tunecache
    from tunecache.integrations.triton import _scope

    c = tunecache.Cache("triton", path=tmp_path / "tc" / "triton.tcache", scope=_scope())
    (_, entry), _ = c.entries("triton/scale")
    c.put("triton/scale", entry.key, "broken", {"json": "{not json"}, median_ns=1.0)
    c.close()
    shutil.rmtree(tmp_path / "triton")
    out = tune(tmp_path)
    assert out["calls"] == 3, out  # that key tuned again; the other one hit
    assert out["stderr"].count("cannot be read") == 1, out["stderr"]


def test_a_config_this_triton_cannot_build_is_a_miss_not_an_exception(tmp_path):
    tune(tmp_path)
    import tunecache
    from tunecache.integrations.triton import _scope

    c = tunecache.Cache("triton", path=tmp_path / "tc" / "triton.tcache", scope=_scope())
    for _, entry in c.entries("triton/scale"):
        c.put(
            "triton/scale",
            entry.key,
            "from a newer Triton",
            {"kwargs": {"BLOCK": 16}, "num_warps": 2, "warp_spec": 1},
            median_ns=10.0,
        )
    c.close()
    shutil.rmtree(tmp_path / "triton")
    out = tune(tmp_path)
    assert out["calls"] == 6 and out["launched"] == [32, 32], out
    assert out["stderr"].count("cannot be read") == 1, out["stderr"]


@pytest.mark.parametrize("where", ["/dev/null/x.tcache", "/proc/self/x.tcache"])
def test_an_unusable_location_keeps_tritons_own_behaviour(tmp_path, where):
    out = tune(tmp_path, TUNECACHE_TRITON_PATH=where)
    assert out["calls"] == 6 and out["launched"] == [32, 32]
    again = tune(tmp_path, TUNECACHE_TRITON_PATH=where)
    assert again["calls"] == 0  # Triton's own files served it


def test_a_changed_plug_point_is_a_clear_error():
    from tunecache.integrations import PlugPointError
    from tunecache.integrations._common import require

    with pytest.raises(PlugPointError, match=r"triton 9\.9 has no get_file in x; .*tested with triton 3\.9\.0"):
        require("triton", "9.9", "3.9.0", object(), ["get_file"], "x")


from test_remote import redis, redis_server  # noqa: E402,F401 - the real redis-server fixtures


def test_results_reach_another_machine_through_the_shared_tier(tmp_path, redis):  # noqa: F811 - the fixture, by name
    first = tune(tmp_path, TUNECACHE_REMOTE=redis)
    assert first["calls"] == 6
    other = tmp_path / "other-machine"
    other.mkdir()
    second = tune(other, TUNECACHE_REMOTE=redis)
    assert second["calls"] == 0, second


FORK_EXIT = r"""
import os, sys
from tunecache.integrations import triton as adapter
mine = adapter._private_dir()
pid = os.fork()
if pid == 0:
    theirs = adapter._private_dir()
    sys.exit(0 if theirs != mine else 3)  # a normal exit: the inherited exit handlers run
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), os.path.isdir(mine))
"""


def test_a_forked_child_that_exits_leaves_the_parents_private_directory(tmp_path):
    out = run(sys.executable, "-c", FORK_EXIT, env={**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "t")})
    assert out.stdout.split() == ["0", "True"], out.stdout


def test_a_child_forked_while_another_thread_holds_the_adapters_locks_never_hangs(tmp_path, monkeypatch):
    import threading

    from tunecache.integrations import _common
    from tunecache.integrations import triton as adapter

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("TUNECACHE_TRITON_PATH", str(tmp_path / "tc" / "triton.tcache"))
    adapter.store.reset()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with adapter.store._lock, adapter._tmp_lock, _common._warned_lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: every lock the other thread held must be usable here
        try:
            adapter.store.cache()
            adapter._private_dir()
            _common.warn_once("fork", "tunecache: forked")
            os._exit(0)
        except BaseException:  # noqa: BLE001 - a forked child reports any failure by its exit code
            os._exit(1)
    release.set()
    t.join()
    import time

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung on a lock another thread held at the fork")
    assert os.waitstatus_to_exitcode(status) == 0
    adapter.store.reset()


def test_a_hit_served_before_is_rendered_again_once_the_entry_changes(tmp_path, monkeypatch):
    """A hit reuses the file it wrote for the same entry, and never serves it once the entry
    holds something newer."""
    monkeypatch.setenv("TUNECACHE_TRITON_PATH", str(tmp_path / "tc" / "triton.tcache"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    from tunecache.integrations import triton as adapter

    adapter.store.reset()
    config = {"kwargs": {"BLOCK": 32}, "num_warps": 4, "num_ctas": 1, "num_stages": 3, "maxnreg": None}
    m = adapter.CacheManager("C" * 52)
    m.put(json.dumps({"key": [1], "configs_timings": [[config, [1.0, 0.9, 1.1]]]}), "k.autotune.json", binary=False)
    first = m.get_file("k.autotune.json")
    assert m.get_file("k.autotune.json") == first, "the same entry: the same file, not written again"
    # A newer measurement of the same config (another run's): served at once, not the old file.
    m.put(json.dumps({"key": [1], "configs_timings": [[config, [0.5, 0.4, 0.6]]]}), "k.autotune.json", binary=False)
    second = m.get_file("k.autotune.json")
    with open(second) as f:
        assert json.load(f)["configs_timings"][0][1] == [0.5, 0.4, 0.6]
    adapter.store.reset()


def test_an_entry_digest_changes_with_what_the_entry_holds(tmp_path):
    """What the Triton adapter's hit reuses its file by: the same while the entry is the same,
    another once it holds a newer result or for another key, None for no entry."""
    import tunecache

    c = tunecache.Cache("digests", path=str(tmp_path / "d.tcache"))
    assert c._entry_digest("ns", {"k": 1}) is None
    c.put("ns", {"k": 1}, "a", median_ns=10.0)
    first = c._entry_digest("ns", {"k": 1})
    assert first is not None and first == c._entry_digest("ns", {"k": 1})
    c.put("ns", {"k": 1}, "a", median_ns=5.0, samples=3)
    assert c._entry_digest("ns", {"k": 1}) != first
    c.put("ns", {"k": 2}, "a", median_ns=5.0, samples=3)
    assert c._entry_digest("ns", {"k": 2}) != c._entry_digest("ns", {"k": 1})
    c.close()


@pytest.mark.parametrize("how", ["replaced", "truncated", "emptied", "a directory"])
def test_a_served_file_changed_behind_the_adapter_is_rendered_again(tmp_path, monkeypatch, how):
    """A hostile review: a hit reused its rendered file while the file existed, whatever it
    had become (another config, cut short, a directory): Triton then read the wrong configs or
    failed. The file must still be the one written, else it is rendered again."""
    monkeypatch.setenv("TUNECACHE_TRITON_PATH", str(tmp_path / "tc" / "triton.tcache"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    from tunecache.integrations import triton as adapter

    adapter.store.reset()
    config = {"kwargs": {"BLOCK": 32}, "num_warps": 4, "num_ctas": 1, "num_stages": 3, "maxnreg": None}
    m = adapter.CacheManager("D" * 52)
    m.put(json.dumps({"key": [1], "configs_timings": [[config, [1.0, 0.9, 1.1]]]}), "k.autotune.json", binary=False)
    served = m.get_file("k.autotune.json")
    if how == "replaced":
        other = dict(config, kwargs={"BLOCK": 999})
        tmp = served + ".x"
        with open(tmp, "w") as f:
            json.dump({"key": [1], "configs_timings": [[other, [0.001, 0.001, 0.001]]]}, f)
        os.replace(tmp, served)
    elif how == "truncated":
        with open(served, "r+") as f:
            f.truncate(20)
    elif how == "emptied":
        open(served, "w").close()
    else:
        os.remove(served)
        os.mkdir(served)
    again = m.get_file("k.autotune.json")
    assert again is not None
    with open(again) as f:
        assert json.load(f)["configs_timings"][0][0]["kwargs"] == {"BLOCK": 32}, how
    if how == "a directory":
        os.rmdir(served)
    adapter.store.reset()


def test_a_forked_child_counts_only_what_it_did():
    """``status()`` is what this process did: a forked child starts from zero."""
    from tunecache.integrations import _common, triton

    triton.counts.add("served", 3)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.write(write, json.dumps(_common.status()["triton"]).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        child = json.loads(f.read())
    os.waitpid(pid, 0)
    assert child == {"served": 0, "missed": 0, "recorded": 0}, child
    assert _common.status()["triton"]["served"] >= 3
