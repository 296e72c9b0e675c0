"""The scale-free verdict: planted bugs on gradient dumps written to tmp folders (numpy only).

The 124M-like magnitude: a 768-wide block whose largest gradient element is ~0.05 (issue 12
measured 0.0497 in layers 4-11 of a GPT-2 124M-shaped run)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from harness.cases import Tolerance
from harness.compare import Locator, compare_gradients, compare_losses
from harness.compare.verdict import (DEFAULT_RELATIVE, UPDATE_RELATIVE, margin, relative_error,
                                     relative_thresholds, update_threshold)
from harness.contracts.flags import DTYPES

FP32 = Tolerance(1e-5, 0.0)  # the element-wise default of float32 (InfiniTrain's)
REL = relative_thresholds("float32")
LAYOUT = Locator.from_layout({"chunks": [[0, 0, 2], [1, 2, 4]]}, "gpt2")


def gradients_124m_like(seed: int = 0) -> dict[str, np.ndarray]:
    """4 layers of 768-wide blocks, values ~N(0, 0.01) clipped so the largest is ~0.05."""
    rng = np.random.default_rng(seed)
    out = {}
    for layer in range(4):
        for name, shape in (("attn.c_attn.weight", (768, 96)), ("mlp.c_fc.weight", (96, 768)),
                            ("ln_1.weight", (768,))):
            g = rng.normal(0, 0.01, shape).astype(np.float32)
            out[f"h.{layer}.{name}"] = np.clip(g, -0.05, 0.05)
    return out


def dump(folder: Path, arrays: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in arrays.items():
        np.save(folder / f"{name}.npy", np.asarray(value, np.float32))
    return folder


def stage1_scaled(arrays: dict, factor: float) -> dict:
    """Every gradient of stage 1 (layers 2, 3) scaled: a planted bug."""
    return {n: (a * np.float32(factor) if n.startswith(("h.2.", "h.3.")) else a)
            for n, a in arrays.items()}


def test_stage_scaled_by_1e4_passes_elementwise_but_fails_scale_free(tmp_path):
    ref = gradients_124m_like()
    assert 0.04 < max(float(np.abs(a).max()) for a in ref.values()) <= 0.05
    dump(tmp_path / "ref", ref)
    dump(tmp_path / "got", stage1_scaled(ref, 1 + 1e-4))
    diff = compare_gradients(tmp_path / "got", tmp_path / "ref", FP32, LAYOUT,
                             relative=REL.gradients)
    assert diff.elementwise_ok  # the element-wise check misses it: max |d| = 5e-6 < 1e-5
    assert diff.max_abs_diff < 1e-5
    assert not diff.relative_ok and not diff.ok  # the scale-free verdict catches it
    failed = {d.name for d in diff.relative_failures}
    assert failed == {n for n in ref if n.startswith(("h.2.", "h.3."))}
    record = diff.to_dict()
    assert record["ok"] is False and record["elementwise_ok"] is True
    rel = record["relative"]
    assert rel["worst"] == pytest.approx(1e-4, rel=1e-2)
    assert rel["worst_parameter"].startswith(("h.2.", "h.3.")) and rel["worst_stage"] == "1"
    assert rel["margin"] == pytest.approx(REL.gradients / 1e-4, rel=1e-2) and rel["margin"] < 1


def test_reordering_noise_passes(tmp_path):
    """Relative 1e-7 per element (what a different summation order gives in float32)."""
    ref = gradients_124m_like()
    rng = np.random.default_rng(1)
    got = {n: (a * (1 + rng.normal(0, 1e-7, a.shape))).astype(np.float32) for n, a in ref.items()}
    dump(tmp_path / "ref", ref)
    dump(tmp_path / "got", got)
    diff = compare_gradients(tmp_path / "got", tmp_path / "ref", FP32, LAYOUT,
                             relative=REL.gradients)
    assert diff.ok and diff.relative_ok
    worst = diff.to_dict()["relative"]
    assert worst["worst"] < 3e-7 and worst["margin"] > 30


def test_scale_free_check_decides_the_status(tmp_path):
    """Fails if the relative verdict is dropped from `ok` (the status the case runner records
    is `loss.ok and gradients.ok`), or if a planted 1e-4 stage bug stops being caught at the
    default float32 threshold."""
    ref = gradients_124m_like()
    dump(tmp_path / "ref", ref)
    dump(tmp_path / "got", stage1_scaled(ref, 1 + 1e-4))
    diff = compare_gradients(tmp_path / "got", tmp_path / "ref", FP32, LAYOUT,
                             relative=REL.gradients)
    assert diff.elementwise_ok and diff.ok is False
    assert REL.gradients < 1e-4 and relative_thresholds("bfloat16").gradients > REL.gradients
    # the loss: a 1e-5 relative shift of a 10.8 loss is within atol 1e-5 x 100 ... but caught
    losses = compare_losses([{"step": 1, "loss": 10.8 * (1 + 1e-5)}], [{"step": 1, "loss": 10.8}],
                            Tolerance(2e-4, 0.0), relative=1e-6)
    assert losses.elementwise_ok and not losses.relative_ok and losses.ok is False


def test_loss_relative_error_and_margin():
    ref = [{"step": s, "loss": v} for s, v in ((1, 10.0), (2, 9.0), (3, 0.5))]
    got = [{"step": 1, "loss": 10.0 + 1e-6}, {"step": 2, "loss": 9.0 + 9e-6},
           {"step": 3, "loss": 0.5 + 5e-7}]
    diff = compare_losses(got, ref, FP32, relative=1e-5)
    assert diff.worst_relative_step == 2 and diff.worst_relative == pytest.approx(1e-6, rel=1e-6)
    rel = diff.to_dict()["relative"]
    assert rel["margin"] == pytest.approx(10, rel=1e-5) and rel["ok"] is True
    # below the floor of 1 the difference is taken absolutely: 5e-7 / 1
    nan = compare_losses([{"step": 1, "loss": float("nan")}], ref[:1], FP32, relative=1e-5)
    assert nan.worst_relative == math.inf and not nan.ok and nan.to_dict()["relative"]["margin"] == 0
    assert compare_losses(got, ref, FP32).to_dict()["relative"] is None  # not applied


def test_relative_error_guards():
    assert relative_error(0.0, 0.0) == 0.0 and relative_error(1e-9, 0.0) == math.inf
    assert relative_error(float("nan"), 1.0) == math.inf
    assert margin(1e-5, 0.0) == math.inf and margin(1e-5, math.inf) == 0.0
    assert margin(1e-5, 1e-6) == pytest.approx(10)


def test_zero_and_nan_gradients(tmp_path):
    dump(tmp_path / "ref", {"a": np.zeros(4), "b": np.ones(4), "c": np.zeros(3)})
    dump(tmp_path / "got", {"a": np.zeros(4), "b": [1, 1, np.nan, 1], "c": [0, 0, 1e-9]})
    diff = compare_gradients(tmp_path / "got", tmp_path / "ref", FP32, relative=1e-5)
    rel = {d.name: d.relative_error for d in diff.diffs}
    assert rel == {"a": 0.0, "b": math.inf, "c": math.inf}
    assert [d.name for d in diff.relative_failures] == ["b", "c"]
    summary = {p["name"]: p for p in diff.to_dict()["per_parameter"]}
    assert summary["b"]["relative_error"] == "inf" and summary["a"]["ref_norm"] == 0.0


def test_failure_text_names_the_scale_free_verdict(tmp_path):
    from harness.compare import gradient_lines, loss_lines

    ref = gradients_124m_like()
    dump(tmp_path / "ref", ref)
    dump(tmp_path / "got", stage1_scaled(ref, 1 + 1e-4))
    diff = compare_gradients(tmp_path / "got", tmp_path / "ref", FP32, LAYOUT,
                             relative=REL.gradients)
    text = "\n".join(gradient_lines(diff))
    assert "gradients (scale-free): worst ||got-ref||/||ref|| 0.0001" in text
    assert "OVER the threshold in 6 of 12 parameters" in text and "h.2." in text
    losses = compare_losses([{"step": 1, "loss": 10.0}], [{"step": 1, "loss": 10.0}], FP32,
                            relative=1e-6)
    assert "loss (scale-free): worst |got-ref|/max(|ref|,1) 0 at step 1, within" in \
        "\n".join(loss_lines(losses))


def test_thresholds_by_dtype_exactly():
    # Each dtype the config admits has its own thresholds; no dtype (the flag's default) is
    # float32's; a name the loader would refuse is refused here too, never judged as float32.
    assert set(DEFAULT_RELATIVE) == set(UPDATE_RELATIVE) == set(DTYPES)
    assert relative_thresholds(None) == relative_thresholds("float32")
    assert (relative_thresholds("float32").loss, relative_thresholds("float32").gradients) == \
        (1e-5, 1e-5)
    assert (relative_thresholds("bfloat16").loss, relative_thresholds("bfloat16").gradients) == \
        (1e-4, 2e-2)
    assert relative_thresholds("bfloat16").to_dict() == {"loss": 1e-4, "gradients": 2e-2}
    assert update_threshold(None) == update_threshold("float32") == 1e-3
    assert update_threshold("bfloat16") == 2e-2
    for lookup, what in ((relative_thresholds, "scale-free thresholds"),
                         (update_threshold, "parameter-update threshold")):
        with pytest.raises(ValueError) as error:
            lookup("float16")
        assert str(error.value) == (f"no {what} for --dtype 'float16': expected one of "
                                    f"['bfloat16', 'float32']")


def test_exactly_at_the_threshold_passes():
    from harness.compare.verdict import passes

    assert passes(0.25, 0.25) and not passes(0.25 + 2**-50, 0.25) and not passes(math.nan, 1.0)
