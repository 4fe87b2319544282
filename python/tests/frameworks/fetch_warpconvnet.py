"""Fetches WarpConvNet's sdist from PyPI (pinned by hash) and lays out only what its benchmark
cache needs, for the adapter tests: ``warpconvnet/{constants.py, utils/*.py}`` under an empty
package ``__init__`` (the real one builds a CUDA extension and imports the whole library), and
its own cache tests. Run by ``cargo xtask test``; does nothing when the tree is there.

    python fetch_warpconvnet.py DEST
"""

from __future__ import annotations

import hashlib
import io
import os
import pathlib
import re
import shutil
import sys
import tarfile
import urllib.parse
import urllib.request

VERSION = "1.8.2"
SHA256 = "076853323486206895976b34172fbde0e9fb64b1ac302041e8d7d7147ccdb2a4"
INDEX = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
KEEP = (
    "warpconvnet/constants.py",
    "warpconvnet/utils/__init__.py",
    "warpconvnet/utils/ntuple.py",
    "warpconvnet/utils/benchmark_cache.py",
    "warpconvnet/utils/logger.py",
    "warpconvnet/utils/dist.py",
    "tests/utils/test_generic_benchmark_cache.py",
    "LICENSE.md",
)


def sdist_url() -> str:
    with urllib.request.urlopen(f"{INDEX}/warpconvnet/", timeout=60) as r:
        page = r.read().decode("utf-8", "replace")
    for href in re.findall(r'href="([^"]+)"', page):
        if f"warpconvnet-{VERSION}.tar.gz" in href:
            return (
                href.split("#", 1)[0]
                if href.startswith("http")
                else urllib.parse.urljoin(f"{INDEX}/warpconvnet/", href.split("#", 1)[0])
            )
    raise SystemExit(f"warpconvnet {VERSION} sdist not found in {INDEX}")


def main(dest: pathlib.Path) -> None:
    marker = dest / ".complete"
    if marker.exists():
        return
    url = sdist_url()
    with urllib.request.urlopen(url, timeout=120) as r:
        data = r.read()
    got = hashlib.sha256(data).hexdigest()
    if got != SHA256:
        raise SystemExit(f"{url}: sha256 {got}, expected {SHA256}")
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    prefix = f"warpconvnet-{VERSION}/"
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            name = member.name[len(prefix) :] if member.name.startswith(prefix) else ""
            if name in KEEP and member.isfile():
                out = tmp / name
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(tar.extractfile(member).read())  # type: ignore[union-attr]
    (tmp / "warpconvnet" / "__init__.py").write_text(
        '"""Only the benchmark cache of WarpConvNet (tunecache adapter tests)."""\n'
    )
    missing = [k for k in KEEP if not (tmp / k).exists()]
    if missing:
        raise SystemExit(f"{url}: missing {missing}")
    (tmp / ".complete").write_text(url + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
