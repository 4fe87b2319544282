#!/usr/bin/env python3
"""Runs every vector of this folder through read_all.py and compares what it gives with the
committed <name>.json (as JSON values: key order and spacing do not matter). Exit 0: all agree.

usage: run_vectors.py [FOLDER]
"""
import glob
import json
import os
import subprocess
import sys

import msgpack  # noqa: F401 - what read_all.py needs: missing, this fails before any vector


def main():
    here = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    reader = os.path.join(os.path.dirname(os.path.abspath(__file__)), "read_all.py")
    failed = 0
    tables = sorted(glob.glob(os.path.join(here, "*.tcache")) + glob.glob(os.path.join(here, "*.tcb")))
    if not tables:
        print(f"no vectors in {here}", file=sys.stderr)
        return 1
    for table in tables:
        name = os.path.splitext(os.path.basename(table))[0]
        with open(os.path.join(here, name + ".json"), encoding="utf-8") as f:
            want = json.load(f)
        out = subprocess.run([sys.executable, reader, table], capture_output=True, text=True)
        got = json.loads(out.stdout)
        if got != want:
            failed += 1
            print(f"{name}: the reader gives something else\n  got:  {json.dumps(got)[:2000]}\n  want: {json.dumps(want)[:2000]}\n{out.stderr}")
        else:
            print(f"{name}: ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
