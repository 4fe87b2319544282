"""The type stub of the extension module is checked, not trusted: ``mypy.stubtest`` compares
every name and signature with the built module (and a drifted stub fails it), and what each
property and argument-free method returns is checked against the stub's annotation on live
objects (stubtest cannot see return types)."""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys
import typing

import pytest

import tunecache
from tunecache import _tunecache as ext

STUB = pathlib.Path(ext.__file__).parent / "_tunecache.pyi"


def stubtest(stub_dir: pathlib.Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if stub_dir is not None:
        env["MYPYPATH"] = str(stub_dir)
    return subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "tunecache._tunecache"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=stub_dir or pathlib.Path(__file__).parent,
    )


def test_the_stub_matches_the_module():
    out = stubtest()
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_drifted_signature_fails_the_check(tmp_path):
    package = tmp_path / "tunecache"
    package.mkdir()
    (package / "__init__.pyi").write_text("")
    drifted = STUB.read_text().replace(
        "def get(self, namespace: str, key: Mapping[str, Any]) -> Entry | None: ...",
        "def get(self, ns: str, key: Mapping[str, Any]) -> Entry | None: ...",
    )
    assert drifted != STUB.read_text(), "the stub changed: update the line this test drifts"
    (package / "_tunecache.pyi").write_text(drifted)
    out = stubtest(tmp_path)
    assert out.returncode != 0, out.stdout
    assert "Cache.get" in out.stdout, out.stdout


def annotations(cls: str) -> dict[str, str]:
    """The return annotation of each property and argument-free method of `cls` in the stub."""
    tree = ast.parse(STUB.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    out = {}
    for f in node.body:
        if not isinstance(f, ast.FunctionDef) or f.returns is None or f.name.startswith("_"):
            continue
        positional = [a for a in f.args.args if a.arg != "self"]
        required = len(positional) - len(f.args.defaults)
        is_property = any(isinstance(d, ast.Name) and d.id == "property" for d in f.decorator_list)
        if is_property or required == 0:
            out[f.name] = (ast.unparse(f.returns), is_property)
    return out


def conforms(value: object, hint: object) -> bool:
    if hint is typing.Any:
        return True
    if hint is None or hint is type(None):
        return value is None
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, __import__("types").UnionType):
        return any(conforms(value, a) for a in args)
    if origin is list:
        return isinstance(value, list) and all(conforms(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(conforms(k, args[0]) and conforms(v, args[1]) for k, v in value.items())
    if origin is tuple:
        return (
            isinstance(value, tuple)
            and len(value) == len(args)
            and all(conforms(v, a) for v, a in zip(value, args, strict=True))
        )
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)  # type: ignore[arg-type]


def check(obj: object, cls: str, skip: tuple[str, ...] = ()) -> list[str]:
    names = {**vars(ext), "Path": pathlib.Path, "Any": typing.Any}
    wrong = []
    for name, (text, is_property) in annotations(cls).items():
        if name in skip:
            continue
        hint = eval(text, names)
        value = getattr(obj, name) if is_property else getattr(obj, name)()
        if not conforms(value, hint):
            wrong.append(f"{cls}.{name} returned {value!r}, the stub says {text}")
    return wrong


def test_what_properties_and_methods_return_matches_the_stub(tmp_path):
    cache = ext.Cache("stubapp", 1, path=tmp_path / "c.tcache", scope={"device": "x"})
    entry = cache.put("mm", {"m": 1}, "tiled", {"bm": 64}, median_ns=10.0)
    cache.put("mm", {"m": 1}, "naive", failed="too slow")
    claim = cache.claim("mm", {"m": 1}, 0.0)
    outputs = ext.OutputCache(tmp_path / "out")
    wrong = (
        check(cache, "Cache", skip=("close", "pause_saves", "resume_saves", "refresh", "flush", "publish"))
        + check(entry, "Entry")
        + [w for c in entry.candidates for w in check(c, "Candidate")]
        + check(claim, "Claim", skip=("release",))
        + check(outputs, "OutputCache")
    )
    claim.release()
    cache.close()
    assert not wrong, "\n".join(wrong)


def test_the_exception_classes_are_caught_by_kind(tmp_path):
    with tunecache.Cache("stubapp", path=tmp_path / "c.tcache") as c:
        with pytest.raises(tunecache.RefusedEntryError) as e:
            c.put("mm", {"m": 1}, "x", median_ns=float("nan"))
        assert isinstance(e.value, ValueError) and isinstance(e.value, tunecache.CacheError)
        # A negative median comes from no measurement; shared-tier readers refuse it too.
        with pytest.raises(tunecache.RefusedEntryError, match="negative"):
            c.put("mm", {"m": 2}, "x", median_ns=-1.0)
        assert c.get("mm", {"m": 2}) is None
        line = '{"app": "another", "schema": 1, "scope": {}, "namespace": "mm", "key": {"m": 1}, "candidates": []}'
        with pytest.raises(tunecache.ForeignFileError, match="another"):
            c.import_lines(line)
        newer = line.replace('"another"', '"stubapp"').replace('"schema": 1', '"schema": 9')
        with pytest.raises(tunecache.ForeignFileError, match="newer"):
            c.import_lines(newer)
    assert issubclass(tunecache.LockTimeoutError, TimeoutError)
    assert issubclass(tunecache.SharedTierUnreachableError, ConnectionError)
