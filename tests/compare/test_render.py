"""One diff renderer: the failure text and the report's markdown show the same worst
parameters from the same table code."""

from __future__ import annotations

import numpy as np

from harness.compare import Locator, compare_gradients, compare_losses, gradient_lines, loss_lines
from harness.compare.render import (MARKDOWN, NA, g, gradient_markdown, loss_markdown, number,
                                    table, tolerance_text, worst_table)
from harness.contracts.tolerance import Tolerance


def _dump(folder, arrays):
    folder.mkdir()
    for name, values in arrays.items():
        np.save(folder / f"{name}.npy", np.asarray(values, dtype=np.float32))


def test_text_and_markdown_share_the_worst_parameters(tmp_path):
    _dump(tmp_path / "ref", {"h.0.attn.weight": [1.0, 2.0, 3.0], "wte": [0.5, 0.5]})
    _dump(tmp_path / "got", {"h.0.attn.weight": [1.0, 2.5, 3.0], "wte": [0.5, 0.5]})
    diff = compare_gradients(tmp_path / "got", tmp_path / "ref", Tolerance(1e-5, 0))
    text = "\n".join(gradient_lines(diff))
    markdown = "\n".join(gradient_markdown(diff.to_dict()))
    assert "worst parameters:" in text and "Worst parameters:" in markdown
    for shown in (text, markdown):
        assert "h.0.attn.weight" in shown and "1/3" in shown and "wte" not in shown.split(
            "orst parameters:")[1]
    assert worst_table(diff.to_dict()["worst"], MARKDOWN)[0].startswith("| parameter")


def test_markdown_cells_are_escaped():
    assert table([["a|b", "x\ny"]], ["h|1", "h2"], MARKDOWN)[2] == "| a\\|b   | x y  |"


# ------------------------------------------------------------------ exact text, line by line

def _steps(*losses):
    return [{"step": i + 1, "loss": v} for i, v in enumerate(losses)]


def test_cells_numbers_and_tolerances():
    assert [number(v) for v in (2, 2.5, "nan", "inf", "x", True, None, [1])][:2] == [2.0, 2.5]
    assert [number(v) for v in ("x", True, None, [1])] == [None] * 4
    assert [g(v) for v in (0.000123456, "nan", "inf", "-inf", None, "junk")] == \
        ["0.000123", "NaN", "inf", "-inf", NA, NA]
    assert g(3.14159265, 6) == "3.14159"
    assert tolerance_text({"atol": 1e-5, "rtol": 0}) == "atol 1e-05, rtol 0"
    assert tolerance_text({"atol": 1e-5}) == "atol 1e-05, rtol 0"
    assert tolerance_text({"rtol": 1e-3}) == NA and tolerance_text(None) == NA


def test_loss_lines_every_kind_of_difference():
    ref = _steps(*[10.0] * 14)
    got = [{"step": s, "loss": float("nan") if s > 1 else 10.5} for s in range(1, 13)] + \
        [{"step": 15, "loss": 1.0}]
    diff = compare_losses(got, ref, Tolerance(1e-5, 0.0), relative=1e-6)
    assert loss_lines(diff) == [
        "loss is not finite (NaN / inf) at step(s) 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 ...",
        "the run recorded no loss for step(s) 13, 14 of the reference's 14",
        "the run recorded step(s) 15 the reference does not have",
        "loss: mismatched 12 of 12 steps (atol=1e-05 rtol=0); first diverging step 1: "
        "got 10.5, reference 10, |diff| 0.5",
        "loss (scale-free): worst |got-ref|/max(|ref|,1) inf at step 2, OVER the threshold "
        "1e-06 (margin 0x)"]
    ok = compare_losses(_steps(10.0, 9.0), _steps(10.0, 9.0 + 2**-20), Tolerance(1e-5, 0.0),
                        relative=1e-6)
    assert loss_lines(ok) == [
        "loss: 2 of 2 steps within atol=1e-05 rtol=0 (max |diff| 9.53674e-07)",
        "loss (scale-free): worst |got-ref|/max(|ref|,1) 1.05964e-07 at step 2, within the "
        "threshold 1e-06 (margin 9.43718x)"]
    assert loss_lines(compare_losses([], _steps(1.0), Tolerance(1e-5, 0.0), relative=1e-6)) == [
        "the run recorded no loss for step(s) 1 of the reference's 1"]


def test_gradient_lines_element_wise_and_scale_free(tmp_path):
    ref = {"h.0.mlp.c_fc.weight": [0.5, 0.5, 0.5, 0.5], "h.1.mlp.c_fc.weight": [1.0, 1.0],
           "wpe.weight": [2.0]}
    got = {"h.0.mlp.c_fc.weight": [0.75, 0.5, 0.5, float("nan")],
           "h.1.mlp.c_fc.weight": [1.0, 1.0], "wte.weight": [1.0]}
    _dump(tmp_path / "ref", ref)
    _dump(tmp_path / "got", got)
    loc = Locator.from_layout({"chunks": [[0, 0, 1], [1, 1, 2]]}, "gpt2")
    diff = compare_gradients(tmp_path / "got", tmp_path / "ref", Tolerance(1e-5, 0.0), loc,
                             relative=1e-5)
    lines = gradient_lines(diff)
    assert lines[:3] == [
        "gradients: 1 missing from the run: wpe.weight",
        "gradients: 1 not in the reference: wte.weight",
        "gradients: mismatched 1 of 2 parameters (2 of 6 elements; atol=1e-05 rtol=0); "
        "1 elements are NaN / inf in the run"]
    assert lines[3].splitlines()[0] == "worst parameters:"
    assert lines[3].splitlines()[3].split() == ["h.0.mlp.c_fc.weight", "0", "0", "2/4", "0.25",
                                                "[3]", "nan", "0.5"]
    assert lines[4] == ("gradients (scale-free): worst ||got-ref||/||ref|| inf at "
                        "h.0.mlp.c_fc.weight (stage 0), threshold 1e-05, margin 0x: OVER the "
                        "threshold in 1 of 2 parameters")
    assert lines[5].splitlines()[0] == "worst parameters (scale-free):"
    assert lines[5].splitlines()[3].split()[:4] == ["h.0.mlp.c_fc.weight", "0", "0", "inf"]
    assert len(lines) == 6
    fine = compare_gradients(tmp_path / "ref", tmp_path / "ref", Tolerance(1e-5, 0.0), loc,
                             relative=1e-5)
    assert gradient_lines(fine) == [
        "gradients: 3 of 3 parameters within atol=1e-05 rtol=0 (max |diff| 0)",
        "gradients (scale-free): worst ||got-ref||/||ref|| 0 at wpe.weight (stage 0 "
        "(embedding)), threshold 1e-05, margin infx"]


def test_markdown_of_failed_loss_and_gradients(tmp_path):
    loss = compare_losses(_steps(10.5, float("nan")), _steps(10.0, 10.0, 10.0),
                          Tolerance(1e-5, 0.0)).to_dict()
    assert loss_markdown(loss) == [
        "- **loss**: first diverging step **1**; 2 of 2 steps out of tolerance (atol 1e-05, "
        "rtol 0); max |Δ| 0.5; NaN / inf at step(s) 2; no loss recorded for step(s) 3", ""]
    assert loss_markdown({**loss, "ok": True}) == [] and loss_markdown({}) == []
    _dump(tmp_path / "ref", {f"h.{i}.ln_1.weight": [1.0] for i in range(12)})
    _dump(tmp_path / "got", {"h.11.ln_1.weight": [1.5]})
    loc = Locator.from_layout({"chunks": [[0, 0, 6], [1, 6, 12]]}, "gpt2")
    grads = compare_gradients(tmp_path / "got", tmp_path / "ref", Tolerance(1e-5, 0.0),
                              loc).to_dict()
    lines = gradient_markdown(grads)
    assert lines[:4] == [
        "- **gradients**: 1 of 12 parameters out of tolerance (atol 1e-05, rtol 0); max |Δ| 0.5",
        "- **11 missing from the run**: `h.0.ln_1.weight`, `h.1.ln_1.weight`, "
        "`h.10.ln_1.weight`, `h.2.ln_1.weight`, `h.3.ln_1.weight`, `h.4.ln_1.weight`, "
        "`h.5.ln_1.weight`, `h.6.ln_1.weight`, `h.7.ln_1.weight`, `h.8.ln_1.weight` …",
        "- **where**: stage(s) 1; layer(s) 11", ""]
    assert lines[4:6] == ["Worst parameters:", ""] and lines[-1] == ""
    assert gradient_markdown({**grads, "ok": None}) == []


def test_markdown_worst_table_extra_shape_errors_and_layer_order():
    worst = [{"name": "h.10.mlp.c_fc.weight", "stage": "1", "layer": "10", "mismatched": 3,
              "elements": 8, "max_abs_diff": 0.015625, "worst_index": [0, 1],
              "worst_got": 1.2345678, "worst_ref": 1.0},
             {"name": "h.9.ln_1.weight", "stage": "0", "layer": "9", "mismatched": 1,
              "elements": 4, "max_abs_diff": 1e-05, "worst_index": [2], "worst_got": -0.5,
              "worst_ref": -0.123456789},
             {"name": "lm_head.weight", "stage": "1 (lm head)", "layer": "-", "mismatched": 2,
              "elements": 4, "max_abs_diff": "inf", "worst_index": [0],
              "worst_got": "-inf", "worst_ref": 0.25}]
    grads = {"ok": False, "mismatched": 3, "parameters": 40, "max_abs_diff": "inf",
             "tolerance": {"atol": 1e-5, "rtol": 1e-3},
             "missing": [f"h.{i}.x" for i in range(10)], "extra": ["extra.weight"],
             "shape_errors": ["h.1.y: shape (3,), reference (2,)"], "worst": worst}
    lines = gradient_markdown(grads)
    assert lines[:5] == [
        "- **gradients**: 3 of 40 parameters out of tolerance (atol 1e-05, rtol 0.001); "
        "max |Δ| inf",
        "- **10 missing from the run**: " + ", ".join(f"`h.{i}.x`" for i in range(10)),
        "- **1 not in the reference**: `extra.weight`",
        "- **1 shape changed**: `h.1.y: shape (3,), reference (2,)`",
        "- **where**: stage(s) 0, 1, 1 (lm head); layer(s) 9, 10, -"]
    assert lines[5:8] == ["", "Worst parameters:", ""]
    assert lines[8:-1] == [
        "| parameter              | stage       | layer   | mismatched   | max \\|Δ\\|   | at     "
        "| got     | ref       |",
        "|------------------------|-------------|---------|--------------|-------------|--------"
        "|---------|-----------|",
        "| `h.10.mlp.c_fc.weight` | 1           | 10      | 3/8          | 0.0156      | [0, 1] "
        "| 1.23457 | 1         |",
        "| `h.9.ln_1.weight`      | 0           | 9       | 1/4          | 1e-05       | [2]    "
        "| -0.5    | -0.123457 |",
        "| `lm_head.weight`       | 1 (lm head) | -       | 2/4          | inf         | [0]    "
        "| -inf    | 0.25      |"]
    assert lines[-1] == ""


def test_loss_markdown_lists_ten_steps_of_each_kind():
    loss = {"ok": False, "first_diverging_step": 2, "mismatched": 12, "compared": 12,
            "tolerance": {"atol": 1e-5, "rtol": 0.0}, "max_abs_diff": 0.5,
            "nonfinite_steps": list(range(2, 14)), "missing_steps": [14],
            "extra_steps": [15, 16]}
    assert loss_markdown(loss) == [
        "- **loss**: first diverging step **2**; 12 of 12 steps out of tolerance (atol 1e-05, "
        "rtol 0); max |Δ| 0.5; NaN / inf at step(s) 2, 3, 4, 5, 6, 7, 8, 9, 10, 11; no loss "
        "recorded for step(s) 14; steps the reference lacks 15, 16", ""]
    plain = {**loss, "nonfinite_steps": [], "missing_steps": [], "extra_steps": []}
    assert loss_markdown(plain)[0].endswith("(atol 1e-05, rtol 0); max |Δ| 0.5")
    assert loss_markdown({**plain, "tolerance": None})[0].endswith("(–); max |Δ| 0.5")


def test_gradient_lines_whole_text(tmp_path):
    # 7 parameters off by 2**-(i+1) in one of 4 elements (all over atol 2**-8, so the worst-5
    # cut shows); relative errors 2**-(i+2) against the threshold 2**-8: 6 over it (the table
    # shows 5), h.6 exactly at it (passes); 12 names the reference lacks (10 shown); a shape.
    (tmp_path / "ref").mkdir()
    (tmp_path / "got").mkdir()
    for i in range(7):
        np.save(tmp_path / "ref" / f"h.{i}.mlp.c_fc.weight.npy", np.ones(4, np.float32))
        np.save(tmp_path / "got" / f"h.{i}.mlp.c_fc.weight.npy",
                np.array([1 + 2.0**-(i + 1), 1, 1, 1], np.float32))
    np.save(tmp_path / "ref" / "h.7.ln_1.weight.npy", np.ones(2, np.float32))
    np.save(tmp_path / "got" / "h.7.ln_1.weight.npy", np.ones(3, np.float32))
    for j in range(12):
        np.save(tmp_path / "got" / f"extra.{j:02d}.npy", np.ones(1, np.float32))
    loc = Locator.from_layout({"chunks": [[0, 0, 4], [1, 4, 8]]}, "gpt2")
    diff = compare_gradients(tmp_path / "got", tmp_path / "ref", Tolerance(2.0**-8, 0.0), loc,
                             relative=2.0**-8)
    text = "\n".join(gradient_lines(diff))
    assert text.splitlines() == [
        "gradients: 12 not in the reference: extra.00, extra.01, extra.02, extra.03, extra.04, "
        "extra.05, extra.06, extra.07, extra.08, extra.09 ...",
        "gradients: h.7.ln_1.weight: shape (3,), reference (2,)",
        "gradients: mismatched 7 of 7 parameters (7 of 28 elements; atol=0.00390625 rtol=0)",
        "worst parameters:",
        "parameter              stage    layer  mismatched      max |got-ref|  at        got    ref",
        "-------------------  -------  -------  ------------  ---------------  ----  -------  -----",
        "h.0.mlp.c_fc.weight        0        0  1/4                   0.5      [0]   1.5          1",
        "h.1.mlp.c_fc.weight        0        1  1/4                   0.25     [0]   1.25         1",
        "h.2.mlp.c_fc.weight        0        2  1/4                   0.125    [0]   1.125        1",
        "h.3.mlp.c_fc.weight        0        3  1/4                   0.0625   [0]   1.0625       1",
        "h.4.mlp.c_fc.weight        1        4  1/4                   0.03125  [0]   1.03125      1",
        "gradients (scale-free): worst ||got-ref||/||ref|| 0.25 at h.0.mlp.c_fc.weight (stage 0), "
        "threshold 0.00390625, margin 0.015625x: OVER the threshold in 6 of 7 parameters",
        "worst parameters (scale-free):",
        "parameter              stage    layer    ||got-ref||/||ref||    ||got-ref||    ||ref||  "
        "  max |got-ref|",
        "-------------------  -------  -------  ---------------------  -------------  ---------  "
        "---------------",
        "h.0.mlp.c_fc.weight        0        0               0.25            0.5              2  "
        "        0.5",
        "h.1.mlp.c_fc.weight        0        1               0.125           0.25             2  "
        "        0.25",
        "h.2.mlp.c_fc.weight        0        2               0.0625          0.125            2  "
        "        0.125",
        "h.3.mlp.c_fc.weight        0        3               0.03125         0.0625           2  "
        "        0.0625",
        "h.4.mlp.c_fc.weight        1        4               0.015625        0.03125          2  "
        "        0.03125"]
    record = diff.to_dict()
    assert len(record["worst"]) == 7 and [w.name for w in diff.worst()] == \
        [f"h.{i}.mlp.c_fc.weight" for i in range(5)]
    assert record["extra"] == [f"extra.{j:02d}" for j in range(12)]
    assert record["shape_errors"] == ["h.7.ln_1.weight: shape (3,), reference (2,)"]
    assert len(diff.relative_failures) == 6


def test_scale_free_record_of_nothing_compared(tmp_path):
    (tmp_path / "ref").mkdir()
    diff = compare_gradients(tmp_path / "none", tmp_path / "ref", Tolerance(1e-5, 0.0),
                             relative=1e-5)
    assert diff.relative_dict() == {"threshold": 1e-5, "worst": 0.0, "worst_parameter": None,
                                    "worst_stage": None, "margin": "inf", "failed": [],
                                    "ok": True}


def test_the_record_keeps_the_ten_worst(tmp_path):
    _dump(tmp_path / "ref", {f"h.{i}.ln_1.weight": [1.0] for i in range(12)})
    _dump(tmp_path / "got", {f"h.{i}.ln_1.weight": [1.0 + (i + 1) / 64] for i in range(12)})
    diff = compare_gradients(tmp_path / "got", tmp_path / "ref", Tolerance(1e-5, 0.0))
    assert [w["name"] for w in diff.to_dict()["worst"]] == \
        [f"h.{i}.ln_1.weight" for i in range(11, 1, -1)]
