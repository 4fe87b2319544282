"""The shared tier on an S3 bucket from Python: `remote="s3://BUCKET/PREFIX"` with the standard
AWS_* variables, against moto's real S3 API server on a free loopback port."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

import tunecache


@pytest.fixture
def bucket(monkeypatch):
    """A moto server with the bucket `py-tier`; its endpoint in this process's AWS_* variables."""
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
        yield "s3://py-tier/team"
    finally:
        proc.kill()
        proc.wait()


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
    `tunecache generation snapshot`: fetched once (into XDG_CACHE_HOME here) and read as the
    system tier, ahead of newer per-key results in the bucket."""
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
    assert (tmp_path / "xdg" / "tunecache" / "generations" / f"{generation}.tcb").is_file()
    rank.close()
