"""The Inductor and Helion adapters, through the frameworks' own cache objects on the CPU:
Inductor's AutotuneCache (as triton_heuristics calls it: create, save, read_best) with its remote
autotune cache backed by tunecache; Helion's backend loader and its remote get/put/list wrappers
and warm-start parser."""

from __future__ import annotations

import json
import os
import sys

import pytest
from conftest import run

pytest.importorskip("torch")

INDUCTOR = r"""
import hashlib, json, os, sys
mode = sys.argv[1]
if mode == "pth":
    import site
    site.addsitedir(os.environ["TC_SITE"])  # as if the .pth were in this environment's site-packages
else:
    from tunecache.integrations import inductor
    inductor.install()
from torch._inductor.runtime.autotune_cache import AutotuneCache
from torch._inductor.runtime.triton_compat import Config
meta = {"autotune_remote_cache": True, "autotune_local_cache": True, "backend_hash": "b" * 64}
configs = [Config({"XBLOCK": x}, num_warps=w, num_stages=1) for x, w in ((64, 4), (128, 8), (256, 8))]
hits = 0
for i in range(3):
    cache = AutotuneCache.create(meta, os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "ab", f"c{i}kernel.py"), hashlib.sha256(b"%d" % i).hexdigest())
    if mode == "save":
        cache.save(configs[i], 1000)
    else:
        best = cache.read_best(meta, configs)
        hits += best is not None and best.kwargs["XBLOCK"] == configs[i].kwargs["XBLOCK"]
print(json.dumps({"hits": hits}))
"""


def inductor(tmp_path, mode: str, **env) -> dict:
    e = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
        "TUNECACHE_INDUCTOR_PATH": str(tmp_path / "tc" / "inductor.tcache"),
        **env,
    }
    out = run(sys.executable, "-c", INDUCTOR, mode, env=e, timeout=180)
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "stderr": out.stderr}


def test_inductor_best_configs_come_back_with_its_cache_dir_wiped(tmp_path, cli):
    inductor(tmp_path, "save")
    assert (tmp_path / "tc" / "inductor.tcache").exists()
    out = inductor(tmp_path, "read", TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "wiped"))
    assert out["hits"] == 3, out
    listed = run(cli, "--cache-file", str(tmp_path / "tc" / "inductor.tcache"), "list").stdout
    assert listed.count("inductor/autotune") == 3 and '\\"XBLOCK\\": 256' in listed, listed


def test_the_pth_hook_installs_the_backend_in_worker_processes_only_when_asked(tmp_path):
    from tunecache.integrations import inductor as adapter

    site = tmp_path / "site"
    site.mkdir()
    pth = adapter.write_pth(site)
    assert os.path.basename(pth) == "tunecache-inductor.pth"
    code = (
        f"import site; site.addsitedir({str(site)!r}); import sys; "
        "assert 'torch' not in sys.modules; "
        "import torch._inductor.remote_cache as r; "
        "print(getattr(r.RemoteAutotuneCache.backend_override_cls, '__module__', None))"
    )
    on = run(sys.executable, "-c", code, env={**os.environ, "TUNECACHE_INDUCTOR": "1"}).stdout
    off = run(sys.executable, "-c", code, env={k: v for k, v in os.environ.items() if k != "TUNECACHE_INDUCTOR"}).stdout
    assert on.strip() == "tunecache.integrations.inductor" and off.strip() == "None"
    # A worker process of that environment reads what the parent saved, with the hook only.
    inductor(tmp_path, "save")
    wiped = str(tmp_path / "wiped")
    assert (
        inductor(tmp_path, "pth", TORCHINDUCTOR_CACHE_DIR=wiped, TC_SITE=str(site), TUNECACHE_INDUCTOR="1")["hits"] == 3
    )
    assert (
        inductor(tmp_path, "pth", TORCHINDUCTOR_CACHE_DIR=wiped + "2", TC_SITE=str(site), TUNECACHE_INDUCTOR="0")[
            "hits"
        ]
        == 0
    )


def test_the_pth_line_imports_nothing_unless_asked_and_an_earlier_ones_file_is_brought_up_to_date(tmp_path):
    """A hostile review found every interpreter start of the environment importing tunecache
    (~40 ms, and a traceback once tunecache is removed) though only TUNECACHE_INDUCTOR=1 uses it."""
    from tunecache.integrations import inductor as adapter

    site = tmp_path / "site"
    site.mkdir()
    old = site / "tunecache-inductor.pth"
    old.write_bytes(b"import tunecache.integrations._inductor_boot\n")
    assert adapter.write_pth(site) == str(old)
    assert b"TUNECACHE_INDUCTOR" in old.read_bytes(), "the earlier file, ours, brought up to date"
    code = f"import site; site.addsitedir({str(site)!r}); import sys; print('tunecache' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if k != "TUNECACHE_INDUCTOR"}
    assert run(sys.executable, "-c", code, env=env).stdout.strip() == "False"
    assert run(sys.executable, "-c", code, env={**env, "TUNECACHE_INDUCTOR": "1"}).stdout.strip() == "True"


def test_the_pth_file_is_written_whole_and_never_through_a_link_or_over_a_file(tmp_path):
    """Hardening IV ("seen once"): write_pth followed a link at its name and wrote in place."""
    import pytest

    from tunecache.integrations import inductor as adapter

    site = tmp_path / "site"
    site.mkdir()
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("theirs")
    (site / "tunecache-inductor.pth").symlink_to(elsewhere)
    with pytest.raises(FileExistsError, match="left alone"):
        adapter.write_pth(site)
    assert elsewhere.read_text() == "theirs", "the link's target is untouched"
    (site / "tunecache-inductor.pth").unlink()
    (site / "tunecache-inductor.pth").write_text("import something_else\n")
    with pytest.raises(FileExistsError):
        adapter.write_pth(site)
    assert (site / "tunecache-inductor.pth").read_text() == "import something_else\n"
    (site / "tunecache-inductor.pth").unlink()
    first = adapter.write_pth(site)
    assert adapter.write_pth(site) == first, "written again: the same file, kept"
    assert sorted(p.name for p in site.iterdir()) == ["tunecache-inductor.pth"], "no temporary left"


def test_a_damaged_inductor_value_is_a_miss_with_one_warning(tmp_path, caplog):
    from tunecache.integrations import inductor as adapter

    adapter.store.reset()
    os.environ["TUNECACHE_INDUCTOR_PATH"] = str(tmp_path / "i.tcache")
    try:
        backend = adapter.Backend()
        adapter.store.put_value(backend.namespace, {"key": "k"}, "{not json")
        with caplog.at_level("WARNING", logger="tunecache"):
            assert backend.get("k") is None
            assert backend.get("k") is None
        assert sum("not a JSON object" in r.message for r in caplog.records) == 1
        backend.put("k2", b"[1, 2]")  # not an object: not kept
        assert backend.get("k2") is None
        backend.put("k3", b'{"XBLOCK": 8}')
        assert json.loads(backend.get("k3")) == {"XBLOCK": 8}
    finally:
        del os.environ["TUNECACHE_INDUCTOR_PATH"]
        adapter.store.reset()


HELION = r"""
import json, os, sys
from helion.autotuner import remote_cache as rc
from helion.autotuner.local_cache import parse_cache_entry
from helion.runtime.config import Config
backend = rc._load_remote_backend()
assert type(backend).__module__ == "tunecache.integrations.helion", type(backend)
mode = sys.argv[1]
if mode == "put":
    for i, block in enumerate((16, 32, 64)):
        record = {"config": Config(block_sizes=[block], num_warps=4).to_json(),
                  "key": {"type": "LooseAutotuneCacheKey", "fields": {"hardware": "cpu", "specialization_key": "(1,)"}},
                  "flat_config": json.dumps([block, 4])}
        rc._remote_put(backend, f"hash{i}", json.dumps(record, indent=2))
        import time; time.sleep(0.01)
    print(json.dumps({}))
else:
    got = rc._remote_get(backend, "hash1")
    config = Config.from_json(json.loads(got)["config"])  # as RemoteAutotuneCache.get does
    listed = [parse_cache_entry(t) for t in backend.list(max_results=2)]
    print(json.dumps({"block": config.config["block_sizes"], "listed": [e.config.config["block_sizes"] for e in listed],
                      "miss": rc._remote_get(backend, "nope")}))
"""


def helion(tmp_path, mode: str) -> dict:
    pytest.importorskip("helion")
    e = {
        **os.environ,
        "HELION_CACHE_DIR": str(tmp_path / f"helion-{mode}"),
        "HELION_REMOTE_CACHE_BACKEND": "tunecache.integrations.helion.Backend",
        "TUNECACHE_HELION_PATH": str(tmp_path / "tc" / "helion.tcache"),
    }
    out = run(sys.executable, "-c", HELION, mode, env=e, timeout=180)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_helion_hits_with_a_fresh_cache_dir_and_lists_newest_first(tmp_path):
    helion(tmp_path, "put")
    out = helion(tmp_path, "get")
    assert out["block"] == [32]
    assert out["listed"] == [[64], [32]], out
    assert out["miss"] is None


def test_a_damaged_helion_record_is_a_miss_with_one_warning(tmp_path, caplog):
    pytest.importorskip("helion")
    from tunecache.integrations import helion as adapter

    adapter.store.reset()
    os.environ["TUNECACHE_HELION_PATH"] = str(tmp_path / "h.tcache")
    try:
        b = adapter.Backend()
        adapter.store.put_value(adapter.NAMESPACE, {"hash": "h"}, '{"no": "config"}')
        with caplog.at_level("WARNING", logger="tunecache"):
            assert b.get("h") is None and b.get("h") is None
        assert sum("not a best-config record" in r.message for r in caplog.records) == 1
        assert list(b.list()) == []
    finally:
        del os.environ["TUNECACHE_HELION_PATH"]
        adapter.store.reset()
