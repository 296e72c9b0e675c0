"""The one-pass block diff gives the float64 path's answers exactly (element-wise counts and the
worst element) and the norms to float32 summation accuracy, on files spanning several blocks."""

from __future__ import annotations

import warnings

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


def _oracle(got, ref, atol, rtol) -> dict:
    """Every statistic, element by element in plain Python (the definitions, written apart)."""
    g = [float(x) for x in np.asarray(got, np.float64).ravel()]
    r = [float(x) for x in np.asarray(ref, np.float64).ravel()]
    deltas = [abs(a - b) for a, b in zip(g, r)]
    allowed = [atol + rtol * abs(b) for b in r]
    excess = [d - al if np.isfinite(d) else np.inf for d, al in zip(deltas, allowed)]
    worst = max(range(len(g)), key=lambda i: (excess[i], -i)) if g else 0
    shape = np.shape(got)
    finite = [d for d in deltas if np.isfinite(d)]
    return {
        "shape": tuple(shape), "elements": len(g),
        "mismatched": sum(1 for d, al in zip(deltas, allowed) if not d <= al),
        "nonfinite": sum(1 for a in g if not np.isfinite(a)),
        "max_abs_diff": max(finite) if finite else 0.0,
        "worst_excess": excess[worst] if g else 0.0,
        "worst_index": tuple(int(i) for i in np.unravel_index(worst, shape)) if g else (),
        "worst_got": g[worst] if g else 0.0, "worst_ref": r[worst] if g else 0.0,
        "norms": [sum(x * x for x in v) ** 0.5 for v in (r, g, [a - b for a, b in zip(g, r)])],
    }


def _nan_equal(d: dict) -> dict:
    return {k: "nan" if isinstance(v, float) and np.isnan(v) else v for k, v in d.items()}


def _as_oracle(stats) -> dict:
    out = {k: getattr(stats, k) for k in ("shape", "elements", "mismatched", "nonfinite",
                                            "max_abs_diff", "worst_excess", "worst_index",
                                            "worst_got", "worst_ref")}
    out["norms"] = [stats.ref_norm, stats.got_norm, stats.diff_norm]
    return out


@pytest.mark.parametrize("kind", ["float64", "fortran", "nan", "inf", "ref_nan", "tie",
                                  "scalar", "empty", "over_float32", "inf_both",
                                  "over_float64", "all_nan"])
@pytest.mark.parametrize("atol,rtol", [(0.25, 0.0), (0.0, 0.5)])
def test_every_statistic_against_the_definitions(tmp_path, kind, atol, rtol):
    ref = np.array([[1.0, -2.0, 0.5], [4.0, 0.0, -0.25]])
    got = ref + np.array([[0.5, 0.0, -1.0], [0.0, 0.125, 0.0]])
    dtype, order = np.float32, "C"
    if kind == "float64":
        dtype = np.float64
    elif kind == "fortran":
        order = "F"
    elif kind == "nan":
        got[1, 0] = np.nan
    elif kind == "inf":
        got[0, 2] = -np.inf
    elif kind == "ref_nan":
        ref[0, 1] = np.nan
    elif kind == "tie":
        got = ref + np.array([[0.5, 0.0, 0.5], [0.0, 0.0, 0.0]])
        ref[0, 2] = 1.0  # the same excess twice: the first is the worst
        got[0, 2] = 1.5
    elif kind == "scalar":
        got, ref = np.array(3.0), np.array(2.0)
    elif kind == "empty":
        got, ref = np.zeros((0, 3)), np.zeros((0, 3))
    elif kind == "over_float32":
        got, ref = np.array([3e38, 1.0]), np.array([-3e38, 1.0])  # squares beyond float32
    elif kind == "inf_both":
        got[0, 0] = ref[0, 0] = np.inf  # inf - inf: NaN, a mismatch
    elif kind == "all_nan":
        got[:] = np.nan  # no finite difference at all: max |diff| 0, every element mismatched
    elif kind == "over_float64":
        dtype = np.float64
        got[0, 0], ref[0, 0] = 1e200, -1e200  # squares beyond float64
    np.save(tmp_path / "g.npy", np.asarray(got, dtype, order=order))
    np.save(tmp_path / "r.npy", np.asarray(ref, dtype, order=order))
    g32 = np.load(tmp_path / "g.npy")
    r32 = np.load(tmp_path / "r.npy")
    want = _oracle(g32, r32, atol, rtol)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NaN / inf are answers here, not warnings for the user
        answers = (diff_files(tmp_path / "g.npy", tmp_path / "r.npy", atol, rtol),
                   exact_stats(g32, r32, atol, rtol))
    for stats in answers:
        have = _as_oracle(stats)
        norms, want_norms = have.pop("norms"), want["norms"]
        assert _nan_equal(have) == _nan_equal({k: v for k, v in want.items() if k != "norms"}), kind
        for a, b in zip(norms, want_norms):
            assert (np.isnan(a) and np.isnan(b)) or a == pytest.approx(b, rel=1e-12), kind


def test_a_pickled_or_reshaped_run_file_is_refused_with_its_name(tmp_path):
    np.save(tmp_path / "r.npy", np.zeros(2, np.float64))
    np.save(tmp_path / "g.npy", np.array([{"x": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(UnreadableError) as error:
        diff_files(tmp_path / "g.npy", tmp_path / "r.npy", 1e-5, 0.0)
    assert str(error.value).startswith(f"{tmp_path / 'g.npy'}: ") and "pickle" in str(error.value)
    np.save(tmp_path / "g.npy", np.zeros(2, np.float64))
    np.save(tmp_path / "r.npy", np.array([{"x": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="pickle"):  # nor a reference's
        diff_files(tmp_path / "g.npy", tmp_path / "r.npy", 1e-5, 0.0)
    with pytest.raises(ShapeError) as shape:
        exact_stats(np.zeros((3,)), np.zeros((2, 1)), 1e-5, 0.0)
    assert (shape.value.got, shape.value.ref) == ((3,), (2, 1))
    assert str(shape.value) == "shape (3,), reference (2, 1)"


def test_float32_files_take_the_block_path_and_others_the_float64_one(tmp_path, monkeypatch):
    # The block path is the 15x faster one: a float32 C-order file must never fall back.
    rng = np.random.default_rng(0)
    ref = rng.normal(0, 1, 2500).astype(np.float32)
    g, r = pair(tmp_path, ref + np.float32(1e-3), ref)
    want = exact_stats(np.load(g), np.load(r), 1e-5, 1e-3)

    def refuse(*args):
        raise AssertionError("the float64 path ran")

    monkeypatch.setattr(fastdiff, "exact_stats", refuse)
    for atol, rtol in ((1e-5, 1e-3), (1e-5, 0.0)):
        assert diff_files(g, r, atol, rtol).mismatched > 0
    one_g, one_r = tmp_path / "one_g.npy", tmp_path / "one_r.npy"
    np.save(one_g, np.ones(1, np.float32))
    np.save(one_r, np.zeros(1, np.float32))
    assert diff_files(one_g, one_r, 1e-5, 0.0).mismatched == 1  # one element: still the block path
    assert diff_files(g, r, 1e-5, 1e-3).mismatched == want.mismatched
    for got, reference in ((np.asarray(ref, np.float64), ref), (ref, np.asarray(ref, np.float64)),
                           (np.asfortranarray(np.tile(ref, (2, 1))), np.tile(ref, (2, 1))),
                           (np.tile(ref, (2, 1)), np.asfortranarray(np.tile(ref, (2, 1))))):
        np.save(tmp_path / "g.npy", got)
        np.save(tmp_path / "r.npy", reference)
        with pytest.raises(AssertionError, match="the float64 path ran"):
            diff_files(tmp_path / "g.npy", tmp_path / "r.npy", 1e-5, 0.0)


@pytest.mark.parametrize("rtol", [0.0, 0.5])
def test_just_above_the_bound_is_a_mismatch_and_ties_go_to_the_first(tmp_path, rtol):
    # atol 1 on a zero reference: |d| = 1 + 2**-23 is over the bound by one float32 step, far
    # inside the band float32 re-checks in float64 (1e-5 of the bound). Two equal worst
    # differences in different blocks (1000 elements each): the first is the worst.
    ref = np.zeros(2500, np.float32)
    got = ref.copy()
    got[7] = 1 + 2.0**-23
    got[10] = got[2010] = 3.0
    if rtol:  # where rtol * |ref| dwarfs atol: 1 + 0.5 * 8 = 5, and 13 + 2**-20 is one step over
        ref[20], got[20] = 8.0, 13 + 2.0**-20
    g, r = pair(tmp_path, got, ref)
    stats = diff_files(g, r, 1.0, rtol)
    assert stats.mismatched == (4 if rtol else 3)
    assert stats.worst_index == (10,) and stats.max_abs_diff == (5 + 2.0**-20 if rtol else 3.0)
    exactly = got.copy()
    exactly[7] = 1.0
    g, r = pair(tmp_path, exactly, ref)
    assert diff_files(g, r, 1.0, rtol).mismatched == (3 if rtol else 2)


def test_npy_versions_and_the_texts_of_unreadable_files(tmp_path):
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    for version in ((1, 0), (2, 0)):
        with open(tmp_path / "g.npy", "wb") as f:
            np.lib.format.write_array(f, values + 1, version=version)
        with open(tmp_path / "r.npy", "wb") as f:
            np.lib.format.write_array(f, values, version=version)
        stats = diff_files(tmp_path / "g.npy", tmp_path / "r.npy", 0.5, 0.0)
        assert (stats.mismatched, stats.max_abs_diff, stats.worst_index) == (6, 1.0, (0, 0))
    header = (tmp_path / "g.npy").read_bytes()
    (tmp_path / "g.npy").write_bytes(header[:6] + bytes([3, 0]) + header[8:])
    with pytest.raises(UnreadableError) as error:
        diff_files(tmp_path / "g.npy", tmp_path / "r.npy", 0.5, 0.0)
    assert str(error.value) == "unsupported .npy version (3, 0)"
    with pytest.raises(ValueError) as error:
        diff_files(tmp_path / "r.npy", tmp_path / "g.npy", 0.5, 0.0)
    assert str(error.value) == "unsupported .npy version (3, 0)"
    np.save(tmp_path / "g.npy", values)
    (tmp_path / "g.npy").write_bytes((tmp_path / "g.npy").read_bytes()[:-4])
    with pytest.raises(UnreadableError) as error:
        diff_files(tmp_path / "g.npy", tmp_path / "r.npy", 0.5, 0.0)
    assert str(error.value) == "the run's file holds 20 bytes of data, 24 expected for shape (2, 3)"
    np.save(tmp_path / "g.npy", values)
    (tmp_path / "r.npy").write_bytes((tmp_path / "g.npy").read_bytes() + b"1234")
    with pytest.raises(ValueError) as error:
        diff_files(tmp_path / "g.npy", tmp_path / "r.npy", 0.5, 0.0)
    assert str(error.value) == ("the reference's file holds 28 bytes of data, 24 expected for "
                                "shape (2, 3)")
    with pytest.raises(UnreadableError) as error:
        diff_files(tmp_path / "missing.npy", tmp_path / "g.npy", 0.5, 0.0)
    assert "No such file or directory" in str(error.value) and "missing.npy" in str(error.value)
