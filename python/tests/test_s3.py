"""The shared tier on an S3 bucket from Python: `remote="s3://BUCKET/PREFIX"` with the standard
AWS_* variables, against moto's real S3 API server on a free loopback port."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

import tunecache


@pytest.fixture
def moto(monkeypatch):
    """A moto server with the bucket `py-tier`, its endpoint in this process's AWS_* variables:
    the bucket's address and the server's process."""
    try:
        import moto.server  # noqa: F401 - only whether it is there
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("moto is not installed (cargo xtask test installs moto[server])")
        pytest.skip("moto is not installed (pip install 'moto[server]')")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        endpoint = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(urllib.request.Request(f"{endpoint}/py-tier", method="PUT"), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        for name, value in [
            ("AWS_ENDPOINT_URL", endpoint),
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_REGION", "us-east-1"),
        ]:
            monkeypatch.setenv(name, value)
        yield "s3://py-tier/team", proc
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()


@pytest.fixture
def bucket(moto):
    """The address of `moto`'s bucket."""
    return moto[0]


def test_a_result_recorded_by_one_is_a_remote_hit_for_another_through_a_bucket(tmp_path, bucket):
    scope = {"device": "test"}
    key = {"m": 64}
    a = tunecache.Cache("shared", path=tmp_path / "a.tcache", scope=scope, remote=bucket)
    a.put("mm", key, "tiled", {"bm": 64}, median_ns=10.0)
    a.publish(30.0)
    b = tunecache.Cache("shared", path=tmp_path / "b.tcache", scope=scope, remote=bucket)
    entry = b.get("mm", key)
    assert entry is not None and entry.best.algorithm == "tiled" and entry.origin == "remote"
    assert "s3://py-tier/team" in entry.origin_detail
    health = b.health()["remote"]
    assert health is not None and health["hits"] == 1, health
    a.close()
    b.close()


def test_a_process_pinned_to_a_generation_reads_it_first(tmp_path, bucket, cli, monkeypatch):
    """`TUNECACHE_GENERATION` pins a Python cache to a whole-cache generation published with
    `tunecache generation snapshot`: fetched once (into `generations/` beside the cache file, as
    the CLI does) and read as a tier of its own, ahead of newer per-key results in the bucket."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    scope = {"device": "test"}
    a = tunecache.Cache("pinned", path=tmp_path / "a.tcache", scope=scope, remote=bucket)
    a.put("mm", {"m": 1}, "old", median_ns=500.0)
    a.close()
    out = subprocess.run(
        [cli, "--json", "--cache-file", str(tmp_path / "a.tcache"), "generation", "snapshot"],
        capture_output=True,
        text=True,
        env={**os.environ, "TUNECACHE_REMOTE": bucket},
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    generation = json.loads(out.stdout)["published"]
    newer = tunecache.Cache("pinned", path=tmp_path / "n.tcache", scope=scope, remote=bucket)
    newer.put("mm", {"m": 1}, "new", median_ns=100.0)
    newer.publish(30.0)
    newer.close()
    monkeypatch.setenv("TUNECACHE_GENERATION", generation)
    rank = tunecache.Cache("pinned", path=tmp_path / "rank.tcache", scope=scope, remote=bucket)
    assert rank.get("mm", {"m": 1}).best.algorithm == "old"
    assert (tmp_path / "generations" / f"{generation}.tcb").is_file()
    tiers = {t["name"]: t for t in rank.health()["tiers"]}
    assert tiers["generation"]["state"] == "ready", tiers
    rank.close()


def _snapshot(cli, cache_file, bucket):
    out = subprocess.run(
        [cli, "--json", "--cache-file", str(cache_file), "generation", "snapshot"],
        capture_output=True,
        text=True,
        env={**os.environ, "TUNECACHE_REMOTE": bucket},
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["published"]


def test_a_pinned_generation_never_holds_the_constructor_and_a_lookup_waits_at_most_its_budget(
    tmp_path, moto, cli, monkeypatch
):
    """Hardening of generations (issue 50, case 5): the generation was downloaded inside the
    cache's constructor with one 300 s budget and the GIL held, so a frozen bucket held
    `Cache(...)` for 305 s. Now the constructor returns at once, a lookup waits for the
    generation at most the tier's budget (10 s) with the GIL released, then goes on without it."""
    bucket, server = moto
    a = tunecache.Cache("frozen", path=tmp_path / "a.tcache", remote=bucket)
    a.put("mm", {"m": 1}, "old", median_ns=500.0)
    a.close()
    _snapshot(cli, tmp_path / "a.tcache", bucket)
    monkeypatch.setenv("TUNECACHE_GENERATION", "current")
    server.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        rank = tunecache.Cache("frozen", path=tmp_path / "rank" / "c.tcache", remote=bucket)
        opened = time.monotonic() - started
        assert opened < 3.0, f"the constructor waited {opened:.1f} s for the download"
        tiers = {t["name"]: t for t in rank.health()["tiers"]}
        assert tiers["generation"]["state"].startswith("pending"), tiers
        ticks = []
        stop = threading.Event()

        def other_work() -> None:
            while not stop.is_set():
                ticks.append(1)
                time.sleep(0.01)

        worker = threading.Thread(target=other_work)
        worker.start()
        started = time.monotonic()
        found = rank.get("mm", {"m": 1})
        waited = time.monotonic() - started
        stop.set()
        worker.join()
        assert found is None, "nothing served without the generation"
        assert waited < 15.0, f"waited {waited:.1f} s (the budget is 10 s)"
        assert len(ticks) > 50, f"other threads ran while it waited: {len(ticks)} ticks"
    finally:
        server.send_signal(signal.SIGCONT)
    rank.close()
