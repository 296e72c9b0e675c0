"""harness.compare.baseline field by field: the record it writes, the boundaries of a diverging
step, and each bad pairing's text and dtype. Written from a mutation run of the module
(docs/reliability.md): 63 of its 288 mutants survived the tests that reached it, most of them
in the record's keys, the thresholds' edges and the problem texts."""

from __future__ import annotations

import math

import json

import pytest

from harness.compare.baseline import (LR_RELATIVE_SLACK, _span, allowed_diff, bad_pairing,
                                      judge_baseline, judge_lr, lr_limit, printed_resolution,
                                      step_limit, threshold_text)
from harness.launch.backends import parse_step_lines


def test_the_record_holds_every_field_by_its_name():
    v = judge_baseline([1, 2, 3], [5.0, 4.0, 3.5], [1, 2, 3], [5.0, 4.1, 3.5], "float32")
    assert v.to_dict() == {
        "ok": False, "dtype": "float32", "threshold": "relative 1e-05", "steps": [1, 2, 3],
        "diffs": [0.0, v.diffs[1], 0.0], "first_diverging_step": 2, "worst_step": 2,
        "max_abs_diff": v.diffs[1], "max_rel_diff": v.diffs[1] / 4.1, "problem": None,
        "run_losses": [5.0, 4.0, 3.5], "base_losses": [5.0, 4.1, 3.5], "resolution": 1e-6}
    assert math.isclose(v.diffs[1], 0.1) and math.isclose(v.max_rel_diff, 0.1 / 4.1)
    bad = bad_pairing("float32", "x: no")  # NaN differences (no number) are JSON null
    assert math.isnan(bad.max_abs_diff) and math.isnan(bad.max_rel_diff)
    assert bad.to_dict()["max_abs_diff"] is None and bad.to_dict()["max_rel_diff"] is None


def test_a_step_exactly_at_the_threshold_or_at_the_print_resolution_passes():
    # float32 at loss 1.0: the threshold is 1e-5; 0.5 is a loss under the scale floor
    assert allowed_diff("float32", 0.5) == 1e-5 and allowed_diff("float32", -4.0) == 4e-5
    assert allowed_diff("bfloat16", 300.0) == 1e-2
    at = judge_baseline([1], [1e-5], [1], [0.0], "float32", resolution=1e-7)
    assert at.diffs == (1e-5,) and at.ok, at  # |diff| exactly the threshold: within it
    over = judge_baseline([1], [1.0 + 1.2e-5], [1], [1.0], "float32", resolution=1e-7)
    assert not over.ok and over.first_diverging_step == 1
    # a difference at the print resolution is never counted, whatever the threshold (a
    # trainer printing 4 decimals: 1e-4 is over float32's 1e-5 and still within)
    printed = judge_baseline([1], [1e-4], [1], [0.0], "float32", resolution=1e-4)
    assert printed.ok and printed.diffs == (1e-4,)
    assert judge_baseline([1], [2e-4], [1], [0.0], "float32", resolution=1e-4).ok is False
    # the one per-step limit both the verdict and the report's divergence plot use
    assert step_limit("float32", -4.0, 1e-7) == 4e-5
    assert step_limit("float32", 1.0, 1e-4) == 1e-4 * (1 + 1e-6)
    edge = 1e-4 * (1 + 1e-6)  # the resolution with its rounding slack: still the resolution
    assert judge_baseline([1], [edge], [1], [0.0], "float32", resolution=1e-4).ok


def test_each_bad_pairing_names_where_what_and_keeps_the_dtype():
    cases = [
        (([1], [1.0], [1], [1.0], "float16"),
         "P: no baseline threshold for dtype 'float16'; expected one of "
         "['bfloat16', 'float32']"),
        (([1, 2], [1.0], [1], [1.0], "float32"),
         "P: the run has 2 steps but 1 losses; expected one loss a step"),
        (([1], [1.0], [], [], "float32"), "P: the baseline has no steps; expected step losses"),
        (([1, 1], [1.0, 1.0], [1], [1.0], "float32"),
         "P: the run has a step twice; expected each once"),
        (([1], [1.0], [1], [math.nan], "bfloat16"),
         "P: the baseline loss at step 1 is nan; expected a finite loss"),
        (([1, 2, 3], [1.0] * 3, [1, 3, 5], [1.0] * 3, "float32"),
         "P: the baseline has steps 1,3,5, the run 1-3; expected the run's steps"),
    ]
    for args, problem in cases:
        v = judge_baseline(*args, where="P")
        assert (v.ok, v.problem, v.dtype) == (False, problem, args[4]), v
        assert v.threshold == threshold_text(args[4])
        assert v.lines() == [f"bad pairing: {problem}"]
    unnamed = judge_baseline([1], [1.0], [], [], "float32")
    assert unnamed.problem == "the baseline has no steps; expected step losses"


def test_spans_and_threshold_texts():
    assert [_span(s) for s in ([3, 1, 2], [7], [1, 3, 5], [])] == ["1-3", "7", "1,3,5", ""]
    assert [threshold_text(d) for d in ("float32", "bfloat16", "float16")] == \
        ["relative 1e-05", "absolute 0.01", "none"]


# --- the printed learning rate (judge_lr) ---------------------------------------------------

def _schedule(style, steps=10, warmup=2, decay=10, peak=1e-5, floor=1e-6, clamp=0.0):
    """The lr step n prints (lr(k = n-1), warmup from 0) by the formulas of FACTS.md
    `feat/lr_scheduler` (lr_scheduler.cc L36-83); `clamp` plants a floor above min_lr on the
    decay."""
    out = []
    for k in range(steps):
        if k < warmup:
            lr = peak * k / warmup
        else:
            j, span = k - warmup, decay - warmup
            if style == "linear":
                lr = peak * (1 + (floor / peak - 1) * min(j, span) / span)
            else:  # cosine
                lr = floor if j > span else \
                    floor + 0.5 * (math.cos(math.pi * j / span) + 1) * (peak - floor)
            lr = max(lr, clamp)
        out.append(lr)
    return out


def _printed(lrs):
    """The lrs as `{:.2e}` prints them, read back with their resolutions."""
    texts = [f"{x:.2e}" for x in lrs]
    return [float(t) for t in texts], [printed_resolution(t) for t in texts]


def _judge(run, base, where="P"):
    (run_lrs, run_res), (base_lrs, base_res) = _printed(run), _printed(base)
    steps = range(1, len(run) + 1)
    return judge_lr(steps, run_lrs, run_res, range(1, len(base) + 1), base_lrs, base_res, where)


def test_the_same_schedule_passes_and_says_so():
    v = _judge(_schedule("linear"), _schedule("linear"))
    assert v.ok and v.problem is None and v.first_diverging_step is None
    assert v.steps == tuple(range(1, 11)) and v.max_abs_diff == 0.0
    assert v.run_lrs[:3] == (0.0, 5e-6, 1e-5) and v.limits[0] == 0.0  # 0.00e+00 is exact


def test_planted_warmup_one_step_short_fails_at_step_2():
    # the schedule shifted by one step: step 2 prints lr 1.00e-05 where it should print 5.00e-06
    v = _judge(_schedule("linear", warmup=1), _schedule("linear", warmup=2))
    assert not v.ok and v.first_diverging_step == 2, v
    assert v.lines()[0] == ("lr first diverging step 2: run 1e-05 == baseline 5e-06 ± 1.0e-07 "
                            "failed (|diff| 5e-06)")


def test_planted_cosine_floor_2e6_fails_at_the_last_steps():
    # a cosine that stops at 2e-6 instead of min_lr 1e-6: the last three of 12 steps
    base = _schedule("cosine", steps=12)
    v = _judge(_schedule("cosine", steps=12, clamp=2e-6), base)
    over = [s for s, r, b, lim in zip(v.steps, v.run_lrs, v.base_lrs, v.limits)
            if abs(r - b) > lim]
    assert not v.ok and v.first_diverging_step == 10 and over == [10, 11, 12], v
    assert v.worst_step == 11 and v.max_abs_diff == pytest.approx(1e-6)
    assert "step 10: run 2e-06 == baseline 1.34e-06" in v.lines()[0]


def test_half_rounding_one_unit_apart_passes():
    # measured by InfiniTensor: InfiniTrain's float32 8.874999e-06 prints 8.87e-06, PyTorch's
    # 8.875e-06 prints 8.88e-06 (real logs: tests/logs/fixtures/lr_scheduler)
    v = judge_lr([4, 6], [8.87e-6, 6.62e-6], [1e-8, 1e-8], [4, 6], [8.88e-6, 6.63e-6],
                 [1e-8, 1e-8], "P")
    assert v.ok, v.lines()
    assert v.max_abs_diff == pytest.approx(1e-8) and v.limits[0] >= 1e-8
    # full precision (resolution 0) against a print: the coarser side's place counts
    assert judge_lr([4], [8.875e-6], [0.0], [4], [8.87e-6], [1e-8], "P").ok
    assert not judge_lr([4], [8.9e-6], [0.0], [4], [8.87e-6], [1e-8], "P").ok
    # two units apart is a drift
    assert not judge_lr([4], [8.86e-6], [1e-8], [4], [8.88e-6], [1e-8], "P").ok


def test_a_printed_zero_is_exact():
    assert printed_resolution("0.00e+00") == 0.0 and printed_resolution("0.000000E+00") == 0.0
    assert printed_resolution("0.000000") == 1e-6  # fixed notation keeps its place
    assert printed_resolution("1.00e-05") == pytest.approx(1e-7)
    assert printed_resolution("-nan") is None
    zero = printed_resolution("0.00e+00")
    v = judge_lr([1], [0.0], [zero], [1], [1e-9], [0.0], "P")
    assert not v.ok and v.first_diverging_step == 1
    assert not judge_lr([1], [0.0], [zero], [1], [1e-9], [printed_resolution("1.00e-09")],
                        "P").ok
    # the naive 10**(0-2) would have passed anything up to 1e-2 at a warmup step
    assert judge_lr([1], [0.0], [1e-2], [1], [1e-9], [0.0], "P").ok


def test_the_limit_is_the_coarser_place_plus_a_tiny_relative_slack():
    assert lr_limit(1e-5, 1e-5, 1e-7, 1e-8) == pytest.approx(1e-7 + LR_RELATIVE_SLACK * 1e-5)
    assert lr_limit(0.0, 0.0, 0.0, 0.0) == 0.0
    assert LR_RELATIVE_SLACK * 1e-5 < 1e-8 / 100  # far below the printed place


@pytest.mark.parametrize("args, problem", [
    (([1, 2], [1e-5, math.nan], [1e-7, 0.0], [1, 2], [1e-5, 5e-6], [1e-7, 1e-8]),
     "P: the run printed no lr at step 2 (the baseline printed 5e-06); expected a finite "
     "learning rate at every step"),
    (([1], [1e-5], [1e-7], [1], [None], [None]),
     "P: the baseline printed no lr at step 1 (the run printed 1e-05); expected a finite "
     "learning rate at every step"),
    (([1], [None], [None], [1], [math.nan], [None]),
     "P: the run and the baseline printed no lr at step 1; expected a finite learning rate "
     "at every step"),
    (([1, 2, 3], [1e-5] * 3, [0.0] * 3, [1, 2], [1e-5] * 2, [0.0] * 2),
     "P: the baseline has lrs at steps 1-2, the run at 1-3; expected the run's steps"),
    (([1, 2], [1e-5], [0.0], [1, 2], [1e-5] * 2, [0.0] * 2),
     "P: the run has 2 steps, 1 lrs and 1 resolutions; expected one lr and one resolution a "
     "step"),
    (([1], [1e-5], [0.0], [], [], []), "P: the baseline has no steps; expected an lr per step"),
    (([1, 1], [1e-5] * 2, [0.0] * 2, [1], [1e-5], [0.0]),
     "P: the run has a step twice; expected each once"),
    (([1], [1e-5], [-1.0], [1], [1e-5], [0.0]),
     "P: the run lr's print resolution at step 1 is -1.0; expected a finite resolution >= 0"),
])
def test_a_missing_lr_or_other_steps_is_a_problem_never_a_pass(args, problem):
    v = judge_lr(*args, where="P")
    assert (v.ok, v.problem) == (False, problem)
    assert v.lines() == [f"bad pairing: {problem}"]
    assert v.to_dict()["max_abs_diff"] is None  # NaN is JSON null


def test_the_lr_record_holds_every_field_by_its_name():
    v = judge_lr([1, 2], [0.0, 1e-5], [0.0, 1e-7], [1, 2], [0.0, 9.8e-6], [0.0, 1e-8], "P")
    d = v.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d == {"ok": False, "steps": [1, 2], "run_lrs": [0.0, 1e-5], "base_lrs": [0.0, 9.8e-6],
                 "limits": [0.0, v.limits[1]], "first_diverging_step": 2, "worst_step": 2,
                 "max_abs_diff": v.max_abs_diff, "problem": None}
    assert v.limits[1] == pytest.approx(1e-7 + LR_RELATIVE_SLACK * 1e-5)
    assert v.lines()[1].startswith("worst lr |diff| 2e-07 at step 2 (run 1e-05 baseline "
                                   "9.8e-06; limit 1.0e-07)")


def test_step_lines_give_the_lr_its_print_resolution():
    line = ("step    {n}/10 | train loss 5.219545 | lr {lr} | (876.42 ms | 5842 tok/s | "
            "peak used:  1775 MB | peak reserved:  1920 MB, DP=2, TP=4, SP=4, PP=1)\n")
    steps = parse_step_lines(line.format(n=1, lr="0.00e+00") + line.format(n=4, lr="8.87e-06"))
    assert [(s["lr"], s["lr_resolution"]) for s in steps] == [(0.0, 0.0), (8.87e-6, 1e-8)]
    assert steps[0]["loss_resolution"] == 1e-6  # the loss's own place, unchanged
