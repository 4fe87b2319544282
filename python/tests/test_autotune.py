"""Tuning from Python: each key measured once across threads and processes, hits from a memo."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest
from conftest import python

import tunecache


def _work(n):
    return sum(range(n))


def make(cache, counter=None):
    def counted(name, fn):
        def run(n):
            if counter is not None:
                with open(counter, "a") as f:
                    f.write(f"{name}\n")
            return fn(n)

        return run

    return tunecache.Autotuned(
        cache,
        "sum",
        [
            tunecache.Candidate("loop", counted("loop", _work), {"unroll": 1}),
            tunecache.Candidate("builtin", counted("builtin", lambda n: n * (n - 1) // 2)),
            tunecache.Candidate("slow", counted("slow", lambda n: (time.sleep(0.002), _work(n))[1])),
        ],
        key=lambda n: {"n": n},
        warmup=1,
        repeat=3,
    )


def test_tunes_once_then_hits_and_returns_the_result(tmp_path):
    c = tunecache.Cache("tune", path=tmp_path / "c.tcache")
    op = make(c)
    assert op(1000) == sum(range(1000))
    assert op.measured == 3
    e = c.get("sum", {"n": 1000})
    assert e.best.algorithm in ("loop", "builtin") and e.best.samples == 3
    assert len(e.candidates) == 3
    assert op(1000) == sum(range(1000))
    assert op.measured == 3, "a hit measures nothing"
    assert op.choose(1000).name == e.best.algorithm
    c.close()


def test_a_failing_candidate_is_recorded_and_never_chosen(tmp_path):
    c = tunecache.Cache("tune", path=tmp_path / "c.tcache")

    def broken(n):
        raise RuntimeError("no kernel for this shape")

    op = tunecache.Autotuned(c, "sum", {"broken": broken, "ok": _work}, key=lambda n: {"n": n}, repeat=2)
    assert op(10) == 45
    e = c.get("sum", {"n": 10})
    assert e.best.algorithm == "ok"
    assert "no kernel" in [x for x in e.candidates if x.algorithm == "broken"][0].failed
    all_fail = tunecache.Autotuned(c, "sum2", {"broken": broken}, key=lambda n: {"n": n})
    with pytest.raises(tunecache.TuningError, match="every candidate failed"):
        all_fail(1)
    c.close()


def test_samples_that_are_no_time_are_dropped_and_the_call_returns(tmp_path, caplog):
    """Issue 24, case 14: a timer returning NaN for some samples made the call raise
    ("non-finite timings; nothing was recorded"), and the next call too. Such samples are
    dropped now; a candidate left with none is recorded as failed; a timer that gives nothing
    usable at all leaves the candidates unjudged and the call still returns."""
    c = tunecache.Cache("tune", path=tmp_path / "c.tcache")
    calls = iter(range(10_000))

    def flaky(fn):
        fn()
        i = next(calls)
        return [float("nan"), 1000.0, float("inf"), -5.0, 2000.0, None][i % 6]

    op = tunecache.Autotuned(c, "sum", {"a": _work, "b": _work}, key=lambda n: {"n": n}, timer=flaky, repeat=6)
    assert op(10) == 45
    assert op(10) == 45, "the next call is a hit"
    e = c.get("sum", {"n": 10})
    assert [x.failed for x in e.candidates] == [None, None]
    assert all(x.samples == 2 and 1000.0 <= x.median_ns <= 2000.0 for x in e.candidates)
    assert "no time" in caplog.text

    def nan_for_b(fn):
        fn()
        return float("nan") if fn() == -1 else 1000.0

    b_never = tunecache.Autotuned(
        c, "sum3", {"a": _work, "b": lambda n: -1}, key=lambda n: {"n": n}, timer=nan_for_b, repeat=3
    )
    assert b_never(10) == 45
    e = c.get("sum3", {"n": 10})
    assert e.best.algorithm == "a"
    assert "no usable sample" in [x for x in e.candidates if x.algorithm == "b"][0].failed

    broken_timer = tunecache.Autotuned(
        c, "sum4", {"a": _work, "b": _work}, key=lambda n: {"n": n}, timer=lambda fn: float("nan")
    )
    assert broken_timer(10) == 45
    assert broken_timer(10) == 45, "still returns; measured again"
    assert c.get("sum4", {"n": 10}) is None, "nothing was recorded against the candidates"
    assert broken_timer.measured == 0
    c.close()


def test_a_shipped_choice_is_measured_with_the_rest_and_serves_while_measuring_is_forbidden(tmp_path, monkeypatch):
    """A winner another tool shipped for the key (an imported config, chosen without figures)
    counted as measured: the other candidates were measured and, outranking it, won even
    where the shipped one was the fastest."""
    import json

    c = tunecache.Cache("tune", path=tmp_path / "c.tcache")
    line = {
        "scope": c.scope,
        "namespace": "sum",
        "key": {"n": 1000},
        "candidates": [{"algo": "builtin", "params": {}, "status": "chosen", "chosen_by": "shipped"}],
    }
    assert c.import_lines(json.dumps(line)) == 1
    from tunecache import _autotune

    monkeypatch.setattr(_autotune, "measuring_forbidden", lambda: "capturing a graph")
    assert make(c).choose(1000).name == "builtin", "the shipped choice, while measuring is forbidden"
    monkeypatch.undo()
    op = make(c)
    assert op(1000) == sum(range(1000))
    assert op.measured == 3, "the shipped candidate is measured too"
    best = c.get("sum", {"n": 1000}).best
    assert best.chosen_by is None and best.median_ns is not None
    c.close()


def test_a_grown_candidate_set_measures_only_the_new_one(tmp_path):
    c = tunecache.Cache("tune", path=tmp_path / "c.tcache")
    op = make(c)
    op(500)
    grown = tunecache.Autotuned(
        c, "sum", op.candidates + [tunecache.Candidate("new", _work)], key=lambda n: {"n": n}, repeat=2
    )
    grown(500)
    assert grown.measured == 1
    assert len(c.get("sum", {"n": 500}).candidates) == 4
    c.close()


@pytest.mark.parametrize("read_only", [False, True], ids=["claim files", "in-process claims"])
def test_four_threads_tune_each_key_once(tmp_path, read_only):
    # A read-only cache has no file to share claims through: the core's in-process claim
    # still lets one thread measure each key (the package keeps no locks of its own).
    counter = tmp_path / "calls.txt"
    c = tunecache.Cache("tune", path=tmp_path / "c.tcache", read_only=read_only)
    op = make(c, counter)
    barrier = threading.Barrier(4)
    errors = []

    def worker():
        try:
            barrier.wait()
            for n in (100, 200, 300):
                assert op(n) == sum(range(n))
        except Exception as e:  # noqa: BLE001 - the main thread reports it
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert op.measured == 9, "3 keys x 3 candidates, measured once"
    calls = counter.read_text().split()
    # warm-up + 3 samples per candidate per key, plus 4 threads x 3 keys running the winner
    assert len(calls) == 3 * 3 * 4 + 12
    c.close()


CHILD = """
import sys, time
sys.path.insert(0, {tests!r})
import tunecache
from test_autotune import make
c = tunecache.Cache("tune", path={path!r})
op = make(c, {counter!r})
for n in (100, 200, 300):
    op(n)
print(op.measured)
c.close()
"""


def test_two_processes_tune_each_key_once_and_a_third_measures_nothing(tmp_path):
    import subprocess
    import sys

    counter = tmp_path / "calls.txt"
    code = CHILD.format(tests=os.path.dirname(__file__), path=str(tmp_path / "c.tcache"), counter=str(counter))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    measured = [int(p.communicate(timeout=120)[0].strip()) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sum(measured) == 9, f"each of 3 keys x 3 candidates measured once in all: {measured}"
    third = python(code)
    assert third.stdout.strip() == "0", "a later process measures nothing"


def test_hits_follow_changes_to_the_cache(tmp_path):
    c = tunecache.Cache("tune", path=tmp_path / "c.tcache")
    op = tunecache.Autotuned(c, "k", {"a": lambda: "a", "b": lambda: "b"}, key=lambda: {"k": 1}, repeat=1)
    op()
    winner = c.get("k", {"k": 1}).best.algorithm
    other = "b" if winner == "a" else "a"
    c.put("k", {"k": 1}, other, median_ns=0.001)
    assert op() == other, "the memo is dropped when the cache changes"
    c.close()


def test_no_measuring_while_capturing_uses_the_default_or_raises(tmp_path, monkeypatch):
    from tunecache import _autotune

    c = tunecache.Cache("tune", path=tmp_path / "c.tcache")
    monkeypatch.setattr(_autotune, "measuring_forbidden", lambda: "a CUDA graph is being captured")
    op = tunecache.Autotuned(c, "k", {"a": lambda: "a", "b": lambda: "b"}, key=lambda: {"k": 2})
    with pytest.raises(tunecache.TuningError, match="CUDA graph"):
        op()
    with_default = tunecache.Autotuned(c, "k", {"a": lambda: "a", "b": lambda: "b"}, key=lambda: {"k": 2}, default="b")
    assert with_default() == "b"
    assert c.get("k", {"k": 2}) is None, "nothing was measured"
    c.close()


def test_decorator_form(tmp_path):
    c = tunecache.Cache("tune", path=tmp_path / "c.tcache")

    @tunecache.autotune(c, namespace="scale", candidates={"twice": lambda x: x + x}, key=lambda x: {"n": x})
    def scale(x):
        """Doubles x."""
        return 2 * x

    assert scale(21) == 42
    assert {x.algorithm for x in c.get("scale", {"n": 21}).candidates} == {"scale", "twice"}
    assert scale.__doc__ == "Doubles x."
    assert scale.tuned.measured == 2 and scale(21) == 42 and scale.tuned.measured == 2
    assert scale.choose(21).name in ("scale", "twice")
    c.close()


@pytest.mark.torch
def test_cuda_event_timer_with_torch():
    """Decides at run time, loudly, whether a CUDA device is there: without one, CPU tensors
    are timed with the monotonic clock and the CUDA event timer is not exercised."""
    torch = pytest.importorskip("torch")
    from tunecache._autotune import _uses_cuda

    assert not _uses_cuda((torch.ones(3),), {})
    if not torch.cuda.is_available():
        print("no CUDA device here: cuda_event_timer not exercised", file=sys.stderr)
        return
    assert _uses_cuda((torch.ones(3, device="cuda"),), {})
    assert tunecache.cuda_event_timer(lambda: torch.ones(10, device="cuda").sum()) > 0


def test_results_record_how_they_were_measured_and_another_policy_never_outranks(tmp_path):
    c = tunecache.Cache("tune", path=tmp_path / "c.tcache")
    op = make(c)
    op(1000)
    for cand in c.get("sum", {"n": 1000}).candidates:
        assert cand.policy == {"timer": "wall", "samples": 3, "warmup_runs": 1, "interleaved": True}
    # A result measured later with another timer leads the ranking, though slower by the
    # other clock: the two are never ranked against each other.
    e = c.put("sum", {"n": 1000}, "slow", median_ns=1e12, policy={"timer": "cuda-events", "samples": 3})
    assert e.best.algorithm == "slow" and e.best.policy["timer"] == "cuda-events"
    assert [x.policy is None for x in e.candidates] == [False] * 3
    # A result with no policy is unknown.
    e = c.put("sum", {"n": 5}, "loop", median_ns=10.0)
    assert e.best.policy is None
    with pytest.raises(Exception, match="policy"):
        c.put("sum", {"n": 5}, "loop", median_ns=10.0, policy={"timer": 1.5})
    c.close()
