"""The WarpConvNet adapter against WarpConvNet's own benchmark-cache module (from its sdist):
its own tests run against the drop-in, files its own code writes are imported, and processes
record through the drop-in without losing anything."""

from __future__ import annotations

import math
import os
import sys

import pytest
from conftest import run

pytest.importorskip("torch")
pytest.importorskip("msgpack")


@pytest.fixture
def wcn_env(warpconvnet_src, monkeypatch):
    monkeypatch.syspath_prepend(str(warpconvnet_src))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(warpconvnet_src), os.environ.get("PYTHONPATH", "")])}
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_PROCID", "WARPCONVNET_BENCHMARK_CACHE_DIR_OVERRIDE"):
        env.pop(var, None)
        monkeypatch.delenv(var, raising=False)
    return env


PLUGIN = """
import warpconvnet.utils.benchmark_cache as bc
from tunecache.integrations import warpconvnet
warpconvnet.install.__doc__  # the drop-in, installed before WarpConvNet's tests import the class
bc.GenericBenchmarkCache = warpconvnet.BenchmarkCache
"""


def test_warpconvnets_own_cache_tests_pass_against_the_drop_in(tmp_path, warpconvnet_src, wcn_env):
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "tc_wcn_plugin.py").write_text(PLUGIN)
    env = {**wcn_env, "PYTHONPATH": os.pathsep.join([str(plugin), wcn_env["PYTHONPATH"]])}
    base = tmp_path / "runs"
    tests = warpconvnet_src / "tests" / "utils" / "test_generic_benchmark_cache.py"
    out = run(
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "tc_wcn_plugin",
        "-p",
        "no:cacheprovider",
        f"--basetemp={base}",
        "--rootdir",
        str(tmp_path),
        str(tests),
        env=env,
        timeout=300,
    )
    assert "6 passed" in out.stdout, out.stdout
    # They ran on tunecache files, not WarpConvNet's.
    assert len(list(base.rglob("benchmark_cache_generic.tcache"))) >= 6
    assert not list(base.rglob("benchmark_cache_generic.msgpack"))


WRITE = r"""
import sys, torch
import warpconvnet.utils.benchmark_cache as bc
version = float(sys.argv[2])
bc.WARPCONVNET_BENCHMARK_CACHE_VERSION = version
cache = bc.GenericBenchmarkCache(cache_dir=sys.argv[1])
scc = bc.SpatiallySparseConvConfig(50_000, 40_000, 64, 128, 27, torch.float16, conv_stride=(2, 2, 2))
scc2 = bc.SpatiallySparseConvConfig(500, 400, 32, 32, 27, torch.bfloat16, transposed=True, stride_mode="stride_only")
algo = "production" if version < 9 else "mask_gemm"
cache.update_entry("AB_gather_scatter", scc, [(algo, {"tile_id": 41, "split_k": 1}, 0.123),
                                             ("explicit_gemm", {}, 0.456), ("implicit_gemm", {"mma_tile": 3}, float("inf"))])
cache.update_entry("AB_gather_scatter", scc2, [("production_fwd_as_dgrad" if version < 9 else "mask_gemm_fwd_as_dgrad", {"x": 1}, 1.5e-3)])
cache.update_entry("AB_gather_scatter_fallback", (scc, "filter:abc"), ["explicit_gemm", {}])
cache.update_entry("my_op", (8, 16, "float16"), [{"params": {"block": 64}, "metric": 0.25}, {"params": {"block": 32}, "metric": 0.5}])
cache.update_entry("implicit_gemm", (1, 2, 3), {"mma_tile": 3, "split_k_slices": 8, "ratio": 0.75, "none": None})
cache.save_cache(cache._results, force=True)
cache._save_on_exit()
"""


def write_with_warpconvnet(tmp_path, env, version: float):
    d = tmp_path / f"wcn-{version}"
    run(sys.executable, "-c", WRITE, str(d), str(version), env=env, timeout=120)
    return d / "benchmark_cache_generic.msgpack"


def same(a, b) -> bool:
    """Equal, floats within a rounding of the ms -> ns conversion."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or math.isclose(a, b, rel_tol=1e-12)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def load_both(path, cache_dir, version):
    """WarpConvNet's own view of a file at ``version``, and the drop-in's after importing it."""
    import warpconvnet.utils.benchmark_cache as bc

    from tunecache.integrations import warpconvnet as adapter

    saved = bc.WARPCONVNET_BENCHMARK_CACHE_VERSION
    bc.WARPCONVNET_BENCHMARK_CACHE_VERSION = float(version)
    try:
        theirs = bc.GenericBenchmarkCache.load_cache(_Reader(path))
        ours = adapter.BenchmarkCache(str(cache_dir))
        n = adapter.import_file(str(path), ours._cache)
        return theirs, ours.load_cache(), n, ours
    finally:
        bc.WARPCONVNET_BENCHMARK_CACHE_VERSION = saved


class _Reader:
    """Just enough of a GenericBenchmarkCache for its load_cache (no saver thread)."""

    def __init__(self, path):
        self.cache_file = path
        self._migrated_pending_save = False


@pytest.mark.parametrize("version", [18.0, 8.0])
def test_files_written_by_warpconvnet_import_with_the_same_ranked_lists(tmp_path, wcn_env, version, cli):
    path = write_with_warpconvnet(tmp_path, wcn_env, version)
    target = 18 if version == 18.0 else 9  # WarpConvNet registers 8 -> 9 only
    theirs, ours, n, cache = load_both(path, tmp_path / "tc", target)
    assert n == 5 and set(theirs) == set(ours) == {
        "AB_gather_scatter",
        "AB_gather_scatter_fallback",
        "my_op",
        "implicit_gemm",
    }
    for ns in theirs:
        assert len(theirs[ns]) == len(ours[ns])
        for key, value in theirs[ns].items():
            assert same(ours[ns][key], value), (ns, key, ours[ns][key], value)
    if version == 8.0:
        assert [a for a, _, _ in ours["AB_gather_scatter"][next(iter(ours["AB_gather_scatter"]))]][0] == "mask_gemm"
    # A second import changes nothing.
    from tunecache.integrations import warpconvnet as adapter

    assert adapter.import_file(str(path), cache._cache) == 0
    assert cache._cache.import_from("warpconvnet", path) == {"imported": 0, "files": 1, "notes": []}
    listed = run(cli, "--cache-file", str(cache.cache_file), "list").stdout
    assert "AB_gather_scatter" in listed and "mask_gemm" in listed and '"__t__":"SCC"' in listed, listed


def test_a_v8_file_is_refused_for_a_version_warpconvnet_cannot_migrate_it_to(tmp_path, wcn_env):
    import tunecache
    from tunecache.integrations import _wcn_format as fmt
    from tunecache.integrations import warpconvnet as adapter

    path = write_with_warpconvnet(tmp_path, wcn_env, 8.0)
    c = tunecache.Cache("warpconvnet", schema=18, path=tmp_path / "x.tcache")
    with pytest.raises(fmt.FormatError, match=r"no migration from version 9 toward 18"):
        adapter.import_file(str(path), c)
    newer = write_with_warpconvnet(tmp_path, wcn_env, 19.0)
    with pytest.raises(fmt.FormatError, match=r"version 19 is newer than 18"):
        adapter.import_file(str(newer), c)
    assert len(c) == 0


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda b: b[: len(b) // 2], "not a msgpack document"),
        (lambda b: __import__("msgpack").packb([1, 2]), "no 'namespaces' map"),
        (
            lambda b: __import__("msgpack").packb({"namespaces": {"ns": [[1, 2], [3]]}, "version": 18.0}),
            "item 1 is not a",
        ),
        (
            lambda b: __import__("msgpack").packb(
                {"namespaces": {"ns": [[{"a": 1}, 2], [{1: 2}, 3]]}, "version": 18.0}
            ),
            "item 1: a map key 1",
        ),
    ],
)
def test_a_damaged_file_is_refused_whole_naming_it(tmp_path, wcn_env, damage, message):
    import tunecache
    from tunecache.integrations import _wcn_format as fmt
    from tunecache.integrations import warpconvnet as adapter

    good = write_with_warpconvnet(tmp_path, wcn_env, 18.0).read_bytes()
    bad = tmp_path / "bad.msgpack"
    bad.write_bytes(damage(good))
    c = tunecache.Cache("warpconvnet", schema=18, path=tmp_path / "x.tcache")
    with pytest.raises(fmt.FormatError, match=message) as e:
        adapter.import_file(str(bad), c)
    assert str(bad) in str(e.value)
    assert len(c) == 0


def _triple(algo, params, metric):
    return {"__t__": "T", "d": [algo, params, metric]}


_DEEP: object = 1
for _ in range(30):
    _DEEP = [_DEEP]


@pytest.mark.parametrize(
    "namespace, item, message",
    [
        ("ns", [{"a": 1}, [_triple("algo", {}, 1e303)]], "non-finite"),
        ("ns", [{"a": 1}, [_triple("algo", {"deep": _DEEP}, 1.0)]], "nests"),
        ("ns", [{"a": 1}, [_triple("", {}, 1.0)]], "algorithm must not be empty"),
        ("bad\nns", [{"a": 1}, [_triple("algo", {}, 1.0)]], "namespace"),
    ],
)
def test_a_bad_item_refuses_the_whole_file_naming_it_and_the_item(tmp_path, wcn_env, namespace, item, message):
    """Hardening IV, case 8: the entries before a bad item were kept, and the error did not name
    the file. All or nothing, naming the file and the item."""
    import msgpack

    import tunecache
    from tunecache.integrations import _wcn_format as fmt
    from tunecache.integrations import warpconvnet as adapter

    good = [[{"a": i}, [_triple("algo", {}, 1.0 + i)]] for i in range(100)]
    namespaces = {"ns": good + [item]} if namespace == "ns" else {"ns": good, namespace: [item]}
    path = tmp_path / "bad.msgpack"
    path.write_bytes(msgpack.packb({"namespaces": namespaces, "version": 18.0}))
    c = tunecache.Cache("warpconvnet", schema=18, path=tmp_path / "x.tcache")
    with pytest.raises(fmt.FormatError, match=message) as e:
        adapter.import_file(str(path), c)
    where = "item 100" if namespace == "ns" else "item 0"
    assert str(path) in str(e.value) and where in str(e.value), str(e.value)
    assert len(c) == 0, "nothing was kept"
    with pytest.raises(Exception, match=str(path)):
        c.import_from("warpconvnet", path)
    assert len(c) == 0


def test_special_and_hostile_files_are_refused_without_hanging(tmp_path, wcn_env):
    import msgpack

    import tunecache
    from tunecache.integrations import _wcn_format as fmt
    from tunecache.integrations import warpconvnet as adapter

    c = tunecache.Cache("warpconvnet", schema=18, path=tmp_path / "x.tcache")
    fifo = tmp_path / "fifo.msgpack"
    os.mkfifo(fifo)
    for path, message in [
        (fifo, "not a regular file"),
        ("/dev/zero", "not a regular file"),
        (tmp_path / "missing", "cannot be read"),
        (tmp_path, "not a regular file|cannot be read"),
    ]:
        with pytest.raises(fmt.FormatError, match=message):
            adapter.import_file(str(path), c)
    deep: object = 1
    for _ in range(5000):
        deep = [deep]
    nested = tmp_path / "deep.msgpack"
    try:
        nested.write_bytes(msgpack.packb({"namespaces": {"ns": [[deep, 1]]}, "version": 18.0}))
    except ValueError:  # msgpack's own depth limit
        nested.write_bytes(b"\x91" * 5000 + b"\x01")
    with pytest.raises(fmt.FormatError, match=str(nested)):
        adapter.import_file(str(nested), c)
    assert len(c) == 0


def test_the_command_line_importer(tmp_path, wcn_env):
    path = write_with_warpconvnet(tmp_path, wcn_env, 18.0)
    dest = tmp_path / "cli.tcache"
    out = run(
        sys.executable, "-m", "tunecache.integrations.warpconvnet", str(path), "--cache-file", str(dest), env=wcn_env
    )
    assert "5 entries taken in (version 18)" in out.stdout
    again = run(
        sys.executable, "-m", "tunecache.integrations.warpconvnet", str(path), "--cache-file", str(dest), env=wcn_env
    )
    assert "0 entries taken in" in again.stdout
    bad = tmp_path / "bad.msgpack"
    bad.write_bytes(b"\xc1")
    failed = run(
        sys.executable,
        "-m",
        "tunecache.integrations.warpconvnet",
        str(bad),
        "--cache-file",
        str(dest),
        env=wcn_env,
        check=False,
    )
    assert failed.returncode == 1 and str(bad) in failed.stderr


RECORD = r"""
import os, signal, sys, time
import warpconvnet.utils.benchmark_cache as bc
from tunecache.integrations import warpconvnet
warpconvnet.install(sys.argv[1])
me = int(sys.argv[2])
for batch in range(2):
    for i in range(25):
        bc.generic_benchmark_update_entry("AB_gather_scatter", (me, batch, i), [("mask_gemm", {"tile": i}, 0.1 + me)])
    time.sleep(2.0)  # well past tunecache's save delay (250 ms), on a loaded 2-core machine too
os.kill(os.getpid(), signal.SIGKILL)  # no exit handler runs
"""


def test_eight_processes_recording_through_the_drop_in_and_killed_lose_nothing(tmp_path, wcn_env):
    """WarpConvNet's own cache saves at most once a minute after its first save: killed the
    same way, its processes keep only their first batch (200 of 400; bench_integrations.py)."""
    import signal
    import subprocess

    d = tmp_path / "shared"
    procs = [
        subprocess.Popen([sys.executable, "-c", RECORD, str(d), str(p)], env=wcn_env, stderr=subprocess.PIPE, text=True)
        for p in range(8)
    ]
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == -signal.SIGKILL, err
    from tunecache.integrations import warpconvnet as adapter

    ns = adapter.BenchmarkCache(str(d)).get_namespace("AB_gather_scatter")
    assert len(ns) == 400 and ns[(7, 1, 24)] == [("mask_gemm", {"tile": 24}, pytest.approx(7.1))]


def test_an_existing_warpconvnet_file_is_taken_in_and_a_bad_location_never_raises(tmp_path, wcn_env, caplog):
    from tunecache.integrations import warpconvnet as adapter

    path = write_with_warpconvnet(tmp_path, wcn_env, 18.0)
    ours = adapter.BenchmarkCache(str(path.parent))
    assert ours.get_namespace("implicit_gemm") == {
        (1, 2, 3): {"mma_tile": 3, "split_k_slices": 8, "ratio": 0.75, "none": None}
    }
    assert path.exists()  # WarpConvNet's file is left as it was
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with caplog.at_level("WARNING", logger="tunecache"):
        odd = adapter.BenchmarkCache(str(blocker / "sub"))
        odd.update_entry("ns", (1,), {"p": 1}, force=True)
        assert odd.get_namespace("ns") == {(1,): {"p": 1}}
    assert caplog.records
