"""The Python quickstart docs/python.md quotes runs, and a second run measures and computes nothing."""

from __future__ import annotations

import sys

from conftest import ROOT, run


def test_quickstart_runs_and_a_second_run_reuses_everything(tmp_path):
    script = str(ROOT / "python" / "examples" / "quickstart.py")
    first = run(sys.executable, script, str(tmp_path), timeout=120).stdout
    assert "candidates measured in this run: 6" in first and "normalize computed 1" in first
    second = run(sys.executable, script, str(tmp_path), timeout=120).stdout
    assert "candidates measured in this run: 0" in second and "normalize computed 0" in second


def test_pip_install_of_the_folder_gives_a_working_typed_package(tmp_path):
    """docs/python.md's install command: `pip install ./python` into a fresh environment (the
    maturin build backend, an abi3 wheel), then a cache used from it without numpy."""
    import venv

    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    py = str(env / "bin" / "python")
    run(py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(ROOT / "python"), timeout=1800)
    out = run(
        py,
        "-c",
        "import os, tunecache\n"
        "here = os.path.dirname(tunecache.__file__)\n"
        "assert {'py.typed', '_tunecache.pyi'} <= set(os.listdir(here)), os.listdir(here)\n"
        f"c = tunecache.Cache('pip', path={str(tmp_path / 'c.tcache')!r})\n"
        "c.put('n', {'a': 1}, 'x', median_ns=1.0)\n"
        "c.close()\n"
        "print(tunecache.fingerprint({}))\n",
        cwd=str(tmp_path),
        timeout=120,
    )
    assert out.stdout.strip() == "ae19aa9db9f97bdb96f0fef49a06a9bb"
