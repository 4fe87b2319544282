"""What Python users rely on from a process: fork, exit without close, SIGTERM, and other
threads running while a flush waits on another process's lock."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import python, run

import tunecache

KEY = {"m": 1}


def test_parent_and_child_of_a_fork_both_record_and_nothing_deadlocks(tmp_path):
    path = tmp_path / "c.tcache"
    c = tunecache.Cache("fork", path=path, save_delay=0.001)
    c.put("ns", {"who": "before"}, "a", median_ns=1.0)
    stop = threading.Event()

    def busy():
        # Saves keep happening in the parent while it forks.
        i = 0
        while not stop.is_set():
            c.put("ns", {"busy": i % 50}, "a", median_ns=1.0)
            i += 1
            time.sleep(0.0005)

    t = threading.Thread(target=busy)
    t.start()
    children = []
    try:
        for i in range(5):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    signal.alarm(30)
                    assert c.get("ns", {"who": "before"}) is not None
                    c.put("ns", {"who": f"child{i}"}, "b", median_ns=2.0)
                    c.flush(20)
                    c.close()
                    code = 0
                except BaseException:  # noqa: BLE001 - a forked child reports any failure by its exit code
                    import traceback

                    traceback.print_exc()
                finally:
                    os._exit(code)
            children.append(pid)
            c.put("ns", {"who": f"parent{i}"}, "c", median_ns=3.0)
    finally:
        stop.set()
        t.join()
    for pid in children:
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    c.flush(20)
    c.close()
    with tunecache.Cache("fork", path=path) as again:
        for i in range(5):
            assert again.get("ns", {"who": f"child{i}"}).best.algorithm == "b"
            assert again.get("ns", {"who": f"parent{i}"}).best.algorithm == "c"


def test_results_are_on_disk_after_an_exit_without_close(tmp_path):
    path = tmp_path / "c.tcache"
    python(
        "import tunecache\n"
        f"c = tunecache.Cache('exit', path={str(path)!r}, save_delay=600)\n"
        "for i in range(100): c.put('ns', {'i': i}, 'a', median_ns=1.0)\n"
        "# no close(), no flush(): the atexit flush saves them\n"
    )
    with tunecache.Cache("exit", path=path) as c:
        assert len(c) == 100


def test_sigterm_with_the_handler_flushes_then_dies_of_sigterm(tmp_path):
    path = tmp_path / "c.tcache"
    code = (
        "import sys, time, tunecache\n"
        f"c = tunecache.Cache('term', path={str(path)!r}, save_delay=600)\n"
        "tunecache.flush_on_sigterm()\n"
        "for i in range(50): c.put('ns', {'i': i}, 'a', median_ns=1.0)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == -signal.SIGTERM
    with tunecache.Cache("term", path=path) as c:
        assert len(c) == 50


def _spin(seconds: float) -> int:
    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        n += 1
    return n


def test_other_threads_run_while_flush_waits_on_a_held_lock(tmp_path):
    path = tmp_path / "c.tcache"
    c = tunecache.Cache("gil", path=path, save_delay=600, lock_timeout=30)
    c.put("ns", KEY, "a", median_ns=1.0)
    c.flush()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time\n"
            f"f = open({str(path) + '.lock'!r}, 'a+')\n"
            "fcntl.flock(f, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "time.sleep(3)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        alone = _spin(0.5)
        c.put("ns", {"m": 2}, "a", median_ns=1.0)
        waiting = threading.Thread(target=lambda: c.flush(10))
        start = time.perf_counter()
        waiting.start()
        time.sleep(0.05)
        beside = _spin(0.5)
        waiting.join()
        waited = time.perf_counter() - start
    finally:
        holder.wait(timeout=30)
    assert waited > 1.0, f"the flush waited for the lock ({waited:.2f}s)"
    assert beside >= alone / 2, f"the other thread ran at {beside / alone:.0%} of its speed"
    c.close()


def test_the_exit_flush_is_bounded_and_says_what_was_not_saved(tmp_path):
    path = tmp_path / "c.tcache"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, time\n"
            f"f = open({str(path) + '.lock'!r}, 'a+')\n"
            "fcntl.flock(f, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        start = time.monotonic()
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                "import tunecache\n"
                f"c = tunecache.Cache('bounded', path={str(path)!r}, save_delay=600, lock_timeout=1)\n"
                "c.put('ns', {'i': 1}, 'a', median_ns=1.0)\n",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        took = time.monotonic() - start
    finally:
        holder.kill()
        holder.wait()
    assert out.returncode == 0
    assert took < 15, f"exit took {took:.1f}s"
    assert "not all on disk" in out.stderr and "lock" in out.stderr, out.stderr


def _reap(pids: list[int], timeout: float) -> list[int]:
    """Waits for `pids`; returns those still running after `timeout` (killed)."""
    deadline = time.monotonic() + timeout
    left = list(pids)
    while left and time.monotonic() < deadline:
        for pid in list(left):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                assert os.waitstatus_to_exitcode(status) == 0, f"child {pid}: {status}"
                left.remove(pid)
        time.sleep(0.01)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return left


def test_a_child_forked_while_other_threads_hold_global_locks_never_hangs(tmp_path):
    """Issue 24, case 13: a child forked while another thread (the GIL released) was interning
    namespaces inherited the table's lock held, and its first put blocked for ever (1 fork in
    3 to 15). Every process-global lock is taken around a fork now: the namespace table, the
    warning queue, the list of live output sessions."""
    lines = "\n".join(
        f'{{"scope": {{}}, "namespace": "ns{j}", "key": {{"m": {j}}}, "candidates": []}}' for j in range(400)
    )
    folder = tmp_path / "a-folder.tcache"
    folder.mkdir()
    stop = threading.Event()

    def intern_namespaces():
        with tunecache.Cache("forkns", path=tmp_path / "busy.tcache", save_delay=0.001) as c:
            while not stop.is_set():
                c.import_lines(lines)

    def warn_and_open_sessions():
        while not stop.is_set():
            # A cache at a folder warns from Rust without the GIL; a session takes the live list.
            tunecache.Cache("forkns", path=folder).close()
            tunecache._tunecache.OutputCache(None)

    # The warnings are kept in memory: a thread writing to stderr at the fork leaves Python's
    # own stderr buffer lock held in the child (a CPython hazard of any threaded program, not
    # one of tunecache's locks).
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    log = logging.getLogger("tunecache")
    keep = Keep()
    log.addHandler(keep)
    log.propagate = False
    threads = [threading.Thread(target=f) for f in (intern_namespaces, warn_and_open_sessions)]
    for t in threads:
        t.start()
    children = []
    try:
        time.sleep(0.2)
        for i in range(40):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    with tunecache.Cache("forkns", path=tmp_path / f"child{i}.tcache") as c:
                        c.put(f"child-ns-{i}", {"m": i}, "a", median_ns=1.0)
                    tunecache.Cache("forkns", path=folder).close()
                    tunecache._tunecache.OutputCache(None)
                    code = 0
                finally:
                    os._exit(code)
            children.append(pid)
            time.sleep(0.005)
    finally:
        stop.set()
        for t in threads:
            t.join()
        log.removeHandler(keep)
        log.propagate = True
    hung = _reap(children, timeout=30)
    assert not hung, f"{len(hung)} of {len(children)} forked children hung"
    assert any("not a regular file" in m for m in seen), "the warning queue was in use"


def test_a_forked_child_that_exits_leaves_the_parents_session_alone(tmp_path):
    """A child inherits the parent's list of live output sessions; its exit handler removed the
    parent's session directory. Only a process's own sessions go with it."""
    out = python(
        "import os, sys, tunecache\n"
        "o = tunecache._tunecache.OutputCache(None)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    sys.exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "print(o.dir, os.path.isdir(o.dir))\n",
        env={"TMPDIR": str(tmp_path)},
    )
    session, alive = out.stdout.split()
    assert alive == "True", out.stdout
    assert not os.path.exists(session), "the parent's own exit still removes it"


_WORKERS = """
import multiprocessing as mp, sys, tunecache

PATH = sys.argv[2]
c = tunecache.Cache("mp", path=PATH, save_delay=600)


def puts(base):
    for i in range(20):
        c.put("ns", {"i": base + i}, "a", median_ns=1.0)


def one(i):
    c.put("ns", {"i": i}, "a", median_ns=1.0)
    return i


if __name__ == "__main__":
    method, kind = sys.argv[1], sys.argv[3]
    ctx = mp.get_context(method)
    if kind == "process":
        ps = [ctx.Process(target=puts, args=(w * 1000,)) for w in range(40)]
        for p in ps:
            p.start()
        for p in ps:
            p.join()
            assert p.exitcode == 0, p.exitcode
    else:
        with ctx.Pool(4) as pool:
            assert len(pool.map(one, range(800))) == 800
"""


@pytest.mark.parametrize(
    "method, kind",
    [("fork", "process"), ("spawn", "process"), ("fork", "pool"), ("spawn", "pool"), ("forkserver", "pool")],
)
def test_puts_in_multiprocessing_workers_reach_the_file(tmp_path, method, kind):
    """Hardening IV, case 1: puts made in multiprocessing children never reached the file (they
    end with os._exit, which skips atexit, and a Pool terminates its workers with SIGTERM):
    800 acknowledged, 0 in the file with 40 fork children; 60-140 of 800 lost with Pool(4).
    A cache used in such a worker arms a multiprocessing finalizer and the SIGTERM flush."""
    script = tmp_path / "workers.py"
    script.write_text(_WORKERS)
    path = tmp_path / f"{method}-{kind}.tcache"
    run(sys.executable, str(script), method, str(path), kind, timeout=300)
    with tunecache.Cache("mp", path=path) as c:
        assert len(c) == 800, f"{len(c)} of 800 acknowledged results are in the file"


_PICKLED = """
import multiprocessing as mp, sys, tunecache


def work(args):
    cache, task, each = args
    for i in range(each):
        cache.put("ns", {"t": task, "i": i}, "a", median_ns=1.0 + i)
    return each


if __name__ == "__main__":
    method, path, workers, tasks, each, ending = sys.argv[1:7]
    workers, tasks, each = int(workers), int(tasks), int(each)
    cache = tunecache.Cache("mp", path=path)
    ctx = mp.get_context(method)
    jobs = [(cache, t, each) for t in range(tasks)]
    if ending == "with":
        with ctx.Pool(workers) as pool:
            acked = sum(pool.map(work, jobs))
    elif ending == "close":
        pool = ctx.Pool(workers)
        acked = sum(pool.map(work, jobs))
        pool.close()
        pool.join()
    elif ending == "terminate":
        pool = ctx.Pool(workers)
        acked = sum(pool.map(work, jobs))
        pool.terminate()
        pool.join()
    else:  # each worker ends by itself after one task (its normal exit)
        pool = ctx.Pool(workers, maxtasksperchild=1)
        acked = sum(pool.map(work, jobs, chunksize=1))
        pool.close()
        pool.join()
    print(acked)
"""


@pytest.mark.parametrize(
    "method, workers, tasks, ending",
    [
        ("fork", 4, 160, "with"),
        ("spawn", 4, 160, "with"),
        ("forkserver", 4, 160, "with"),
        ("fork", 4, 160, "terminate"),
        ("fork", 8, 40, "own-exit"),
        ("fork", 200, 2000, "with"),
        ("fork", 200, 2000, "close"),
        ("spawn", 200, 400, "with"),
        ("fork", 1000, 2000, "with"),
    ],
)
def test_a_pickled_cache_in_a_pool_loses_no_put(tmp_path, method, workers, tasks, ending):
    """Hardening V, case 3, in the pattern docs/python.md shows (the cache pickled to each
    task): Pool(4) lost 60-140 of 800 puts (each task unpickled a cache of its own, dropped
    with the task, its last save cut short by the worker's end); Pool(200) kept 6,650 of
    10,000 and Pool(1000) 765 of 15,000 (each worker's exit flush gave up after 2 s on a lock
    busy with the others' saves). Now a process unpickles one cache per configuration, and an
    exit flush waits while the saves ahead of it land."""
    script = tmp_path / "pickled.py"
    script.write_text(_PICKLED)
    path = tmp_path / "c.tcache"
    out = run(
        sys.executable,
        str(script),
        method,
        str(path),
        str(workers),
        str(tasks),
        "5",
        ending,
        timeout=600,
    )
    acked = int(out.stdout.split()[-1])
    assert acked == tasks * 5
    with tunecache.Cache("mp", path=path, read_only=True) as c:
        assert len(c) == acked, f"{len(c)} of {acked} acknowledged results are in the file"


_BLOCKED_WORKER = """
import multiprocessing as mp, sys, time, tunecache


def work(path, ready):
    c = tunecache.Cache("mp", path=path, save_delay=600)
    for i in range(5):
        c.put("ns", {"i": i}, "a", median_ns=1.0)
    ready.set()
    c.claim("ns", {"i": -1}, wait=60)  # the parent holds it: this waits in Rust


if __name__ == "__main__":
    path, method = sys.argv[1], sys.argv[2]
    c = tunecache.Cache("mp", path=path)
    held = c.claim("ns", {"i": -1}, wait=5)
    ctx = mp.get_context(method)
    ready = ctx.Event()
    p = ctx.Process(target=work, args=(path, ready))
    p.start()
    assert ready.wait(30)
    time.sleep(0.3)
    t = time.monotonic()
    p.terminate()
    p.join(30)
    print(p.exitcode, round(time.monotonic() - t, 2))
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_worker_blocked_in_a_wait_flushes_and_ends_at_sigterm(tmp_path, method):
    """A pool worker whose main thread is blocked in a C or Rust call never ran a Python
    SIGTERM handler (Python runs them on the main thread, between bytecodes): a forkserver
    pool's terminate hung for ever in about one run in twenty. The flush is native now: a
    worker waiting 60 s on a claim ends at once, with its results on disk."""
    script = tmp_path / "blocked.py"
    script.write_text(_BLOCKED_WORKER)
    path = tmp_path / "c.tcache"
    out = run(sys.executable, str(script), str(path), method, timeout=120).stdout
    code, took = out.split()
    assert code == "-15", out
    assert float(took) < 10, f"the worker took {took} s to end"
    with tunecache.Cache("mp", path=path) as c:
        assert len(c) == 5, f"{len(c)} of 5 results reached the file"


_FORK_AFTER_ARMING = """
import multiprocessing as mp, os, signal, sys, time, tunecache


def work(path, out):
    c = tunecache.Cache("mp", path=path, save_delay=600)
    c.put("ns", {"i": 1}, "a", median_ns=1.0)  # arms the native SIGTERM flush here
    pid = os.fork()
    if pid == 0:
        time.sleep(30)  # the forked child: SIGTERM must end it, and only it
        os._exit(0)
    os.kill(pid, signal.SIGTERM)
    _, status = os.waitpid(pid, 0)
    out.put((os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, os.getpid()))
    c.put("ns", {"i": 2}, "a", median_ns=1.0)


if __name__ == "__main__":
    path = sys.argv[1]
    out = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=work, args=(path, out))
    p.start()
    child_died_of_sigterm, _ = out.get(timeout=60)
    p.join(60)
    print(child_died_of_sigterm, p.exitcode)
"""


def test_a_child_forked_after_arming_ends_at_sigterm_and_leaves_its_parent_alone(tmp_path):
    """The native SIGTERM handler is inherited by a fork, but its pipe and thread are the
    parent's: the child must end as SIGTERM ends it (not wake the parent's flush thread, which
    would flush and kill the parent)."""
    script = tmp_path / "forked.py"
    script.write_text(_FORK_AFTER_ARMING)
    path = tmp_path / "c.tcache"
    out = run(sys.executable, str(script), str(path), timeout=120).stdout.split()
    assert out == ["True", "0"], out
    with tunecache.Cache("mp", path=path) as c:
        assert len(c) == 2, "the parent lived on and recorded its second result"
