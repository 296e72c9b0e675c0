"""harness.compare.tp_shards and compare_gradients(tensor_parallel=N): an un-gathered TP gradient
file holds one arbitrary TP rank's slice of a sharded parameter and is compared with the slice
of the single-device reference that fits it best; a replicated parameter's file is whole."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.cases import Tolerance
from harness.compare import compare_gradients, match_shard
from harness.compare.tp_shards import ShardMatch, fused_qkv_groups

TOL = Tolerance(1e-6, 0.0)
TP = 4
C, V, VP, T = 16, 50, 52, 8  # VP: GPT-2's vocabulary padded to a multiple of TP (13 rows each)


def rng_for(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def rows(a: np.ndarray, r: int, tp: int = TP) -> np.ndarray:
    return np.split(a, tp, axis=0)[r]


def cols(a: np.ndarray, r: int, tp: int = TP) -> np.ndarray:
    return np.split(a, tp, axis=1)[r]


def qkv(a: np.ndarray, r: int, groups: tuple[int, ...], tp: int = TP) -> np.ndarray:
    """[q_r | k_r | v_r]: part r of each row group, stacked (written here independently of
    tp_shards)."""
    bounds = np.cumsum(groups)[:-1]
    return np.concatenate([np.split(g, tp, axis=0)[r] for g in np.split(a, bounds, axis=0)])


def padded_rows(a: np.ndarray, r: int, padded: int, tp: int = TP, fill: float = 7.0):
    """Rank r's rows of the vocabulary padded to `padded` rows (padding rows hold `fill`: they
    are never compared, whatever they hold)."""
    pad = np.full((padded - a.shape[0],) + a.shape[1:], fill, a.dtype)
    return rows(np.concatenate([a, pad]), r, tp)


# ---- match_shard: every candidate kind ------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_column_parallel_rows(seed):
    rng = rng_for(seed)
    ref = rng.standard_normal((4 * C, C))
    r = int(rng.integers(TP))
    m = match_shard(rows(ref, r), ref, TP)
    assert isinstance(m, ShardMatch)
    assert (m.kind, m.dim, m.rank, m.parts, m.padding, m.groups) == ("slice", 0, r, TP, 0, None)
    assert np.array_equal(m.reference, ref[r * C:(r + 1) * C]) and m.error == 0.0
    assert m.compared.shape == (C, C)
    assert m.describe() == f"rows {r * C}:{(r + 1) * C} of {4 * C} (TP rank {r} of {TP})"
    bias = rng.standard_normal(4 * C)  # c_fc.bias: 1-D, same rows
    assert match_shard(rows(bias, r), bias, TP).rank == r


def test_describe_reads_as_documented():
    ref = np.arange(256 * 2, dtype=np.float32).reshape(256, 2)
    assert match_shard(ref[64:128], ref, 4).describe() == "rows 64:128 of 256 (TP rank 1 of 4)"


@pytest.mark.parametrize("seed", range(4))
def test_fused_qkv_gpt2_three_equal_groups(seed):
    rng = rng_for(seed)
    weight, bias = rng.standard_normal((3 * C, C)), rng.standard_normal(3 * C)
    r = int(rng.integers(TP))
    for ref in (weight, bias):
        m = match_shard(qkv(ref, r, (C, C, C)), ref, TP)
        assert (m.kind, m.rank, m.groups, m.error) == ("grouped", r, (C, C, C), 0.0)
        assert np.array_equal(m.reference, qkv(ref, r, (C, C, C)))
        assert m.describe() == f"q/k/v rows part {r} of {TP} (TP rank {r} of {TP})"
    # the contiguous slices of the same shape are candidates too, and lose: rows r*12:(r+1)*12
    # of [q; k; v] are not [q_r | k_r | v_r]
    assert match_shard(rows(weight, r), weight, TP).kind == "slice"


@pytest.mark.parametrize("seed", range(4))
def test_fused_qkv_gqa_groups_passed(seed):
    # LLaMA 3 GQA: q has C rows, k and v kv*hd = 8 each
    rng = rng_for(seed)
    groups = (C, 8, 8)
    ref = rng.standard_normal((sum(groups), C))
    r = int(rng.integers(TP))
    dumped = qkv(ref, r, groups)
    m = match_shard(dumped, ref, TP, groups)
    assert (m.kind, m.rank, m.groups, m.error) == ("grouped", r, groups, 0.0)
    assert np.array_equal(m.reference, dumped)
    assert m.describe() == f"q/k/v rows part {r} of {TP} (TP rank {r} of {TP})"
    # 32 rows are not three equal groups: without the groups only contiguous slices are tried
    # and none fits (the comparison then fails: never a false pass)
    blind = match_shard(dumped, ref, TP)
    assert blind.kind == "slice" and blind.error > 0.1
    assert fused_qkv_groups(ref.shape) == groups
    assert fused_qkv_groups((3 * C, C)) == (C, C, C)
    assert fused_qkv_groups((C, C)) is None and fused_qkv_groups((3 * C,)) is None
    # groups that do not fit the reference (wrong sum, not divisible by tp) give no candidate
    assert match_shard(dumped, ref, TP, (C, 6, 10)).kind == "slice"
    assert match_shard(dumped, ref, TP, (C, 8, 9)).kind == "slice"


@pytest.mark.parametrize("seed", range(4))
def test_row_parallel_columns(seed):
    rng = rng_for(seed)
    ref = rng.standard_normal((C, 4 * C))  # mlp.c_proj.weight: K = 4C columns
    r = int(rng.integers(TP))
    m = match_shard(cols(ref, r), ref, TP)
    assert (m.kind, m.dim, m.rank, m.error) == ("slice", 1, r, 0.0)
    assert np.array_equal(m.reference, ref[:, r * C:(r + 1) * C])
    assert m.describe() == f"columns {r * C}:{(r + 1) * C} of {4 * C} (TP rank {r} of {TP})"


def test_padded_vocab_last_rank():
    rng = rng_for(0)
    ref = rng.standard_normal((100, 8))
    dumped = padded_rows(ref, 3, 128)  # rows 96:128 of the padded 128: 4 real, 28 padding
    m = match_shard(dumped, ref, 4)
    assert (m.kind, m.dim, m.rank, m.padding, m.error) == ("padded", 0, 3, 28, 0.0)
    assert np.array_equal(m.reference, ref[96:100]) and np.array_equal(m.compared, dumped[:4])
    assert m.describe() == "rows 96:128 of 100 + 28 padding rows (TP rank 3 of 4)"


@pytest.mark.parametrize("seed", range(4))
def test_padded_vocab_any_rank(seed):
    rng = rng_for(seed)
    ref = rng.standard_normal((V, C))
    r = 0 if seed == 0 else int(rng.integers(TP))  # seed 0: the first rank
    n = VP // TP
    m = match_shard(padded_rows(ref, r, VP), ref, TP)
    keep = min(n, V - r * n)
    assert (m.kind, m.rank, m.padding, m.error) == ("padded", r, n - keep, 0.0)
    assert np.array_equal(m.reference, ref[r * n:r * n + keep])
    tail = f" + {n - keep} padding rows" if n - keep else ""
    assert m.describe() == f"rows {r * n}:{(r + 1) * n} of {V}{tail} (TP rank {r} of {TP})"


def test_first_rank_of_padded_vocab_has_no_padding():
    ref = rng_for(5).standard_normal((100, 8))
    m = match_shard(ref[:32], ref, 4)
    assert (m.kind, m.rank, m.padding) == ("padded", 0, 0)
    assert m.describe() == "rows 0:32 of 100 (TP rank 0 of 4)"


def test_no_candidate_fits():
    ref = np.zeros((4 * C, C))
    assert match_shard(np.zeros((10, C)), ref, TP) is None  # 40 rows are no TP cut of 64
    assert match_shard(np.zeros((C, 4)), ref, TP) is None  # two dims differ
    assert match_shard(np.zeros(C), ref, TP) is None  # another number of dims
    assert match_shard(ref, ref, TP) is None  # same shape: not a shard
    assert match_shard(np.zeros((3, C)), np.zeros((V, C)), TP) is None  # 4 x 3 rows cannot hold V = 50
    with pytest.raises(ValueError):
        match_shard(ref[:C], ref, 0)


def test_ties_go_to_the_lowest_rank_and_nonfinite_files_still_match():
    ref = np.ones((4 * C, C))  # every slice is the same: all candidates tie
    m = match_shard(np.ones((C, C)), ref, TP)
    assert (m.kind, m.rank, m.error) == ("slice", 0, 0.0)
    nan = np.full((C, C), np.nan)
    m = match_shard(nan, rng_for(1).standard_normal((4 * C, C)), TP)
    assert m.rank == 0 and m.error == np.inf  # compared anyway: the NaN is reported


# ---- compare_gradients(tensor_parallel=4) on a dump folder ----------------------------------


def dump(folder: Path, arrays: dict):
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in arrays.items():
        np.save(folder / f"{name}.npy", np.asarray(value, np.float32))


H = "transformer.h.0."
REPLICATED = [H + "ln_1.weight", H + "ln_1.bias", H + "ln_2.weight", H + "ln_2.bias",
              H + "attn.c_proj.bias", H + "mlp.c_proj.bias", "transformer.ln_f.weight",
              "transformer.ln_f.bias", "transformer.wpe.weight"]
SHARDED = [H + "attn.c_attn.weight", H + "attn.c_attn.bias", H + "attn.c_proj.weight",
           H + "mlp.c_fc.weight", H + "mlp.c_fc.bias", H + "mlp.c_proj.weight",
           "transformer.wte.weight", "lm_head.weight"]


def reference(seed: int = 0) -> dict:
    rng = rng_for(seed)
    shapes = {H + "ln_1.weight": (C,), H + "ln_1.bias": (C,), H + "ln_2.weight": (C,),
              H + "ln_2.bias": (C,), H + "attn.c_attn.weight": (3 * C, C),
              H + "attn.c_attn.bias": (3 * C,), H + "attn.c_proj.weight": (C, C),
              H + "attn.c_proj.bias": (C,), H + "mlp.c_fc.weight": (4 * C, C),
              H + "mlp.c_fc.bias": (4 * C,), H + "mlp.c_proj.weight": (C, 4 * C),
              H + "mlp.c_proj.bias": (C,), "transformer.ln_f.weight": (C,),
              "transformer.ln_f.bias": (C,), "transformer.wpe.weight": (T, C),
              "transformer.wte.weight": (V, C), "lm_head.weight": (V, C)}
    return {k: (1 + rng.random(s)).astype(np.float32) for k, s in shapes.items()}


def tp_dump(ref: dict, ranks: dict) -> dict:
    """What the TP ranks write: replicated parameters whole, each sharded one as the slice of
    the rank in `ranks` (the one whose write landed last)."""
    out = {k: ref[k] for k in REPLICATED}
    for k in SHARDED:
        r = ranks[k]
        if k.endswith("c_attn.weight") or k.endswith("c_attn.bias"):
            out[k] = qkv(ref[k], r, (C, C, C))
        elif k.endswith("c_proj.weight"):
            out[k] = cols(ref[k], r)
        elif k in ("transformer.wte.weight", "lm_head.weight"):
            out[k] = padded_rows(ref[k], r, VP)
        else:
            out[k] = rows(ref[k], r)
    return out


def run(tmp_path, got: dict, ref: dict, tp: int = TP, relative: float | None = 1e-5):
    dump(tmp_path / "ref", ref)
    dump(tmp_path / "got", got)
    return compare_gradients(tmp_path / "got", tmp_path / "ref", TOL, relative=relative,
                             tensor_parallel=tp)


def random_ranks(seed: int) -> dict:
    rng = rng_for(100 + seed)
    ranks = {k: int(rng.integers(TP)) for k in SHARDED}
    ranks["lm_head.weight"] = TP - 1  # the padded last rank, always covered
    return ranks


@pytest.mark.parametrize("seed", range(3))
def test_tp_dump_passes_and_records_every_slice(tmp_path, seed):
    ref, ranks = reference(seed), random_ranks(seed)
    diff = run(tmp_path, tp_dump(ref, ranks), ref)
    assert diff.ok, diff.to_dict()
    assert not diff.shape_errors and diff.tp_slices == len(SHARDED)
    record = diff.to_dict(worst=100)
    assert record["tp_slices"] == len(SHARDED) and record["ok"]
    by_name = {d.name: d for d in diff.diffs}
    for name in REPLICATED:  # compared whole, no shard in the record
        assert by_name[name].shard is None and "shard" not in by_name[name].to_dict()
        assert by_name[name].elements == ref[name].size
    for name in SHARDED:
        assert f"(TP rank {ranks[name]} of {TP})" in by_name[name].shard
        assert by_name[name].to_dict()["shard"] == by_name[name].shard
    n = VP // TP
    last = by_name["lm_head.weight"]
    assert last.shard == (f"rows {(TP - 1) * n}:{VP} of {V} + {VP - V} padding rows "
                          f"(TP rank {TP - 1} of {TP})")
    assert last.elements == (V - (TP - 1) * n) * C  # the padding rows are not compared
    assert by_name[H + "attn.c_attn.weight"].shard.startswith("q/k/v rows part")
    assert by_name[H + "mlp.c_proj.weight"].shard.startswith("columns ")
    # without the feature the same folder is eight shape errors, and no tp_slices key
    plain = compare_gradients(tmp_path / "got", tmp_path / "ref", TOL)
    assert len(plain.shape_errors) == len(SHARDED) and "tp_slices" not in plain.to_dict()


def test_gqa_c_attn_groups_come_from_the_weight_shape(tmp_path):
    ref = {"model.h.0.attn.c_attn.weight": (1 + rng_for(3).random((C + 16, C))),
           "model.h.0.attn.c_attn.bias": (1 + rng_for(4).random(C + 16))}
    got = {k: qkv(v, 2, (C, 8, 8)) for k, v in ref.items()}
    diff = run(tmp_path, got, ref)
    assert diff.ok and diff.tp_slices == 2
    assert {d.shard for d in diff.diffs} == {f"q/k/v rows part 2 of {TP} (TP rank 2 of {TP})"}


# ---- planted bugs: each fails with the feature on -------------------------------------------


def test_planted_replicated_parameter_off_by_1e_3_fails_and_is_named(tmp_path):
    ref = reference()
    got = tp_dump(ref, random_ranks(0))
    got[H + "ln_1.weight"] = ref[H + "ln_1.weight"] * (1 + 1e-3)
    diff = run(tmp_path, got, ref)
    assert not diff.ok
    assert [d.name for d in diff.mismatched] == [H + "ln_1.weight"]
    assert diff.to_dict()["relative"]["failed"] == [H + "ln_1.weight"]
    assert diff.tp_slices == len(SHARDED)  # the shards still matched


def test_planted_shard_scaled_on_every_rank_fails(tmp_path):
    ref = reference()
    ranks = random_ranks(1)
    name = H + "mlp.c_fc.weight"
    got = tp_dump(ref, ranks)
    got[name] = rows(ref[name] * 1.01, ranks[name])  # all ranks off: every candidate is
    diff = run(tmp_path, got, ref)
    assert not diff.ok and [d.name for d in diff.mismatched] == [name]
    assert diff.to_dict()["relative"]["failed"] == [name]
    bad = next(d for d in diff.diffs if d.name == name)
    assert bad.relative_error == pytest.approx(0.01, rel=1e-3)


def test_planted_shard_of_another_parameter_fails(tmp_path):
    ref = reference()
    ranks = random_ranks(2)
    name = H + "mlp.c_fc.weight"
    got = tp_dump(ref, ranks)
    got[name] = cols(ref[H + "mlp.c_proj.weight"], 1)  # (16, 16): the shape fits, values don't
    assert got[name].shape == rows(ref[name], 0).shape
    diff = run(tmp_path, got, ref)
    assert not diff.ok and [d.name for d in diff.mismatched] == [name]
    assert diff.to_dict()["relative"]["failed"] == [name]


def test_planted_shape_no_candidate_fits_is_a_shape_error(tmp_path):
    ref = reference()
    name = H + "mlp.c_fc.weight"
    got = tp_dump(ref, random_ranks(0))
    got[name] = ref[name][:10]
    diff = run(tmp_path, got, ref)
    assert not diff.ok
    assert diff.shape_errors == [f"{name}: shape (10, {C}), reference ({4 * C}, {C})"]
    assert diff.tp_slices == len(SHARDED) - 1


def test_cut_short_shard_is_unreadable_not_an_error(tmp_path):
    ref = reference()
    name = H + "mlp.c_fc.weight"
    dump(tmp_path / "ref", ref)
    dump(tmp_path / "got", tp_dump(ref, random_ranks(0)))
    path = tmp_path / "got" / f"{name}.npy"
    path.write_bytes(path.read_bytes()[:-8])  # the header still says (16, 16)
    diff = compare_gradients(tmp_path / "got", tmp_path / "ref", TOL, tensor_parallel=TP)
    assert len(diff.shape_errors) == 1
    assert diff.shape_errors[0].startswith(f"{name}: the run's gradient file cannot be read")


def test_known_limit_a_one_rank_bug_in_an_unwritten_shard_passes(tmp_path):
    # THE KNOWN LIMIT of an un-gathered dump: rank 2 computes a wrong c_fc shard, but rank 1's
    # (correct) write is the one that landed in the folder. The file is a correct slice, so the
    # comparison passes; nothing in the folder shows rank 2's bug. Catching it needs the
    # gathered gradient (or one dump per rank). This test pins the behaviour down: it passes.
    ref = reference()
    ranks = random_ranks(0)
    name = H + "mlp.c_fc.weight"
    shards = [rows(ref[name], r) for r in range(TP)]
    shards[2] = shards[2] * 2.0  # the bug, on rank 2 only
    ranks[name] = 1
    got = tp_dump(ref, ranks)
    got[name] = shards[1]  # the rank whose file was written
    diff = run(tmp_path, got, ref)
    assert diff.ok  # escapes: the known limit, not a bug in the comparison
    assert next(d for d in diff.diffs if d.name == name).shard == (
        f"rows {C}:{2 * C} of {4 * C} (TP rank 1 of {TP})")
    # had rank 2's file been the one written, the same bug fails
    got[name] = shards[2]
    assert not run(tmp_path, got, ref).ok


# ---- what the mutation check (benchmarks/mutation.py) found untested ------------------------


def test_a_third_dim_is_named_by_its_index():
    ref = rng_for(6).standard_normal((2, 3, 4 * C))
    m = match_shard(ref[:, :, 2 * C:3 * C], ref, TP)
    assert (m.kind, m.dim, m.rank) == ("slice", 2, 2)
    assert m.describe() == f"dim-2 indices {2 * C}:{3 * C} of {4 * C} (TP rank 2 of {TP})"


def test_groups_other_than_three_are_named_by_their_sizes():
    rng = rng_for(7)
    groups = (C, 8)  # two groups: not q/k/v
    ref = rng.standard_normal((sum(groups), C))
    m = match_shard(qkv(ref, 1, groups), ref, TP, groups)
    assert (m.kind, m.rank, m.groups, m.error) == ("grouped", 1, groups, 0.0)
    assert m.describe() == f"groups {C}/8 rows part 1 of {TP} (TP rank 1 of {TP})"


def test_groups_along_columns_are_cut_along_columns():
    ref = rng_for(8).standard_normal((C, 3 * C))
    dumped = np.concatenate([np.split(g, TP, axis=1)[3] for g in np.split(ref, 3, axis=1)],
                            axis=1)
    m = match_shard(dumped, ref, TP)
    assert (m.kind, m.dim, m.rank, m.error) == ("grouped", 1, 3, 0.0)
    assert np.array_equal(m.reference, dumped)
    assert m.describe() == f"q/k/v columns part 3 of {TP} (TP rank 3 of {TP})"


@pytest.mark.parametrize("width, tp", [(4, 4), (6, 2), (C, TP)])
def test_three_equal_groups_of_any_size_tp_divides(width, tp):
    # 3 x 4 rows at tp 4 (one row of each group a rank), 3 x 6 rows at tp 2 (18: no multiple
    # of 4), GPT-2's 3 x C at tp 4
    ref = rng_for(9).standard_normal((3 * width, 5))
    r = tp - 1
    m = match_shard(qkv(ref, r, (width,) * 3, tp), ref, tp)
    assert (m.kind, m.rank, m.groups, m.error) == ("grouped", r, (width,) * 3, 0.0)


def test_groups_that_do_not_fit_give_no_grouped_candidate():
    rng = rng_for(10)
    # 8 rows at tp 2 are no three equal groups: the contiguous halves only (no crash on a
    # group size that does not add up to the rows)
    ref = rng.standard_normal((8, C))
    m = match_shard(ref[4:], ref, 2)
    assert (m.kind, m.rank, m.error) == ("slice", 1, 0.0)
    # 12 rows at tp 3: three groups of 4, which 3 ranks cannot split evenly
    ref = rng.standard_normal((12, C))
    m = match_shard(ref[4:8], ref, 3)
    assert (m.kind, m.rank, m.error) == ("slice", 1, 0.0)
    # an empty group is no group: (C, 0, C) would compare [q_r | v_r] and name a 0-row k
    ref = rng.standard_normal((2 * C, C))
    m = match_shard(qkv(ref, 1, (C, C)), ref, TP, (C, 0, C))
    assert m.kind == "slice" and m.error > 0.1


def test_a_padded_vocabulary_has_less_than_one_shard_of_padding():
    rng = rng_for(11)
    # 4 x 4 rows for 12: the last rank would hold no row of the reference (nothing compared,
    # an error of 0 whatever the file holds): no candidate
    assert match_shard(rng.standard_normal((4, C)), rng.standard_normal((12, C)), 4) is None
    # 4 x 13 rows for 30: more padding than one shard
    assert match_shard(rng.standard_normal((13, C)), rng.standard_normal((30, C)), 4) is None


def test_tp_1_is_accepted_and_a_smaller_file_is_no_slice_of_it():
    ref = np.ones((4, C))
    assert match_shard(ref, ref, 1) is None and match_shard(ref[:2], ref, 1) is None
    with pytest.raises(ValueError, match="^tp must be >= 1, not 0$"):
        match_shard(ref[:2], ref, 0)


def test_the_error_is_the_relative_norm_of_the_difference_in_float64():
    # float32 values of 1e20: their squares overflow float32 (a norm of inf would make every
    # error 0), not float64
    rng = rng_for(12)
    ref = (rng.standard_normal((4 * C, C)) * 1e20).astype(np.float32)
    dumped = (rows(ref, 2).astype(np.float64) * 1.01).astype(np.float32)
    m = match_shard(dumped, ref, TP)
    assert m.rank == 2 and m.error == pytest.approx(0.01, rel=1e-4)
    # a reference slice of norm 1 (not 0): the error is ||d|| itself
    ref = np.zeros((4, 3))
    ref[1, 0] = 1.0
    m = match_shard(np.array([[0.5, 0.0, 0.0]]), ref, 4)
    assert (m.rank, m.error) == (1, 0.5)


def test_an_all_zero_reference_slice_is_0_when_equal_and_inf_otherwise():
    ref = np.zeros((4 * C, C))
    ref[:C] = 1.0  # rank 0's slice is not zero; ranks 1..3 are
    m = match_shard(np.zeros((C, C)), ref, TP)
    assert (m.rank, m.error) == (1, 0.0)
    off = np.zeros((C, C))
    off[0, 0] = 1e-3
    m = match_shard(off, np.zeros((4 * C, C)), TP)
    assert (m.rank, m.error) == (0, np.inf)


def test_inf_and_overflow_in_a_file_give_inf_without_a_warning():
    import warnings

    ref = np.ones((4, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning would be printed to the user
        both_inf = np.array([[np.inf, 1.0]])
        inf_ref = ref.copy()
        inf_ref[:, 0] = np.inf
        assert match_shard(both_inf, inf_ref, 4).error == np.inf  # inf - inf
        huge = np.array([[1e308, 1.0]])
        assert match_shard(huge, -huge.repeat(4, 0), 4).error == np.inf  # 2e308 overflows


def test_fused_qkv_groups_are_whole_numbers():
    groups = fused_qkv_groups((C + 16, C))
    assert groups == (C, 8, 8) and all(type(g) is int for g in groups)
