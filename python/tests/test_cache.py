"""The cache from Python: recording, reading, degrading, migrating, and the CLI's view."""

from __future__ import annotations

import json
import logging
import os
import pickle
import stat

import pytest
from conftest import python, run

import tunecache

SCOPE = {"device": "test-cpu", "arch": "x86_64"}
KEY = {"m": 128, "n": 64, "dtype": "float32"}


def test_put_get_best(tmp_path):
    with tunecache.Cache("pyapp", path=tmp_path / "c.tcache", scope=SCOPE) as c:
        assert c.get("mm", KEY) is None
        c.put("mm", KEY, "blocked", {"tile": 32}, median_ns=800.0, min_ns=750.0, spread_ns=10.0, samples=9)
        entry = c.put("mm", KEY, "naive", median_ns=1000.0, samples=9)
        assert entry.best.algorithm == "blocked" and entry.best.params == {"tile": 32}
        assert entry.best.median == pytest.approx(800e-9)
        assert [x.algorithm for x in entry.candidates] == ["blocked", "naive"]
        c.put("mm", KEY, "broken", failed="launch failed")
        e = c.get("mm", KEY)
        assert e.candidates[-1].failed == "launch failed"
        assert e.key == KEY and e.fingerprint == tunecache.fingerprint(KEY)
        assert e.origin == "measured"
        assert len(c) == 1
        c.flush()
    with tunecache.Cache("pyapp", path=tmp_path / "c.tcache", scope=SCOPE) as c:
        assert c.get("mm", KEY).best.algorithm == "blocked"
        assert c.health()["mode"] == "persistent"


def test_a_wait_too_long_for_the_clock_is_forever_not_a_panic(tmp_path):
    # A deadline of now + 1e19 s overflowed the clock and raised a PanicException.
    with tunecache.Cache("pyapp", path=tmp_path / "c.tcache", scope=SCOPE, lock_timeout=1e19) as c:
        c.put("mm", KEY, "naive", median_ns=1000.0)
        c.flush(1e19)
    with tunecache.Cache("pyapp", path=tmp_path / "c.tcache", scope=SCOPE) as c:
        assert c.get("mm", KEY).best.algorithm == "naive"


def test_bad_measurements_are_refused_where_they_enter(tmp_path):
    with tunecache.Cache("pyapp", path=tmp_path / "c.tcache") as c:
        with pytest.raises(ValueError):
            c.put("mm", KEY, "x", median_ns=float("nan"))
        with pytest.raises(ValueError, match="median_ns"):
            c.put("mm", KEY, "x")
        with pytest.raises(ValueError, match="namespace"):
            c.put("", KEY, "x", median_ns=1.0)
        # A fastest sample slower than the median: every shared tier's reader refuses it.
        with pytest.raises(tunecache.RefusedEntryError, match="min_ns"):
            c.put("mm", KEY, "x", median_ns=1.0, min_ns=2.0)
        assert c.get("mm", KEY) is None


@pytest.mark.parametrize("where", ["file-as-dir", "proc", "fifo", "folder", "dev-null"])
def test_an_unusable_location_degrades_to_memory_and_warns(tmp_path, caplog, where):
    if where == "file-as-dir":
        blocker = tmp_path / "blocker"
        blocker.write_text("not a folder")
        path = blocker / "c.tcache"
    elif where == "fifo":
        path = tmp_path / "fifo"
        os.mkfifo(path)
    elif where == "folder":
        path = tmp_path / "folder"
        path.mkdir()
    elif where == "dev-null":
        path = "/dev/null"
    else:
        path = "/proc/self/nope/c.tcache"
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        c = tunecache.Cache("pyapp", path=path)
    assert c.health()["mode"] == "memory"
    assert any("memory" in r.getMessage() for r in caplog.records), caplog.text
    c.put("mm", KEY, "a", median_ns=1.0)
    assert c.get("mm", KEY).best.algorithm == "a"
    with pytest.raises(tunecache.CacheError, match="not persistent"):
        c.flush(1)
    c.close()
    if where == "fifo":
        assert stat.S_ISFIFO(os.stat(path).st_mode), "the FIFO is left alone"


def test_a_damaged_file_is_moved_aside_not_fatal(tmp_path, caplog):
    f = tmp_path / "c.tcache"
    # tunecache's marker, then damage.
    damaged = b"\x96\xa9tunecache\x04" + os.urandom(200)
    f.write_bytes(damaged)
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        c = tunecache.Cache("pyapp", path=f)
    assert c.get("mm", KEY) is None
    c.put("mm", KEY, "a", median_ns=1.0)
    c.close()
    assert caplog.records, "a warning says what happened"
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("c.tcache.unusable-")]
    assert [p.read_bytes() for p in aside] == [damaged], "kept aside byte for byte"


def test_a_file_that_is_not_a_cache_is_left_alone(tmp_path, caplog):
    f = tmp_path / "notes.txt"
    theirs = b"TCACHE\x00\x01" + os.urandom(200)
    f.write_bytes(theirs)
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        c = tunecache.Cache("pyapp", path=f)
    c.put("mm", KEY, "a", median_ns=1.0)
    assert c.get("mm", KEY).best.algorithm == "a", "results still work, in memory"
    c.close()
    assert any("untouched" in r.getMessage() for r in caplog.records), caplog.records
    assert f.read_bytes() == theirs
    assert sorted(p.name for p in tmp_path.iterdir()) in (["notes.txt"], ["notes.txt", "notes.txt.lock"])


def test_read_only_never_writes(tmp_path):
    f = tmp_path / "c.tcache"
    with tunecache.Cache("pyapp", path=f) as c:
        c.put("mm", KEY, "a", median_ns=1.0)
    before = f.read_bytes()
    with tunecache.Cache("pyapp", path=f, read_only=True) as c:
        assert c.get("mm", KEY).best.algorithm == "a"
        c.put("mm", {"m": 1}, "b", median_ns=1.0)
        assert c.health()["mode"] == "read-only"
    assert f.read_bytes() == before


def test_closed_cache_raises_cache_error(tmp_path):
    c = tunecache.Cache("pyapp", path=tmp_path / "c.tcache")
    c.close()
    c.close()
    with pytest.raises(tunecache.CacheError, match="closed"):
        c.get("mm", KEY)
    assert isinstance(tunecache.CacheError("x"), OSError)


def test_migrations_from_python_steps(tmp_path):
    f = tmp_path / "c.tcache"
    with tunecache.Cache("pyapp", schema=1, path=f) as c:
        c.put("mm", KEY, "production", median_ns=5.0)
    steps = [
        {
            "from": 1,
            "to": 2,
            "description": "renamed",
            "ops": [{"op": "rename_algorithm", "from": "production", "to": "mask_gemm"}],
        }
    ]
    with tunecache.Cache("pyapp", schema=2, migrations=steps, path=f) as c:
        assert c.get("mm", KEY).best.algorithm == "mask_gemm"
        assert c.health()["migration"]
    with pytest.raises(ValueError, match="migrations"):
        tunecache.Cache("pyapp", schema=2, migrations=[{"from": 1, "to": 2, "ops": [{"op": "nope"}]}], path=f)


def test_lines_of_an_older_schema_are_migrated_on_import_as_the_cli_does(tmp_path):
    with tunecache.Cache("pyapp", schema=1, path=tmp_path / "old.tcache") as c:
        c.put("mm", KEY, "production", median_ns=5.0)
        old_lines = c.export_lines()
    assert '"schema":1' in old_lines.replace(" ", "")
    steps = [
        {
            "from": 1,
            "to": 2,
            "description": "renamed",
            "ops": [{"op": "rename_algorithm", "from": "production", "to": "mask_gemm"}],
        }
    ]
    with tunecache.Cache("pyapp", schema=2, migrations=steps, path=tmp_path / "new.tcache") as c:
        assert c.import_lines(old_lines) == 1
        assert c.get("mm", KEY).best.algorithm == "mask_gemm"
    with tunecache.Cache("pyapp", schema=2, path=tmp_path / "bare.tcache") as c:
        with pytest.raises(tunecache.CacheError, match="schema 1"):
            c.import_lines(old_lines)
        assert len(c) == 0


def test_a_newer_file_is_left_alone(tmp_path, caplog):
    f = tmp_path / "c.tcache"
    with tunecache.Cache("pyapp", schema=3, path=f) as c:
        c.put("mm", KEY, "a", median_ns=1.0)
    before = f.read_bytes()
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        with tunecache.Cache("pyapp", schema=2, path=f) as c:
            assert c.get("mm", KEY) is None
            c.put("mm", KEY, "b", median_ns=1.0)
    assert f.read_bytes() == before
    assert any("newer" in r.getMessage() or "schema" in r.getMessage() for r in caplog.records), caplog.text


def test_pickle_reopens_by_configuration(tmp_path):
    f = tmp_path / "c.tcache"
    c = tunecache.Cache("pyapp", path=f, scope=SCOPE)
    c.put("mm", KEY, "a", median_ns=1.0)
    c.flush()
    blob = pickle.dumps(c)
    out = python(
        "import pickle, sys; c = pickle.loads(sys.stdin.buffer.read()) if False else None",
    )
    assert out.returncode == 0
    code = (
        "import pickle, sys, tunecache\n"
        f"c = pickle.loads(bytes.fromhex({blob.hex()!r}))\n"
        "print(c.get('mm', {'m': 128, 'n': 64, 'dtype': 'float32'}).best.algorithm)\n"
        "c.put('mm', {'m': 1}, 'child', median_ns=2.0)\n"
    )
    assert python(code).stdout.strip() == "a"
    c.refresh()
    assert c.get("mm", {"m": 1}).best.algorithm == "child"
    c.close()


def test_python_and_cli_read_each_other(cli, tmp_path):
    py_file = tmp_path / "py.tcache"
    with tunecache.Cache("interop", path=py_file, scope=SCOPE) as c:
        c.put("mm", KEY, "blocked", {"tile": 32}, median_ns=800.0, samples=5)
    out = run(
        cli,
        "get",
        "--cache-file",
        str(py_file),
        "-n",
        "mm",
        "-k",
        json.dumps(KEY),
        "--scope",
        json.dumps(SCOPE),
        "--json",
    )
    assert "blocked" in out.stdout
    line = json.loads(run(cli, "export", "--cache-file", str(py_file)).stdout)
    assert line["fingerprint"] == tunecache.fingerprint(KEY)

    cli_file = tmp_path / "cli.tcache"
    run(
        cli,
        "put",
        "--cache-file",
        str(cli_file),
        "--app",
        "interop",
        "--scope",
        json.dumps(SCOPE),
        "-n",
        "mm",
        "-k",
        json.dumps(KEY),
        "--algo",
        "tiled",
        "--params",
        '{"bm":64}',
        "--median-ns",
        "700",
        "--samples",
        "3",
    )
    with tunecache.Cache("interop", path=cli_file, scope=SCOPE) as c:
        e = c.get("mm", KEY)
        assert e.best.algorithm == "tiled" and e.best.params == {"bm": 64} and e.best.samples == 3


def test_the_same_entries_make_the_same_bytes(cli, tmp_path):
    """Entries written by the CLI and carried into Python (and the other way) give
    byte-identical files once both are written out by `tunecache merge`."""
    cli_file = tmp_path / "cli.tcache"
    for i, algo in enumerate(["naive", "tiled", "blocked"]):
        run(
            cli,
            "put",
            "--cache-file",
            str(cli_file),
            "--app",
            "same",
            "--scope",
            json.dumps(SCOPE),
            "-n",
            "mm",
            "-k",
            json.dumps({**KEY, "m": 64 * (i + 1)}),
            "--algo",
            algo,
            "--median-ns",
            str(100 + i),
        )
    lines = run(cli, "export", "--cache-file", str(cli_file)).stdout
    py_file = tmp_path / "py.tcache"
    with tunecache.Cache("same", path=py_file, scope=SCOPE) as c:
        assert c.import_lines(lines, keep_origin=True) == 3
        assert sorted(c.export_lines().splitlines()) == sorted(lines.splitlines())
    run(cli, "merge", str(cli_file), "-o", str(tmp_path / "a.tcache"))
    run(cli, "merge", str(py_file), "-o", str(tmp_path / "b.tcache"))
    assert (tmp_path / "a.tcache").read_bytes() == (tmp_path / "b.tcache").read_bytes()

    # And back: what Python recorded, carried by the CLI, is the same bytes again.
    py2 = tmp_path / "py2.tcache"
    with tunecache.Cache("same", path=py2, scope=SCOPE) as c:
        c.put("conv", {"c": 3}, "winograd", median_ns=10.0)
        exported = c.export_lines()
    (tmp_path / "e.jsonl").write_text(exported)
    assert sorted(run(cli, "export", "--cache-file", str(py2)).stdout.splitlines()) == sorted(exported.splitlines())
    with tunecache.Cache("same", path=tmp_path / "py3.tcache", scope=SCOPE) as c:
        c.import_lines(run(cli, "export", "--cache-file", str(py2)).stdout, keep_origin=True)
    run(cli, "merge", str(py2), "-o", str(tmp_path / "c.tcache"))
    run(cli, "merge", str(tmp_path / "py3.tcache"), "-o", str(tmp_path / "d.tcache"))
    assert (tmp_path / "c.tcache").read_bytes() == (tmp_path / "d.tcache").read_bytes()


def test_import_is_all_or_nothing(tmp_path):
    with tunecache.Cache("pyapp", path=tmp_path / "c.tcache") as c:
        good = json.dumps(
            {
                "scope": {},
                "namespace": "mm",
                "key": {"m": 1},
                "candidates": [
                    {
                        "algo": "a",
                        "params": {},
                        "status": "ok",
                        "median_ns": 1.0,
                        "min_ns": 1.0,
                        "spread_ns": 0.0,
                        "samples": 1,
                    }
                ],
            }
        )
        with pytest.raises(ValueError, match="line 2"):
            c.import_lines(good + "\n{not json\n", source="bad.jsonl")
        assert len(c) == 0
