"""The fp64 ratio of a calibration session (harness.runner.calibrate.fp64_ratio): per parameter
||run - fp64|| / ||ref - fp64||, worst over parameters, and the loss's worst per step. Another
rounding order gives a ratio of order 1; a 1e-4 bug on one pipeline stage gives one far above 1;
a reference that equals the oracle exactly gives 0 or inf."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from harness.runner.calibrate import fp64_ratio

STAGES = {0: ["h.0.attn.c_attn.weight", "h.0.mlp.c_fc.weight", "wte.weight"],
          1: ["h.1.attn.c_attn.weight", "h.1.mlp.c_fc.weight", "ln_f.weight"]}


def exact_gradients(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal((48, 32)) * 10.0 ** rng.uniform(-3, 0)
            for names in STAGES.values() for name in names}


def summed_in_float32(parts: list[np.ndarray], order: list[int]) -> np.ndarray:
    """The float32 sum of `parts` in `order`: another order is another rounding of the same
    mathematics (a pipeline's or a tensor-parallel split's accumulation)."""
    total = np.zeros_like(parts[0], dtype=np.float32)
    for i in order:
        total = total + parts[i].astype(np.float32)
    return total


def write(folder, arrays: dict[str, np.ndarray]):
    folder.mkdir(parents=True)
    for name, array in arrays.items():
        np.save(folder / f"{name}.npy", array)
    return folder


@pytest.fixture
def dumps(tmp_path):
    """An oracle (float64), a reference and a run (float32: the gradient accumulated over 8
    microbatches, the run in another order), and the run with stage 1 scaled by 1 + 1e-4."""
    exact = exact_gradients()
    rng = np.random.default_rng(1)
    parts = {name: [g / 8 + rng.standard_normal(g.shape) * np.abs(g).mean() for _ in range(7)]
             for name, g in exact.items()}
    for name, g in exact.items():  # the 8th part makes the sum exactly g (in float64)
        parts[name].append(g - sum(parts[name]))
    reference = {n: summed_in_float32(p, list(range(8))) for n, p in parts.items()}
    run = {n: summed_in_float32(p, [3, 1, 7, 5, 0, 6, 2, 4]) for n, p in parts.items()}
    bug = {n: (g * np.float32(1 + 1e-4) if n in STAGES[1] else g) for n, g in run.items()}
    return {"oracle": write(tmp_path / "fp64", exact), "ref": write(tmp_path / "ref", reference),
            "run": write(tmp_path / "run", run), "bug": write(tmp_path / "bug", bug),
            "exact": exact, "reference": reference}


def steps(*losses):
    return [{"step": i + 1, "loss": loss} for i, loss in enumerate(losses)]


def test_another_rounding_order_is_of_order_one_and_a_stage_bug_far_above(dumps):
    assert np.load(dumps["oracle"] / "wte.weight.npy").dtype == np.float64
    clean = fp64_ratio(dumps["run"], dumps["ref"], dumps["oracle"], [], [], [])
    assert 0.3 < clean["gradients"] < 3, clean  # the same distance from the exact answer
    assert clean["gradients_parameter"] in {n for names in STAGES.values() for n in names}
    assert clean["loss"] is None  # no steps given

    planted = fp64_ratio(dumps["bug"], dumps["ref"], dumps["oracle"], [], [], [])
    assert planted["gradients"] > 100, planted  # 1e-4 against float32 rounding (~1e-7)
    assert planted["gradients_parameter"] in STAGES[1]


def test_the_loss_ratio_is_the_worst_step_and_takes_step_records_or_pairs(dumps):
    exact = steps(5.0, 4.9, 4.8)
    reference = steps(5.0 + 2e-7, 4.9 - 1e-7, 4.8 + 3e-7)
    run = steps(5.0 - 2e-7, 4.9 + 1e-7, 4.8 + 3e-5)  # step 3: 100 x the reference's distance
    ratio = fp64_ratio(None, None, None, run, reference, exact)
    assert ratio["gradients"] is None and ratio["gradients_parameter"] is None
    assert ratio["loss"] == pytest.approx(100, rel=1e-6)
    pairs = [(s["step"], s["loss"]) for s in run]
    assert fp64_ratio(None, None, None, pairs, reference, exact)["loss"] == ratio["loss"]
    # only the steps all three have count
    assert fp64_ratio(None, None, None, run[:2], reference, exact)["loss"] == \
        pytest.approx(1.0, rel=1e-6)


def test_a_reference_equal_to_the_oracle_gives_zero_or_inf(tmp_path):
    zero = {"a": np.zeros((3, 3)), "b": np.ones((2,))}
    oracle = write(tmp_path / "fp64", zero)
    same = write(tmp_path / "same", {k: v.astype(np.float32) for k, v in zero.items()})
    off = write(tmp_path / "off", {"a": np.zeros((3, 3), np.float32),
                                   "b": np.float32([1, 1 + 2**-20])})
    assert fp64_ratio(same, same, oracle, [], [], []) == {
        "gradients": 0.0, "gradients_parameter": "a", "loss": None}
    ratio = fp64_ratio(off, same, oracle, [(1, 2.0)], [{"step": 1, "loss": 1.0}],
                       [{"step": 1, "loss": 1.0}])
    assert ratio == {"gradients": math.inf, "gradients_parameter": "b", "loss": math.inf}
    assert fp64_ratio(same, same, oracle, [(1, 1.0)], [{"step": 1, "loss": 1.0}],
                      [{"step": 1, "loss": 1.0}])["loss"] == 0.0
    # a non-finite run is as far as can be; a parameter missing from the run is not compared
    nan = write(tmp_path / "nan", {"a": np.full((3, 3), np.nan, np.float32)})
    assert fp64_ratio(nan, same, oracle, [], [], []) == {
        "gradients": math.inf, "gradients_parameter": "a", "loss": None}
    json.dumps(ratio, allow_nan=True)  # the record makes inf a string (result_record.to_json)
