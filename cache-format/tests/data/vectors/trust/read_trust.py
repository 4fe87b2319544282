#!/usr/bin/env python3
"""An independent verifier of signed generations, trust policies and generation pointers,
written from FORMAT.md ("Shared tier", "Signed generations") with Python's standard library
only (ed25519 verification after RFC 8032, section 5.1.7). It decides every case of
cases.json in this folder and compares each decision with the committed `want`.
Exit 0: all agree.

usage: read_trust.py [FOLDER]
"""

import hashlib
import json
import os
import re
import sys
import zlib

# ---- ed25519 (RFC 8032), verification only ----

P = 2**255 - 19
Q = 2**252 + 27742317777372353535851937790883648493
D = -121665 * pow(121666, P - 2, P) % P
SQRT_M1 = pow(2, (P - 1) // 4, P)


def _add(a, b):
    x1, y1, z1, t1 = a
    x2, y2, z2, t2 = b
    aa = (y1 - x1) * (y2 - x2) % P
    bb = (y1 + x1) * (y2 + x2) % P
    cc = 2 * t1 * t2 * D % P
    dd = 2 * z1 * z2 % P
    e, f, g, h = bb - aa, dd - cc, dd + cc, bb + aa
    return (e * f % P, g * h % P, f * g % P, e * h % P)


def _mul(s, pt):
    out = (0, 1, 1, 0)
    while s > 0:
        if s & 1:
            out = _add(out, pt)
        pt = _add(pt, pt)
        s >>= 1
    return out


def _equal(a, b):
    x1, y1, z1, _ = a
    x2, y2, z2, _ = b
    return (x1 * z2 - x2 * z1) % P == 0 and (y1 * z2 - y2 * z1) % P == 0


def _decompress(b):
    if len(b) != 32:
        return None
    y = int.from_bytes(b, "little")
    sign = y >> 255
    y &= (1 << 255) - 1
    if y >= P:
        return None
    x2 = (y * y - 1) * pow(D * y * y + 1, P - 2, P) % P
    if x2 == 0:
        if sign:
            return None
        x = 0
    else:
        x = pow(x2, (P + 3) // 8, P)
        if (x * x - x2) % P != 0:
            x = x * SQRT_M1 % P
        if (x * x - x2) % P != 0:
            return None
        if (x & 1) != sign:
            x = P - x
    return (x, y, 1, x * y % P)


_GY = 4 * pow(5, P - 2, P) % P
BASE = _decompress(_GY.to_bytes(32, "little"))


def ed25519_verifies(public, message, sig):
    """Whether `sig` (64 bytes) is the signature of `message` by `public` (32 bytes)."""
    if len(sig) != 64:
        return False
    a = _decompress(public)
    r = _decompress(sig[:32])
    s = int.from_bytes(sig[32:], "little")
    if a is None or r is None or s >= Q:
        return False
    k = int.from_bytes(hashlib.sha512(sig[:32] + public + message).digest(), "little") % Q
    return _equal(_mul(s, BASE), _add(r, _mul(k, a)))


def small_order(public):
    """Whether the point `public` encodes (its sign bit left out, any y below 2^255, canonical
    or not) has an order dividing 8."""
    y = int.from_bytes(public, "little") & ((1 << 255) - 1)
    for x_sign in (0, 1):
        point = _decompress(((y % P) | (x_sign << 255)).to_bytes(32, "little"))
        if point is not None and _equal(_mul(8, point), (0, 1, 1, 0)):
            return True
    return False


# ---- FORMAT.md, "Signed generations" ----


class Refused(Exception):
    """A generation the policy refuses: the class of the reason."""


class BadPolicy(Exception):
    """A file that is not a trust policy."""


def unhex(text, n):
    if not isinstance(text, str) or not re.fullmatch(f"[0-9a-fA-F]{{{2 * n}}}", text):
        return None
    return bytes.fromhex(text)


def key_id(public):
    return hashlib.sha256(b"tunecache/key/1\x00" + public).digest()[:8].hex()


def read_policy(path):
    try:
        with open(path, "rb") as f:
            file = json.loads(f.read())
        if file.get("kind") != "tunecache-trust-1":
            raise BadPolicy("not a trust policy")
        body = json.loads(file["policy"])
        keys, threshold = body["keys"], body["threshold"]
        version = body["version"]
    except (ValueError, KeyError, TypeError) as e:
        raise BadPolicy(str(e)) from e
    if not isinstance(threshold, int) or not 1 <= threshold <= len(keys):
        raise BadPolicy("a threshold from 1 to the number of keys")
    seen = set()
    for k in keys:
        public = unhex(k.get("public"), 32)
        if public is None or key_id(public) != k.get("key_id"):
            raise BadPolicy("a key whose id is not its key's")
        if small_order(public):
            raise BadPolicy("a key of small order, which verifies forged signatures")
        if k["key_id"] in seen:
            raise BadPolicy("a key named twice")
        seen.add(k["key_id"])
    return {"version": version, "threshold": threshold, "keys": keys, "file": file}


def signers(policy, message, signatures):
    """The distinct keys of the policy whose signature of `message` verifies."""
    good = set()
    for s in signatures:
        for k in policy["keys"]:
            if k["key_id"] == s.get("key_id"):
                sig = unhex(s.get("sig"), 64)
                if sig is not None and ed25519_verifies(bytes.fromhex(k["public"]), message, sig):
                    good.add(k["key_id"])
    return len(good)


def verify(policy, sig_path, bundle, now, highest):
    """The generation's number if the policy trusts it, else raises Refused(class)."""
    if sig_path is None:
        raise Refused("not-signed")
    try:
        with open(sig_path, "rb") as f:
            file = json.loads(f.read())
        if file.get("kind") != "tunecache-signatures-1":
            raise Refused("not-a-signature-file")
        text = file["statement"]
        statement = json.loads(text)
        if statement.get("kind") != "tunecache-statement-1":
            raise Refused("not-a-signature-file")
    except (ValueError, KeyError, TypeError) as e:
        raise Refused("not-a-signature-file") from e
    # The signatures are over the statement's text as kept, never a re-encoding of it.
    message = b"tunecache/statement/1\x00" + text.encode("utf-8")
    if signers(policy, message, file.get("signatures", [])) < policy["threshold"]:
        raise Refused("threshold")
    if statement["bundle_sha256"] != bundle["sha256"]:
        raise Refused("other-bundle")
    if statement["app"] != bundle["app"] or statement["schema"] != bundle["schema"]:
        raise Refused("other-app")
    if statement["scopes"] != bundle["scopes"]:
        raise Refused("other-scopes")
    if statement["expires"] <= now:
        raise Refused("expired")
    if statement["number"] < highest:
        raise Refused("rollback")
    return statement["number"]


def in_force(accepted, given):
    """The policy in force once `given` is offered where `accepted` (or nothing) was taken."""
    if accepted is None or accepted["file"]["policy"] == given["file"]["policy"]:
        return given
    message = b"tunecache/policy/1\x00" + given["file"]["policy"].encode("utf-8")
    rotated = signers(accepted, message, given["file"].get("signatures", []))
    if given["version"] > accepted["version"] and rotated >= accepted["threshold"]:
        return given
    return accepted


# ---- FORMAT.md, "Shared tier": the pointer `generations/current` ----


def is_id(text):
    return isinstance(text, str) and re.fullmatch("[0-9a-f]{64}", text) is not None


def read_pointer(path):
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) > 4096:  # a pointer is at most 4 KiB
        return {"unreadable": "not-a-pointer"}
    try:
        p = json.loads(raw)
        if not isinstance(p, dict):
            raise TypeError("not a JSON object")
        generation = p["generation"]
        if not isinstance(generation, str):
            raise TypeError("generation is not a string")
    except (ValueError, KeyError, TypeError):
        return {"unreadable": "not-a-pointer"}
    if not is_id(generation):
        return {"unreadable": "not-an-id"}
    return {
        "generation": generation,
        "published_at": p.get("published_at", 0),
        "recent": p.get("recent", []),
    }


def bundle_facts(path):
    """The bundle's SHA-256 and what its manifest says (FORMAT.md, "Bundles": version 3 is
    the msgpack array ["TCBUNDLE", 3, bin32 manifest, uint32 CRC-32, bin32 table, uint32
    CRC-32]; read here by its fixed framing, so no msgpack library is needed)."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:11] != b"\x96\xa8TCBUNDLE\x03" or raw[11] != 0xC6:
        raise SystemExit(f"{path}: not a bundle of version 3")
    n = int.from_bytes(raw[12:16], "big")
    manifest_bytes = raw[16 : 16 + n]
    if raw[16 + n] != 0xCE or int.from_bytes(raw[17 + n : 21 + n], "big") != zlib.crc32(manifest_bytes):
        raise SystemExit(f"{path}: its manifest's CRC-32 is not the one written")
    manifest = json.loads(manifest_bytes)
    scopes = [s["fingerprint"] for s in manifest["scopes"]]
    sha = hashlib.sha256(raw).hexdigest()
    return {"sha256": sha, "app": manifest["app"], "schema": manifest["schema"], "scopes": scopes}


def main():
    here = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "cases.json"), encoding="utf-8") as f:
        cases = json.load(f)
    bundle = bundle_facts(os.path.join(here, cases["bundle"]))
    now = cases["now"]

    def at(name):
        return os.path.join(here, name)

    failed = 0

    def report(name, got, want):
        nonlocal failed
        if got != want:
            failed += 1
            print(f"{name}: got {json.dumps(got)}, want {json.dumps(want)}")
        else:
            print(f"{name}: ok")

    for c in cases["verify"]:
        policy = read_policy(at(c["policy"]))
        sig = at(c["signatures"]) if c["signatures"] else None
        try:
            got = {"trusted": verify(policy, sig, bundle, now, c["highest"])}
        except Refused as r:
            got = {"refused": str(r)}
        report(c["name"], got, c["want"])
    for c in cases["policies"]:
        accepted = read_policy(at(c["accepted"])) if c["accepted"] else None
        try:
            given = read_policy(at(c["given"]))
        except BadPolicy:
            report(c["name"], {"bad-policy": True}, c["want"])
            continue
        kept = in_force(accepted, given)
        name = c["given"] if kept is given else c["accepted"]
        report(c["name"], {"in_force": name}, c["want"])
    for c in cases.get("pointers", []):
        got = read_pointer(at(c["file"]))
        if c.get("names_the_bundle"):
            got["names_the_bundle"] = got.get("generation") == bundle["sha256"]
        report(c["name"], got, c["want"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
