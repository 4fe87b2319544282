"""The shared tier from Python: a real redis-server on a free loopback port, stopped by pid."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest

import tunecache


@pytest.fixture
def redis_server(tmp_path):
    """A running redis-server: its address and its process (to freeze it)."""
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
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
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
    yield f"redis://127.0.0.1:{port}", proc
    proc.kill()
    proc.wait()


@pytest.fixture
def redis(redis_server):
    return redis_server[0]


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


def test_other_threads_run_while_a_get_waits_on_a_frozen_server(tmp_path, redis_server, monkeypatch):
    url, proc = redis_server
    monkeypatch.setenv("TUNECACHE_REMOTE_TIMEOUT_MS", "1500")
    c = tunecache.Cache("shared", path=tmp_path / "f.tcache", remote=url)
    proc.send_signal(signal.SIGSTOP)
    try:
        span = []

        def miss() -> None:
            started = time.monotonic()
            assert c.get("mm", {"m": 99}) is None
            span.extend([started, time.monotonic()])

        worker = threading.Thread(target=miss)
        ticks = []
        worker.start()
        while worker.is_alive():
            ticks.append(time.monotonic())
            time.sleep(0.001)
        worker.join()
    finally:
        proc.send_signal(signal.SIGCONT)
    started, ended = span
    assert ended - started >= 1.0, f"the read waited out its budget: {ended - started:.2f} s"
    # With the GIL held across the wait, this thread could not have run in the middle of it.
    inside = [t for t in ticks if started + 0.25 < t < ended - 0.25]
    assert len(inside) > 50, f"{len(inside)} ticks of {len(ticks)} while get waited"
    c.close()


def test_autotune_measures_each_key_once_for_every_cache_sharing_the_server(tmp_path, redis):
    """Two caches (two machines' files) tune the same keys at once through one server: the
    fleet lease makes one of them measure each key and the other take its entry."""
    measured = {"a": set(), "b": set()}

    def tuned(name):
        cache = tunecache.Cache("fleet", path=tmp_path / f"{name}.tcache", scope={"device": "test"}, remote=redis)

        def candidate(delay):
            def run(n):
                measured[name].add(n)
                time.sleep(delay)
                return n

            return run

        fn = tunecache.autotune(
            cache,
            namespace="f",
            candidates={"fast": candidate(0.002), "slow": candidate(0.004)},
            key=lambda n: {"n": n},
        )(candidate(0.003))
        return cache, fn

    (ca, fa), (cb, fb) = tuned("a"), tuned("b")
    keys = list(range(1, 9))
    threads = [threading.Thread(target=lambda f=f: [f(n) for n in keys]) for f in (fa, fb)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    origins = {}
    for cache in (ca, cb):
        for _, entry in cache.entries("f"):
            origins.setdefault(entry.key["n"], []).append(entry.origin)
    assert sorted(origins) == keys
    for n, kinds in origins.items():
        assert sorted(kinds) == ["measured", "remote"], f"key {n}: measured by one, taken by the other: {kinds}"
    # A key measured by one cache's candidates ran there for its measurement; the other ran only
    # its winner (once per call), so no key was measured by both.
    winners_a = {entry.key["n"]: entry.best.algorithm for _, entry in ca.entries("f")}
    winners_b = {entry.key["n"]: entry.best.algorithm for _, entry in cb.entries("f")}
    assert winners_a == winners_b


def test_fleet_consistency_runs_the_fleets_winner_and_changes_only_at_sync(tmp_path, redis):
    """``consistency="fleet"``: a process runs the winner of the fleet's entry even for a key it
    measured itself, and a newer fleet winner reaches running processes only at ``sync()``."""
    scope = {"device": "test"}

    def tuned(name, times, remote, consistency="fleet"):
        cache = tunecache.Cache(
            "consistent", path=tmp_path / f"{name}.tcache", scope=scope, remote=remote, consistency=consistency
        )
        fn = tunecache.autotune(
            cache,
            namespace="c",
            candidates={"x": lambda n: "x", "y": lambda n: "y"},
            key=lambda n: {"n": n},
            timer=lambda run: times[run()],
        )(lambda n: "default")
        return cache, fn

    # B measured the key alone earlier (y faster there); A measures it now (x faster).
    offline, f = tuned("b", {"x": 300.0, "y": 50.0}, None, "local")
    assert f(1) == "y"
    offline.close()
    time.sleep(0.02)
    ca, fa = tuned("a", {"x": 100.0, "y": 200.0}, redis)
    assert fa(1) == "x"
    # B's own figures join the fleet's entry, whose winner (A's later figures) B runs.
    cb, fb = tuned("b", {"x": 300.0, "y": 50.0}, redis)
    assert fb(1) == "x"
    # A third machine publishes newer figures in which y wins.
    time.sleep(0.02)
    offline, f = tuned("c", {"x": 300.0, "y": 40.0}, None, "local")
    assert f(1) == "y"
    offline.close()
    cc = tunecache.Cache("consistent", path=tmp_path / "c.tcache", scope=scope, remote=redis)
    view = cc.fleet_view("c", [{"n": 1}])
    assert view is not None and view[0] is not None and view[0].best.algorithm == "y"
    # Recording meanwhile does not move a running process's choice; the sync does, for both.
    ca.put("c", {"n": 2}, "x", median_ns=1.0)
    assert (fa(1), fb(1)) == ("x", "x")
    for cache in (ca, cb):
        assert cache.sync() == {"keys": 1, "changed": 1, "error": None}
    assert (fa(1), fb(1)) == ("y", "y")
    assert ca.sync() == {"keys": 1, "changed": 0, "error": None}
    with pytest.raises(ValueError, match="consistency"):
        tunecache.Cache("consistent", path=tmp_path / "d.tcache", consistency="strong")
    for cache in (ca, cb, cc):
        cache.close()
