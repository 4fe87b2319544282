#!/usr/bin/env python3
"""An independent reader of a format 4 table, written from FORMAT.md ("Table file (format 4)")
with Python's zlib, hashlib, struct and msgpack only: it shares no code with the Rust
implementation. It finds the current commit from the two slots, walks the B+tree to one key,
checks every block it reads against its reference, and prints the entry as JSON (bytes as
hex).

usage: read_table.py FILE SCOPE_JSON NAMESPACE KEY_JSON
exit 0: found (the entry on stdout); 4: no entry for the key; 1: the file is damaged.
"""
import hashlib
import json
import os
import struct
import sys
import zlib

import msgpack

from check_vectors import KEY_TAG, SCOPE_TAG, fingerprint, pack

NAMESPACE_TAG = b"tunecache/namespace/1\0"
MARKER = b"\x96\xa9tunecache\x04"


class Damaged(Exception):
    pass


def read_block(f, ref, lo, hi):
    """The block `ref` = [offset, len, crc], which must lie between lo and hi."""
    offset, length, crc = ref
    if offset < lo or offset + length > hi:
        raise Damaged(f"block at {offset}+{length} outside {lo}..{hi}")
    f.seek(offset)
    data = f.read(length)
    if len(data) != length or zlib.crc32(data) != crc:
        raise Damaged(f"block at {offset}: length or CRC-32 does not match")
    return data


def current_commit(f, start, size):
    f.seek(16)
    slots = []
    for raw in (f.read(64), f.read(64)):
        seq, offset, length, crc = struct.unpack(">QQII", raw[:24])
        (slot_crc,) = struct.unpack(">I", raw[60:64])
        if zlib.crc32(raw[:60]) == slot_crc and raw[24:60] == bytes(36) and seq != 0:
            slots.append((seq, offset, length, crc))
    for seq, offset, length, crc in sorted(slots, reverse=True):
        try:
            commit = msgpack.unpackb(read_block(f, (offset, length, crc), start, size), raw=False)
        except (Damaged, ValueError):
            continue
        if commit.get("seq") == seq:
            return commit, offset + length
    raise Damaged("no valid slot with a commit that reads back")


def hexed(value):
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {k: hexed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [hexed(v) for v in value]
    return value


def lookup(path, scope, namespace, key):
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(148)
        if head[:12] != MARKER or head[12:16] != b"TBL1":
            raise Damaged("not a format 4 table")
        (header_len,) = struct.unpack(">I", head[144:148])
        header = f.read(header_len)
        (header_crc,) = struct.unpack(">I", f.read(4))
        if zlib.crc32(header) != header_crc:
            raise Damaged("header CRC-32")
        msgpack.unpackb(header, raw=False)
        start = 152 + header_len
        commit, end = current_commit(f, start, size)
        key_fp = bytes.fromhex(fingerprint(KEY_TAG, pack(key)))
        wanted = (
            bytes.fromhex(fingerprint(SCOPE_TAG, pack(scope)))
            + hashlib.sha256(NAMESPACE_TAG + namespace.encode()).digest()[:16]
            + key_fp
        )
        ref = commit["root"]
        height = commit["height"]
        seen = set()
        while ref is not None:
            # A node is visited once, and each is one level below its parent: a node that
            # names itself (or an ancestor), however well its checksum matches, is damage.
            if ref[0] in seen:
                raise Damaged(f"the node at {ref[0]} is on its own path")
            seen.add(ref[0])
            node = read_block(f, ref, start, end)
            kind, node_height, count = node[0], node[1], struct.unpack(">H", node[2:4])[0]
            if node_height != height:
                raise Damaged(f"the node at {ref[0]} has height {node_height}, not {height}")
            if count == 0 or len(node) != 4 + 64 * count:
                raise Damaged(f"the node at {ref[0]} has {count} records in {len(node)} bytes")
            records = []
            for i in range(count):
                rec = node[4 + 64 * i : 4 + 64 * (i + 1)]
                records.append((rec[:48], list(struct.unpack(">QII", rec[48:]))))
            if kind == 0x4C:
                for k, r in records:
                    if k == wanted:
                        entry = msgpack.unpackb(read_block(f, r, start, end), raw=False)
                        if entry["fp"] != key_fp:
                            raise Damaged("the entry holds another key")
                        return entry
                return None
            if kind != 0x49:
                raise Damaged(f"node kind {kind:#x}")
            chosen = records[0][1]
            for k, r in records:
                if k <= wanted:
                    chosen = r
            ref = chosen
            height -= 1
        return None


def main():
    path, scope, namespace, key = sys.argv[1:5]
    try:
        entry = lookup(path, json.loads(scope), namespace, json.loads(key))
    except Damaged as e:
        print(f"damaged: {e}", file=sys.stderr)
        return 1
    if entry is None:
        return 4
    print(json.dumps(hexed(entry), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
