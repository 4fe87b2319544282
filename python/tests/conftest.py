"""Shared fixtures. A skipped test is written to TUNECACHE_SKIP_LOG (set by `cargo xtask test`),
where it fails the run as every skipped Rust test does."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    log = os.environ.get("TUNECACHE_SKIP_LOG")
    if log and report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"python {report.nodeid}: {reason}\n")


@pytest.fixture(scope="session")
def cli() -> str:
    """The tunecache binary (TUNECACHE_BIN, else target/debug/tunecache, built if missing)."""
    path = os.environ.get("TUNECACHE_BIN") or str(ROOT / "target" / "debug" / "tunecache")
    if not os.path.exists(path):
        cargo = shutil.which("cargo")
        assert cargo, f"{path} is missing and cargo is not on PATH to build it"
        subprocess.run([cargo, "build", "-q", "-p", "cache-cli"], cwd=ROOT, check=True)
    return path


def run(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(list(args), capture_output=True, text=True, **kw)
    if check and out.returncode != 0:
        raise AssertionError(f"{args} exited {out.returncode}: {out.stderr}")
    return out


def python(
    code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Runs `code` in a fresh interpreter of this environment."""
    e = dict(os.environ)
    if env:
        e.update(env)
    return run(sys.executable, "-c", code, *args, env=e, timeout=timeout)


WARPCONVNET_SRC = ROOT / "target" / "frameworks" / "warpconvnet-1.8.2"


@pytest.fixture(scope="session")
def warpconvnet_src() -> pathlib.Path:
    """WarpConvNet's benchmark-cache module and its tests from its sdist (fetched from PyPI on
    first use by tests/frameworks/fetch_warpconvnet.py); a failure to fetch fails the test."""
    src = pathlib.Path(os.environ.get("TUNECACHE_WARPCONVNET_SRC") or WARPCONVNET_SRC)
    if not (src / ".complete").exists():
        fetch = pathlib.Path(__file__).parent / "frameworks" / "fetch_warpconvnet.py"
        run(sys.executable, str(fetch), str(src), timeout=300)
    return src
