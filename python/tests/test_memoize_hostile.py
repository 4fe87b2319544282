"""``@memoize`` under hostile inputs (issue 24): every kind of argument has its own tag, so no
input is served another's output; the cache's own failures never fail the call; batch rows
are stored as their own bytes."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

import tunecache


def _counted(tmp_path, name="f"):
    calls = []

    @tunecache.memoize(dir=tmp_path / "out", name=name)
    def f(x):
        calls.append(1)
        return repr(type(x).__name__) + repr(x)

    return f, calls


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
def test_inputs_alike_in_bytes_but_not_in_kind_never_share_an_output(tmp_path):
    """Case 16: a masked array was hashed as its data, a list as the bytes of its encoding,
    {"a": None} as {}, and np.matrix as its 2-D array."""
    f, calls = _counted(tmp_path)
    data = np.arange(6.0)
    pairs = [
        (np.ma.masked_array(data, mask=[0, 1, 0, 0, 0, 0]), data),
        (np.ma.masked_array(data, mask=[0, 1, 0, 0, 0, 0]), np.ma.masked_array(data, mask=[0, 0, 1, 0, 0, 0])),
        (np.ma.masked_array(data, fill_value=1.0), np.ma.masked_array(data, fill_value=2.0)),
        ([1, 2], tunecache._tunecache.canonical_key({"v": [1, 2]})),
        ({"a": None}, {}),
        (np.matrix([[1, 2], [3, 4]]), np.array([[1, 2], [3, 4]])),
        ((1, 2), [1, 2]),
        (np.float64(1.0), np.array(1.0)),
        ([np.float32(1.0)], [np.array(1.0, dtype=np.float32)]),
        ({"k": [None]}, {"k": []}),
        ([1.5, None], [1.5]),
    ]
    for a, b in pairs:
        assert f.key(a) != f.key(b), (a, b)
        assert f(a) != f(b) or repr(a) == repr(b), (a, b)
    # Equal inputs still share: a masked array with the same data, mask and fill value.
    before = len(calls)
    f(np.ma.masked_array(data, mask=[0, 1, 0, 0, 0, 0]))
    f({"a": None})
    f([1.5, None])
    assert len(calls) == before, "equal inputs hit"


def test_array_subclasses_that_may_hide_state_are_refused(tmp_path):
    class Tagged(np.ndarray):
        pass

    f, _ = _counted(tmp_path)
    with pytest.raises(TypeError, match="subclass.*key="):
        f(np.arange(3).view(Tagged))
    with pytest.raises(TypeError, match="deeper than"):
        nested: list = []
        for _ in range(40):
            nested = [nested]
        f(nested)

    @tunecache.memoize(dir=tmp_path / "b", batch=0)
    def rows(batch):
        return batch

    with pytest.raises(TypeError, match="batch mode takes a plain"):
        rows(np.ma.masked_array(np.ones((2, 2))))


class _Fussy:
    """Pickles, but never loads back."""

    def __reduce__(self):
        return (_fail_on_load, ())


def _fail_on_load():
    raise RuntimeError("cannot be loaded")


def test_the_caches_own_failures_never_fail_the_call(tmp_path, caplog):
    """Case 15: an output cache that cannot be opened, a value that cannot be stored or read
    back: the call computes and returns, with one warning; the function's own errors still
    reach the caller."""
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("mine")

    @tunecache.memoize(dir=not_a_folder)
    def double(x):
        return x * 2

    with caplog.at_level(logging.WARNING, logger="tunecache"):
        assert double(21) == 42 and double(21) == 42
    assert caplog.text.count("without a cache") == 1
    assert not_a_folder.read_text() == "mine"
    assert double.stats()["computed"] == 0

    seen = []

    @tunecache.memoize(dir=tmp_path / "out")
    def awkward(kind):
        seen.append(kind)
        if kind == "generator":
            return (i for i in range(3))
        if kind == "fussy":
            return _Fussy()
        raise ValueError("the function's own error")

    with caplog.at_level(logging.WARNING, logger="tunecache"):
        assert list(awkward("generator")) == [0, 1, 2]
        assert isinstance(awkward("fussy"), _Fussy)
        assert isinstance(awkward("fussy"), _Fussy)
    assert seen == ["generator", "fussy", "fussy"], "stored but unreadable: computed again"
    assert "uncached" in caplog.text
    with pytest.raises(ValueError, match="own error"):
        awkward("raise")


@pytest.mark.torch
def test_batch_rows_of_torch_outputs_are_stored_as_their_own_bytes(tmp_path):
    """Case 17: each row was pickled with the whole batch's storage (a 64 KB row of an 8-row
    batch stored as 512 KB)."""
    torch = pytest.importorskip("torch")
    out = tmp_path / "out"

    seen = []

    @tunecache.memoize(dir=out, batch=0)
    def embed(batch):
        seen.append(len(batch))
        return batch * 2.0

    batch = torch.arange(8 * 16384, dtype=torch.float32).reshape(8, 16384)  # 64 KiB rows
    assert torch.equal(embed(batch), batch * 2.0)
    sizes = [e.stat().st_size for e in out.rglob("*") if e.is_file() and e.stat().st_size > 4096]
    assert len(sizes) == 8, sizes
    assert max(sizes) < 80 << 10, f"a 64 KiB row is stored in {max(sizes)} bytes"
    assert torch.equal(embed(batch), batch * 2.0), "read back whole"
    assert seen == [8], "the second call computed nothing"

    # A torch tensor and a numpy array of the same bytes are different inputs.
    @tunecache.memoize(dir=out)
    def kind(x):
        return type(x).__name__

    assert kind(torch.ones(3)) == "Tensor" and kind(np.ones(3, dtype=np.float32)) == "ndarray"
    assert os.path.isdir(out)
