#!/usr/bin/env python3
"""Recomputes tunecache's fingerprint test vectors with Python's hashlib and msgpack only.

This is the cross-language check that FORMAT.md's description is enough to reproduce the
fingerprints: it shares no code with the Rust implementation. Exit status 1 on a mismatch.
"""
import hashlib
import json
import pathlib
import sys

import msgpack

KEY_TAG = b"tunecache/key/1\0"
SCOPE_TAG = b"tunecache/scope/1\0"
CANDIDATES_TAG = b"tunecache/candidates/1\0"


def canonical(value):
    """Sorts map keys bytewise, recursively; msgpack-python already picks the smallest ints."""
    if isinstance(value, dict):
        return {k: canonical(value[k]) for k in sorted(value, key=lambda s: s.encode())}
    if isinstance(value, list):
        return [canonical(v) for v in value]
    return value


def pack(value):
    return msgpack.packb(canonical(value), use_bin_type=True)


def fingerprint(tag, data):
    return hashlib.sha256(tag + data).digest()[:16].hex()


def candidate_set(candidates, salt):
    items = sorted({pack({"algo": a, "params": p}) for a, p in candidates})
    n = len(items)
    header = bytes([0x90 | n]) if n < 16 else b"\xdc" + n.to_bytes(2, "big")
    body = b"\x82" + pack("candidates") + header + b"".join(items) + pack("salt") + pack(salt)
    return fingerprint(CANDIDATES_TAG, body)


def main():
    path = pathlib.Path(__file__).with_name("fingerprint_vectors.json")
    vectors = json.loads(path.read_text(encoding="utf-8"))
    failures = 0
    checked = 0
    for kind, tag in (("keys", KEY_TAG), ("scopes", SCOPE_TAG)):
        for v in vectors[kind]:
            data = pack(v["input"])
            got = (data.hex(), fingerprint(tag, data))
            want = (v["canonical"], v["fingerprint"])
            checked += 1
            if got != want:
                failures += 1
                print(f"MISMATCH {kind} {v['input']}: got {got}, want {want}")
    for v in vectors["candidate_sets"]:
        got = candidate_set(v["candidates"], v["salt"])
        checked += 1
        if got != v["checksum"]:
            failures += 1
            print(f"MISMATCH candidate set {v['candidates']}: got {got}, want {v['checksum']}")
    print(f"{checked} fingerprint vectors checked with Python, {failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
