"""The shared tier from Python: a real redis-server on a free loopback port, stopped by pid."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

import pytest

import tunecache


@pytest.fixture
def redis(tmp_path):
    exe = shutil.which("redis-server")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed (CI installs it: apt-get install redis-server)")
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    break
        except OSError:
            pass
        assert time.monotonic() < deadline, "redis-server did not start"
        time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}"
    proc.kill()
    proc.wait()


def test_a_result_recorded_by_one_is_a_remote_hit_for_another(tmp_path, redis):
    scope = {"device": "test"}
    key = {"m": 64}
    a = tunecache.Cache("shared", path=tmp_path / "a.tcache", scope=scope, remote=redis)
    a.put("mm", key, "tiled", {"bm": 64}, median_ns=10.0)
    a.publish(5.0)
    b = tunecache.Cache("shared", path=tmp_path / "b.tcache", scope=scope, remote=redis)
    entry = b.get("mm", key)
    assert entry is not None and entry.best.algorithm == "tiled" and entry.origin == "remote"
    a.close()
    b.close()


def test_an_unreachable_server_never_fails_a_local_call(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens
    c = tunecache.Cache("shared", path=tmp_path / "c.tcache", remote=f"redis://:secret@127.0.0.1:{port}")
    assert c.get("mm", {"m": 1}) is None
    c.put("mm", {"m": 1}, "a", median_ns=1.0)
    with pytest.raises(tunecache.CacheError) as e:
        c.publish(0.5)
    assert "secret" not in str(e.value)
    c.flush()
    c.close()
