#!/usr/bin/env python3
"""An independent whole-cache reader of format 4, written from FORMAT.md with Python's zlib,
hashlib, struct and msgpack only (it shares no code with the Rust implementation): the table's
current commit, every entry of its tree (each node visited once, each block checked), the
directory's scopes and names, then the journal's records (if its base is the table's lineage)
merged in by FORMAT.md's "Merging" rule and ranked by its "Ranking" rule. Prints
{"entries": [...]} (each entry as a JSON line of `tunecache export`, sorted by namespace and key
fingerprint), or {"damaged": true} and the reason on stderr (exit 1).

usage: read_all.py TABLE [JOURNAL]
"""

import hashlib
import json
import os
import struct
import sys
import zlib

import msgpack

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from check_vectors import KEY_TAG, SCOPE_TAG, fingerprint, pack  # noqa: E402
from read_table import MARKER, NAMESPACE_TAG, Damaged, current_commit, read_block  # noqa: E402


class NamedTwice(Damaged):
    """A node the tree names a second time (a node has one parent)."""


KINDS = {"measured": 0, "imported": 1, "remote": 2}
STATUS_RANK = {"chosen": 0, "ok": 1, "failed": 2}


def walk(f, commit, start, end):
    """Every (table key, entry map) of the tree, in key order."""
    out = []
    if commit["root"] is None:
        return out
    seen = set()

    def visit(ref, height):
        if ref[0] in seen:
            raise NamedTwice(f"the node at {ref[0]} is named twice")
        seen.add(ref[0])
        node = read_block(f, ref, start, end)
        kind, node_height, count = node[0], node[1], struct.unpack(">H", node[2:4])[0]
        if node_height != height or count == 0 or len(node) != 4 + 64 * count:
            raise Damaged(f"the node at {ref[0]} is malformed")
        for i in range(count):
            rec = node[4 + 64 * i : 4 + 64 * (i + 1)]
            key, child = rec[:48], list(struct.unpack(">QII", rec[48:]))
            if kind == 0x4C:
                entry = msgpack.unpackb(read_block(f, child, start, end), raw=False)
                if entry["fp"] != key[32:]:
                    raise Damaged("an entry holds another key")
                out.append((key, entry))
            elif kind == 0x49:
                visit(child, height - 1)
            else:
                raise Damaged(f"node kind {kind:#x}")

    visit(commit["root"], commit["height"])
    keys = [k for k, _ in out]
    if keys != sorted(set(keys)):
        raise Damaged("keys out of order")
    return out


def identity(c):
    return c["algo"].encode() + b"\0" + pack(c["params"])


def policy_bytes(p):
    return b"" if p is None else pack(p)


def newer(a, b):
    """Whether version `a` of a candidate is kept over `b`."""
    if a["measured_at"] != b["measured_at"]:
        return a["measured_at"] > b["measured_at"]
    sa, sb = a["status"], b["status"]
    if sa == sb == "ok":
        for field, larger in (("samples", True), ("median_ns", False), ("min_ns", False), ("spread_ns", False)):
            if a[field] != b[field]:
                return (a[field] > b[field]) == larger
    elif sa == sb:
        text = "error" if sa == "failed" else "chosen_by"
        if a[text] != b[text]:
            return a[text].encode() > b[text].encode()
    elif STATUS_RANK[sa] != STATUS_RANK[sb]:
        return STATUS_RANK[sa] > STATUS_RANK[sb]
    ta, tb = a.get("tuning_ns"), b.get("tuning_ns")
    if ta != tb:
        return tb is None or (ta is not None and ta > tb)
    return policy_bytes(a.get("policy")) > policy_bytes(b.get("policy"))


def header_key(e):
    kind = e["origin"]["kind"]
    return (e["recorded_at"], e["candidate_set"], KINDS[kind], e["origin"]["from"].encode())


def merge(a, b):
    out = dict(a if header_key(a) >= header_key(b) else b)
    cands = {identity(c): c for c in a["candidates"]}
    for c in b["candidates"]:
        have = cands.get(identity(c))
        if have is None or newer(c, have):
            cands[identity(c)] = c
    out["candidates"] = rank(list(cands.values()))
    return out


PRECISION = ("samples", "warmup_ns", "warmup_runs")


def comparable(p):
    return None if p is None else {k: v for k, v in p.items() if k not in PRECISION}


def rank(cands):
    """FORMAT.md "Ranking"."""
    measured = [c for c in cands if c["status"] == "ok"]
    lead = None
    if measured and any(comparable(c.get("policy")) != comparable(measured[0].get("policy")) for c in measured):
        lead = max(measured, key=lambda c: (c["measured_at"], policy_bytes(comparable(c.get("policy")))))
        lead = comparable(lead.get("policy"))
    measured.sort(
        key=lambda c: (
            lead is not None and comparable(c.get("policy")) != lead,
            c["median_ns"],
            c["min_ns"],
            identity(c),
        )
    )
    chosen = sorted((c for c in cands if c["status"] == "chosen"), key=lambda c: (-c["measured_at"], identity(c)))
    failed = sorted((c for c in cands if c["status"] == "failed"), key=identity)
    return measured + chosen + failed


def _uint(data, pos):
    """A msgpack unsigned integer at `pos`: (value, end), or None."""
    if pos >= len(data):
        return None
    t = data[pos]
    if t <= 0x7F:
        return t, pos + 1
    width = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}.get(t)
    if width is None or pos + 1 + width > len(data):
        return None
    return int.from_bytes(data[pos + 1 : pos + 1 + width], "big"), pos + 1 + width


def frame(data, pos):
    """The record frame `[payload: bin, crc: uint]` at `pos`: (payload, crc, end), or None
    when the bytes there are not one (not an array of 2, not a bin, running past the end)."""
    t = data[pos] if pos < len(data) else None
    if t == 0x92:
        at = pos + 1
    elif t == 0xDC and data[pos + 1 : pos + 3] == b"\x00\x02":
        at = pos + 3
    elif t == 0xDD and data[pos + 1 : pos + 5] == b"\x00\x00\x00\x02":
        at = pos + 5
    else:
        return None
    width = {0xC4: 1, 0xC5: 2, 0xC6: 4}.get(data[at] if at < len(data) else None)
    if width is None or at + 1 + width > len(data):
        return None
    length = int.from_bytes(data[at + 1 : at + 1 + width], "big")
    start = at + 1 + width
    if start + length > len(data):
        return None
    crc = _uint(data, start + length)
    if crc is None:
        return None
    return data[start : start + length], crc[0], crc[1]


def resync(data, broken):
    """The first later position that starts a frame whose CRC-32 matches (FORMAT.md)."""
    for p in range(broken + 1, len(data)):
        if data[p] == 0x92:
            f = frame(data, p)
            if f is not None and zlib.crc32(f[0]) == f[1]:
                return p
    return None


def reframe(data, start, to):
    """Records laid out as tunecache writes them (0x92 0xc6 <len:4> <payload> 0xce <crc:4>), one
    after another from `start` to at most `to`, found by their CRC-32s alone (their framing
    bytes are not trusted): from each start, the first end where the CRC-32 of the bytes in the
    payload's place equals the 4 bytes after the marker's place and those bytes are one msgpack
    value. Their payloads, and where the last ends (`start` if none)."""
    found = []
    while to >= start + 11:
        body = start + 6
        crc = 0
        for x in range(body, to - 4):
            if x > body and crc == int.from_bytes(data[x + 1 : x + 5], "big") and _one_value(data[body:x]):
                found.append(data[body:x])
                start = x + 5
                break
            crc = zlib.crc32(data[x : x + 1], crc)
        else:
            break
    return found, start


def _one_value(payload):
    try:
        msgpack.unpackb(payload, raw=False)
    except Exception:  # noqa: BLE001 - not one value
        return False
    return True


def _sound(payload, crc):
    return zlib.crc32(payload) == crc and _one_value(payload)


def journal_records(data, pos):
    """The payloads of the journal's records from `pos` (FORMAT.md, "Journal file"): a record
    whose CRC-32 fails is skipped; bytes that do not form a record are damage if an intact
    record follows, else a torn tail; records whole but for their frames are read by their
    CRC-32s. Also how many damaged places were found."""
    records, damage = [], 0
    while pos < len(data):
        f = frame(data, pos)
        if f is not None:
            payload, crc, end = f
            if _sound(payload, crc):
                records.append(payload)
                pos = end
                continue
            damage += 1
            nxt = resync(data, pos)
            beyond = len(data) if nxt is None else nxt
            ends = [end, beyond] if (end == len(data) or frame(data, end) is not None) and end != beyond else [beyond]
            for to in ends:
                found, stop = reframe(data, pos, to)
                if found and stop == to:
                    records.extend(found)
                    pos = to
                    break
            else:
                pos = end
            continue
        nxt = resync(data, pos)
        to = len(data) if nxt is None else nxt
        found, stop = reframe(data, pos, to)
        records.extend(found)
        damage += 1 if found or nxt is not None else 0
        if found and nxt is not None and stop < nxt:
            damage += 1
        if nxt is not None:
            pos = nxt
            continue
        break  # the rest, from `stop`, is a torn tail: an interrupted append
    return records, damage


JOURNAL_DAMAGE = [0]


def read_journal(path, lineage):
    """The journal's entries, record by record: (scope fields, namespace, entry)."""
    with open(path, "rb") as f:
        data = f.read()
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(data)
    head = unpacker.unpack()
    start = unpacker.tell()
    if head[0] != "tunecache-journal" or zlib.crc32(head[2]) != head[3]:
        raise Damaged("not a journal, or its header's CRC-32 fails")
    header = msgpack.unpackb(head[2], raw=False)
    if header["base"] != lineage:
        return []
    records, JOURNAL_DAMAGE[0] = journal_records(data, start)
    out = []
    for payload in records:
        for s in msgpack.unpackb(payload, raw=False)["scopes"]:
            for ns, entries in s["namespaces"].items():
                out.extend((s["scope"], ns, e) for e in entries)
    return out


def tkey(scope, ns, fp):
    return (
        bytes.fromhex(fingerprint(SCOPE_TAG, pack(scope)))
        + hashlib.sha256(NAMESPACE_TAG + ns.encode()).digest()[:16]
        + fp
    )


def line(app, schema, scope, ns, e):
    return {
        "app": app,
        "schema": schema,
        "scope": scope,
        "namespace": ns,
        "key": e["key"],
        "fingerprint": e["fp"].hex(),
        "candidate_set": e["candidate_set"].hex(),
        "recorded_at": e["recorded_at"],
        "origin": e["origin"],
        "candidates": e["candidates"],
    }


def read_all(table, journal=None):
    size = os.path.getsize(table)
    with open(table, "rb") as f:
        head = f.read(148)
        if head[:12] != MARKER or head[12:16] != b"TBL1":
            raise Damaged("not a format 4 table")
        (header_len,) = struct.unpack(">I", head[144:148])
        header_bytes = f.read(header_len)
        (header_crc,) = struct.unpack(">I", f.read(4))
        if zlib.crc32(header_bytes) != header_crc:
            raise Damaged("header CRC-32")
        header = msgpack.unpackb(header_bytes, raw=False)
        start = 152 + header_len
        commit, end = current_commit(f, start, size)
        directory = msgpack.unpackb(read_block(f, commit["dir"], start, end), raw=False)
        scopes = {}
        for s in directory["scopes"]:
            if bytes.fromhex(fingerprint(SCOPE_TAG, pack(s["scope"]))) != s["fp"]:
                raise Damaged("a directory scope under another fingerprint")
            scopes[s["fp"]] = s["scope"]
        names = {}
        for h, name in directory["names"]:
            if hashlib.sha256(NAMESPACE_TAG + name.encode()).digest()[:16] != h:
                raise Damaged("a namespace name under another hash")
            names[h] = name
        entries = {}
        for key, e in walk(f, commit, start, end):
            if bytes.fromhex(fingerprint(KEY_TAG, pack(e["key"]))) != e["fp"]:
                raise Damaged("an entry whose fp is not its key's fingerprint")
            entries[key] = (scopes[key[:16]], names[key[16:32]], e)
    if journal is not None and os.path.exists(journal):
        for scope, ns, e in read_journal(journal, commit["lineage"]):
            k = tkey(scope, ns, e["fp"])
            if k in entries:
                entries[k] = (scope, ns, merge(entries[k][2], e))
            else:
                entries[k] = (scope, ns, dict(e, candidates=rank(e["candidates"])))
    out = [line(header["app"], header["schema"], s, ns, e) for s, ns, e in entries.values()]
    out.sort(key=lambda v: (json.dumps(v["namespace"]), json.dumps(v["fingerprint"])))
    return out


def read_bundle(path):
    """A bundle of version 3 (FORMAT.md, "Bundles"): its framing, CRCs and SHA-256 checked, its
    manifest (without the free `tool`) and its inner table's entries."""
    with open(path, "rb") as f:
        data = f.read()
    items = msgpack.unpackb(data, raw=False)
    if not (isinstance(items, list) and len(items) == 6 and items[0] == "TCBUNDLE" and items[1] == 3):
        raise Damaged("not a bundle of version 3")
    manifest_bytes, manifest_crc, table, table_crc = items[2:]
    if zlib.crc32(manifest_bytes) != manifest_crc or zlib.crc32(table) != table_crc:
        raise Damaged("a bundle part's CRC-32 does not match")
    manifest = json.loads(manifest_bytes.decode("utf-8"))
    if hashlib.sha256(table).hexdigest() != manifest["payload_sha256"]:
        raise Damaged("the inner table's SHA-256 is not the manifest's")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        inner = os.path.join(tmp, "inner.tcache")
        with open(inner, "wb") as f:
            f.write(table)
        entries = read_all(inner)
    manifest.pop("tool", None)
    return {"manifest": manifest, "entries": entries}


def main():
    table = sys.argv[1]
    journal = sys.argv[2] if len(sys.argv) > 2 else table + ".journal"
    if table.endswith(".tcb"):
        try:
            print(json.dumps(read_bundle(table)))
        except (Damaged, ValueError, KeyError, TypeError) as e:
            print(f"damaged: {e}", file=sys.stderr)
            print(json.dumps({"damaged": "checksum" if "CRC-32" in str(e) else "malformed"}))
            return 1
        return 0
    try:
        entries = read_all(table, journal)
    except NamedTwice as e:
        print(f"damaged: {e}", file=sys.stderr)
        print(json.dumps({"damaged": "node-named-twice"}))
        return 1
    except Damaged as e:
        # A block whose length or CRC-32 does not match what its referrer holds.
        print(f"damaged: {e}", file=sys.stderr)
        print(json.dumps({"damaged": "checksum" if "CRC-32" in str(e) else "malformed"}))
        return 1
    except (ValueError, KeyError, TypeError, IndexError) as e:
        print(f"damaged: {e}", file=sys.stderr)
        print(json.dumps({"damaged": "malformed"}))
        return 1
    out = {"entries": entries}
    if JOURNAL_DAMAGE[0]:
        out["journal_damage"] = JOURNAL_DAMAGE[0]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
