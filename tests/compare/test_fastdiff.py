"""The one-pass block diff gives the float64 path's answers exactly (element-wise counts and the
worst element) and the norms to float32 summation accuracy, on files spanning several blocks."""

from __future__ import annotations

import numpy as np
import pytest

from harness.compare import fastdiff
from harness.compare.fastdiff import ShapeError, UnreadableError, diff_files, exact_stats


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(fastdiff, "BLOCK", 1000)  # several blocks per file


def pair(tmp_path, got, ref, dtype=np.float32):
    np.save(tmp_path / "g.npy", np.asarray(got, dtype))
    np.save(tmp_path / "r.npy", np.asarray(ref, dtype))
    return tmp_path / "g.npy", tmp_path / "r.npy"


@pytest.mark.parametrize("atol,rtol", [(1e-5, 0.0), (1e-6, 1e-4), (0.0, 0.0)])
def test_block_path_matches_float64_path(tmp_path, atol, rtol):
    rng = np.random.default_rng(3)
    ref = rng.normal(0, 0.02, (37, 101)).astype(np.float32)
    got = (ref + rng.normal(0, 4e-6, ref.shape)).astype(np.float32)
    got[5, 7] = ref[5, 7] + np.float32(1e-3)  # the worst element
    got[30, 0] = ref[30, 0] + np.float32(atol)  # on the bound (after float32 rounding)
    g, r = pair(tmp_path, got, ref)
    fast = diff_files(g, r, atol, rtol)
    slow = exact_stats(np.load(g), np.load(r), atol, rtol)
    assert fast.mismatched == slow.mismatched and fast.mismatched > 0
    assert fast.worst_index == slow.worst_index == (5, 7)
    assert (fast.worst_got, fast.worst_ref) == (slow.worst_got, slow.worst_ref)
    assert fast.worst_excess == slow.worst_excess and fast.max_abs_diff == slow.max_abs_diff
    for key in ("ref_norm", "got_norm", "diff_norm"):
        assert getattr(fast, key) == pytest.approx(getattr(slow, key), rel=1e-5)


def test_nonfinite_and_other_dtypes_take_the_exact_path(tmp_path):
    g, r = pair(tmp_path, [1.0, np.nan, np.inf] + [0.0] * 2000, [1.0] * 2003)
    stats = diff_files(g, r, 1e-5, 0.0)
    assert stats.nonfinite == 2 and stats.mismatched == 2002 and stats.worst_index == (1,)
    g, r = pair(tmp_path, [1.0, 2.0], [1.0, 2.5], dtype=np.float64)
    assert diff_files(g, r, 1e-5, 0.0).max_abs_diff == 0.5


def test_cut_short_and_shape_change(tmp_path):
    g, r = pair(tmp_path, np.ones(3000), np.ones(3000))
    g.write_bytes(g.read_bytes()[:-8])
    with pytest.raises(UnreadableError):
        diff_files(g, r, 1e-5, 0.0)
    g.write_bytes(b"junk")
    with pytest.raises(UnreadableError):
        diff_files(g, r, 1e-5, 0.0)
    g, r = pair(tmp_path, np.ones((2, 3)), np.ones((3, 2)))
    with pytest.raises(ShapeError):
        diff_files(g, r, 1e-5, 0.0)


def test_empty_array(tmp_path):
    g, r = pair(tmp_path, np.zeros((0, 4)), np.zeros((0, 4)))
    stats = diff_files(g, r, 1e-5, 0.0)
    assert stats.elements == 0 and stats.worst_index == () and stats.diff_norm == 0.0
