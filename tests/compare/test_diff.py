"""harness.compare.diff and .locate: loss and gradient diffs, their text, the per-layer summary,
parameter -> stage / layer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.cases import Tolerance
from harness.compare import Locator, compare_gradients, compare_losses, gradient_lines, loss_lines


TOL = Tolerance(1e-5, 0.0)


def steps(*losses):
    return [{"step": i + 1, "loss": v} for i, v in enumerate(losses)]


def test_loss_diff_counts_first_step_and_nan():
    diff = compare_losses(steps(1.0, 2.0, float("nan"), 4.5), steps(1.0, 2.1, 3.0, 4.0), TOL)
    assert diff.mismatched == [2, 3, 4] and diff.nonfinite == [3] and diff.first == (2, 2.0, 2.1)
    text = "\n".join(loss_lines(diff))
    assert "loss is not finite (NaN / inf) at step(s) 3" in text
    assert "mismatched 3 of 4 steps (atol=1e-05 rtol=0); first diverging step 2" in text
    short = compare_losses(steps(1.0), steps(1.0, 2.0), TOL)
    assert short.missing == [2] and not short.ok
    relative = compare_losses(steps(100.001), steps(100.0), Tolerance(0, 1e-4))
    assert relative.ok  # |d| = 1e-3 <= 0 + 1e-4 * 100


def test_loss_diff_record_exactly():
    # Binary fractions, so each difference is exact: step 1 lies exactly at atol (passes), step
    # 2 is missing (the steps after it are still compared), steps 3 and 4 are 2 x atol away
    # with the same relative error (the worst is the first of them), step 5 is extra.
    atol = 2.0**-10
    ref = steps(10.0, 9.0, 8.0, 8.0)
    got = [{"step": 1, "loss": 10.0 + atol}, {"step": 3, "loss": 8.0 + 2 * atol},
           {"step": 4, "loss": 8.0 + 2 * atol}, {"step": 5, "loss": 7.0}]
    diff = compare_losses(got, ref, Tolerance(atol, 0.0), relative=1e-3)
    worst = 2 * atol / 8.0
    assert diff.to_dict() == {
        "tolerance": {"atol": atol, "rtol": 0.0}, "steps": 4, "compared": 3, "mismatched": 2,
        "mismatched_steps": [3, 4], "nonfinite_steps": [], "missing_steps": [2],
        "extra_steps": [5], "max_abs_diff": 2 * atol, "first_diverging_step": 3,
        "resolution": 0.0, "within_resolution_steps": [], "elementwise_ok": False,
        "relative": {"threshold": 1e-3, "worst": worst, "worst_step": 3,
                     "margin": 1e-3 / worst, "ok": True},
        "ok": False,
    }
    assert diff.first == (3, 8.0 + 2 * atol, 8.0)
    at_atol = compare_losses(steps(10.0 + atol), steps(10.0), Tolerance(atol, 0.0))
    assert at_atol.ok and at_atol.to_dict()["relative"] is None
    over = compare_losses(steps(8.0 + 2 * atol), steps(8.0), Tolerance(atol, 0.0),
                          relative=worst / 2)
    assert over.relative_dict() == {"threshold": worst / 2, "worst": worst, "worst_step": 1,
                                     "margin": 0.5, "ok": False}


def dump(folder: Path, arrays: dict):
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in arrays.items():
        np.save(folder / f"{name}.npy", np.asarray(value, np.float32))


def test_gradient_diff_locates_stage_and_layer(tmp_path):
    ref = {"wte.weight": np.ones((2, 2)), "h.0.ln_1.weight": np.ones(3),
           "h.6.mlp.c_fc.weight": np.ones((2, 2)), "ln_f.weight": np.ones(3)}
    got = dict(ref)
    got["h.6.mlp.c_fc.weight"] = np.array([[1, 1.5], [1, 1]])
    got["wte.weight"] = np.array([[1, 1], [1, np.nan]])
    del got["ln_f.weight"]
    got["h.7.extra"] = np.ones(1)
    dump(tmp_path / "ref", ref)
    dump(tmp_path / "got", got)
    layout = {"chunks": [[0, 0, 3], [1, 3, 8]]}
    diff = compare_gradients(tmp_path / "got", tmp_path / "ref", TOL, Locator.from_layout(layout, "gpt2"))
    assert diff.missing == ["ln_f.weight"] and diff.extra == ["h.7.extra"]
    assert [d.name for d in diff.mismatched] == ["h.6.mlp.c_fc.weight", "wte.weight"]
    worst = diff.worst()
    assert worst[0].name == "wte.weight" and worst[0].nonfinite == 1  # NaN ranks first
    fc = next(d for d in diff.diffs if d.name == "h.6.mlp.c_fc.weight")
    assert (fc.stage, fc.layer, fc.mismatched, fc.worst_index) == ("1", "6", 1, (0, 1))
    assert fc.max_abs_diff == pytest.approx(0.5)
    text = "\n".join(gradient_lines(diff))
    assert "mismatched 2 of 3 parameters (2 of 11 elements; atol=1e-05 rtol=0)" in text
    assert "0+1 (tied embedding / lm head)" in text
    assert "gradients: 1 missing from the run: ln_f.weight" in text
    assert diff.to_dict()["per_layer"] == [  # every compared parameter, by layer in model order
        {"layer": "embedding", "stage": "0+1", "max_abs_diff": 0.0, "mismatched": 1,
         "parameters": 1},
        {"layer": 0, "stage": "0", "max_abs_diff": 0.0, "mismatched": 0, "parameters": 1},
        {"layer": 6, "stage": "1", "max_abs_diff": 0.5, "mismatched": 1, "parameters": 1}]


def test_per_layer_groups_and_orders_parameters():
    from harness.compare.diff import GradientDiff, ParameterDiff

    def p(name, stage, stages, diff, bad=0):
        return ParameterDiff(name, (1,), 1, bad, 0, diff, 0.0, (0,), 0.0, 0.0, stage=stage,
                             stages=stages)

    grads = GradientDiff(TOL, diffs=[
        p("lm_head.weight", "1 (lm head)", (1,), 0.1),
        p("h.10.mlp.c_fc.weight", "1", (1,), 0.2, 1), p("h.2.attn.c_attn.weight", "0", (0,), 0.3),
        p("h.10.attn.c_proj.weight", "1", (1,), 0.4, 1),
        p("ln_f.weight", "1 (final norm)", (1,), 0.0), p("wpe.weight", "0 (embedding)", (0,), 0.0),
        p("odd.weight", "?", (), float("nan"))])
    rows = grads.per_layer()
    assert [(r["layer"], r["stage"]) for r in rows] == [
        ("embedding", "0"), (2, "0"), (10, "1"), ("final_norm", "1"), ("head", "1"),
        ("other", "?")]
    assert rows[2] == {"layer": 10, "stage": "1", "max_abs_diff": 0.4, "mismatched": 2,
                       "parameters": 2}
    assert rows[-1]["max_abs_diff"] == "nan"  # JSON-safe, as every float in a record


def test_locator_without_layout_and_llama_head():
    loc = Locator.from_layout({"chunks": [[0, 0, 4], [1, 4, 4], [0, 4, 8], [1, 8, 8]]}, "llama3")
    assert loc.locate("h.5.attn.c_attn.weight") == ("0", "5")
    assert loc.locate("lm_head.weight") == ("1 (lm head)", "-")
    assert loc.locate("wte.weight") == ("0 (embedding)", "-")
    assert Locator.from_layout(None).locate("h.1.x") == ("?", "1")
    # a recorded layout that is not [[stage, start, end], ...] locates nothing, and raises nothing
    for broken in ({"chunks": [[0, "a", 2]]}, {"chunks": [[0, 1]]}, {"chunks": "0:0-2"}):
        loc = Locator.from_layout(broken, "gpt2")
        assert loc.chunks == ()
        assert loc.locate("h.1.x") == ("?", "1") and loc.locate("lm_head.weight") == ("?", "-")
    assert Locator.from_layout(None, "gpt2").tied_embedding is True
    assert Locator.from_layout(None, "llama3").tied_embedding is False
    assert Locator.from_layout(None, "mystery").tied_embedding is False


def test_gradient_diff_record_exactly(tmp_path):
    # Binary fractions, so every norm and difference is exact. Layer 0 (stage 0) matches; layer
    # 1's norm weight (stage 1) is off by 0.25 in one element (relative error 0.25: over the
    # 0.1 threshold); the head (last stage only) is off by 2**-3 of a norm of 5 (0.025: under
    # it, but an element-wise mismatch).
    ref = {"h.0.ln_1.weight": [1.0, 1.0, 1.0, 1.0], "h.1.ln_1.weight": [0.5, 0.5, 0.5, 0.5],
           "lm_head.weight": [[3.0, 4.0]]}
    got = {**ref, "h.1.ln_1.weight": [0.75, 0.5, 0.5, 0.5], "lm_head.weight": [[3.0, 4.125]]}
    dump(tmp_path / "ref", ref)
    dump(tmp_path / "got", got)
    locator = Locator.from_layout({"chunks": [[0, 0, 1], [1, 1, 2]]}, "llama3")
    diff = compare_gradients(tmp_path / "got", tmp_path / "ref", Tolerance(2.0**-10, 0.0),
                             locator, relative=0.1)
    by_name = {d.name: d for d in diff.diffs}
    assert by_name["h.1.ln_1.weight"].to_dict() == {
        "name": "h.1.ln_1.weight", "shape": [4], "elements": 4, "mismatched": 1, "nonfinite": 0,
        "max_abs_diff": 0.25, "relative_error": 0.25, "worst_index": [0], "worst_got": 0.75,
        "worst_ref": 0.5, "stage": "1", "layer": "1"}
    assert by_name["h.1.ln_1.weight"].summary() == {
        "name": "h.1.ln_1.weight", "ref_norm": 1.0, "got_norm": (0.75**2 + 3 * 0.25) ** 0.5,
        "diff_norm": 0.25, "relative_error": 0.25, "max_abs_diff": 0.25, "mismatched": 1}
    assert by_name["lm_head.weight"].to_dict()["stage"] == "1 (lm head)"
    assert by_name["lm_head.weight"].to_dict()["worst_index"] == [0, 1]
    assert diff.relative_dict() == {
        "threshold": 0.1, "worst": 0.25, "worst_parameter": "h.1.ln_1.weight",
        "worst_stage": "1", "margin": 0.4, "failed": ["h.1.ln_1.weight"], "ok": False}
    record = diff.to_dict(worst=1)
    assert [w["name"] for w in record["worst"]] == ["h.1.ln_1.weight"]  # the larger excess
    assert (record["parameters"], record["mismatched"], record["elements"],
            record["mismatched_elements"], record["max_abs_diff"]) == (3, 2, 10, 2, 0.25)
    assert record["per_layer"] == [
        {"layer": 0, "stage": "0", "max_abs_diff": 0.0, "mismatched": 0, "parameters": 1},
        {"layer": 1, "stage": "1", "max_abs_diff": 0.25, "mismatched": 1, "parameters": 1},
        {"layer": "head", "stage": "1", "max_abs_diff": 0.125, "mismatched": 1, "parameters": 1}]
    assert [p["name"] for p in record["per_parameter"]] == sorted(ref)
    assert record["elementwise_ok"] is False and record["ok"] is False
    assert compare_gradients(tmp_path / "got", tmp_path / "ref", Tolerance(1.0, 0.0),
                             locator).relative_dict() is None
    at = compare_gradients(tmp_path / "got", tmp_path / "ref", Tolerance(1.0, 0.0), locator,
                           relative=0.25)
    assert at.relative_ok and at.ok  # exactly at the threshold passes


def test_unreadable_and_reshaped_files_are_named_and_the_rest_still_compared(tmp_path):
    ref = {"h.0.a.weight": [1.0, 1.0], "h.0.b.weight": [1.0, 1.0], "h.0.c.weight": [1.0, 1.0]}
    dump(tmp_path / "ref", ref)
    dump(tmp_path / "got", {"h.0.b.weight": [1.0, 1.0, 1.0], "h.0.c.weight": [1.0, 2.0]})
    (tmp_path / "got" / "h.0.a.weight.npy").write_bytes(b"\x93NUMPY junk")
    (tmp_path / "got" / ".h.0.d.weight.npy").write_bytes(b"a writer's temporary")
    diff = compare_gradients(tmp_path / "got", tmp_path / "ref", TOL)
    assert [e.split(":")[0] for e in diff.shape_errors] == ["h.0.a.weight", "h.0.b.weight"]
    assert diff.shape_errors[0].startswith("h.0.a.weight: the run's gradient file cannot be read (")
    assert "(3,)" in diff.shape_errors[1] and "(2,)" in diff.shape_errors[1]
    assert [d.name for d in diff.diffs] == ["h.0.c.weight"] and diff.diffs[0].mismatched == 1
    assert diff.extra == [] and diff.missing == [] and not diff.ok
    nothing = compare_gradients(tmp_path / "no-such-run", tmp_path / "ref", TOL)
    assert nothing.missing == sorted(ref) and nothing.diffs == []


def test_locator_every_kind_of_name_on_every_kind_of_layout():
    two = Locator.from_layout({"chunks": [[0, 0, 2], [1, 2, 4]]}, "gpt2")
    assert two.locate("wte.weight") == ("0+1 (tied embedding / lm head)", "-")
    assert two.locate("wpe.weight") == ("0 (embedding)", "-")
    assert two.locate("ln_f.weight") == ("1 (final norm)", "-")
    assert two.locate("something.else") == ("?", "-") and two.stages("something.else") == ()
    # V-shaped (ZBV / DualPipeV): the last chunk is stage 0's again, so GPT-2's tied embedding
    # has one home and the head is on stage 0, not on the second chunk's stage
    v = Locator.from_layout({"chunks": [[0, 0, 1], [1, 1, 2], [1, 2, 3], [0, 3, 4]]}, "gpt2")
    assert v.locate("wte.weight") == ("0 (embedding)", "-") and v.stages("wte.weight") == (0,)
    assert v.locate("ln_f.weight") == ("0 (final norm)", "-")
    assert v.locate("h.2.mlp.c_fc.weight") == ("1", "2")
    # other trainers' prefixes, in any order and repeated
    for name in ("transformer.h.3.attn.c_attn.weight", "module.transformer.h.3.attn.c_attn.weight",
                 "transformer.module.h.3.attn.c_attn.weight"):
        assert v.locate(name) == ("0", "3"), name
