"""harness.compare.baseline field by field: the record it writes, the boundaries of a diverging
step, and each bad pairing's text and dtype. Written from a mutation run of the module
(docs/reliability.md): 63 of its 288 mutants survived the tests that reached it, most of them
in the record's keys, the thresholds' edges and the problem texts."""

from __future__ import annotations

import math

from harness.compare.baseline import (_span, allowed_diff, bad_pairing, judge_baseline,
                                      step_limit, threshold_text)


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
