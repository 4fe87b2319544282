"""The shared tier on an S3 bucket from Python: `remote="s3://BUCKET/PREFIX"` with the standard
AWS_* variables, against moto's real S3 API server on a free loopback port."""

from __future__ import annotations

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
