"""The recorded baseline's pairing with a case (harness.baseline.recorded) and the summary line
(harness.results.baseline_summary), in process."""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.baseline.recorded import recorded_check
from harness.results.baseline_summary import NONE_CHECKED, baseline_summary


@dataclass
class FakeCase:
    model: str = "gpt2"
    case_id: str = "1"
    tag: str = "basic"
    args: dict = field(default_factory=lambda: {"dtype": "float32"})


LINE = "step {:4d}/3 | train loss {:.6f} | lr 1.00e-04 | (1.0 ms | 1 tok/s | peak used: 0 MB)\n"


def run_folder(tmp_path, name, losses, file="gpt2_1.log"):
    folder = tmp_path / name / "logs"
    folder.mkdir(parents=True)
    (folder / file).write_text("".join(LINE.format(i + 1, x) for i, x in enumerate(losses)))
    return tmp_path / name


def steps(losses, lr=1e-4):
    return [{"step": i + 1, "loss": x, "loss_resolution": 1e-6, "lr": lr,
             "lr_resolution": 1e-6} for i, x in enumerate(losses)]


def test_a_recorded_run_of_the_case_is_judged_step_by_step(tmp_path):
    base = run_folder(tmp_path, "b", [5.0, 4.9, 4.8])
    ok = recorded_check(base, FakeCase(), steps([5.0, 4.9, 4.8000001]), 1)
    assert ok.status == "passed", ok
    bad = recorded_check(base, FakeCase(), steps([5.0, 4.95, 4.8]), 1)
    assert (bad.status, bad.verdict.first_diverging_step) == ("failed", 2)


def test_the_recorded_lr_is_compared_and_a_run_without_one_says_so(tmp_path):
    base = run_folder(tmp_path, "b", [5.0, 4.9, 4.8])  # printed lr 1.00e-04 at every step
    drifted = recorded_check(base, FakeCase(), steps([5.0, 4.9, 4.8], lr=1.02e-4), 1)
    assert drifted.status == "failed" and drifted.verdict.ok
    assert drifted.lr.first_diverging_step == 1 and "lr: first diverging step 1" in drifted.reason
    bare = [{k: v for k, v in s.items() if not k.startswith("lr")} for s in steps([5.0, 4.9, 4.8])]
    unprinted = recorded_check(base, FakeCase(), bare, 1)
    assert unprinted.status == "passed" and unprinted.lr is None
    assert "lr not compared: the run printed none" in unprinted.note


def test_no_partner_is_a_skip_naming_the_case_and_folder(tmp_path):
    base = run_folder(tmp_path, "b", [5.0], file="llama3_1.log")
    got = recorded_check(base, FakeCase(), steps([5.0]), 1)
    assert got.status == "skipped" and "gpt2/1" in got.reason and str(base) in got.reason


def test_two_logs_for_one_case_are_an_error_naming_both(tmp_path):
    base = run_folder(tmp_path, "b", [5.0])
    (base / "again" / "logs").mkdir(parents=True)
    (base / "again" / "logs" / "gpt2_1.log").write_text(LINE.format(1, 5.0))
    got = recorded_check(base, FakeCase(), steps([5.0]), 1)
    assert got.status == "error" and got.reason.count("gpt2_1.log") >= 2, got.reason


def test_a_baseline_of_another_dtype_fails_saying_so(tmp_path):
    base = run_folder(tmp_path, "b", [5.0], file="gpt2_1_bfloat16.log")
    case = FakeCase(case_id="1_bfloat16", args={"dtype": "float32"})
    got = recorded_check(base, case, steps([5.0]), 1)
    assert got.status == "failed" and "bfloat16 baseline for a float32 case" in got.reason


def test_a_resumed_run_is_compared_from_its_first_step(tmp_path):
    base = run_folder(tmp_path, "b", [5.0, 4.9, 4.8])
    got = recorded_check(base, FakeCase(), steps([5.0, 4.9, 4.8])[2:], 3)
    assert got.status == "passed" and got.steps == (3,)


def test_the_summary_says_when_no_baseline_was_checked_for_a_foreign_trainer():
    assert baseline_summary([{"trainer": "infinitrain", "baseline": None}]) == NONE_CHECKED
    assert baseline_summary([{"trainer": "harness", "baseline": None}]) is None
    line = baseline_summary([
        {"name": "basic/gpt2/1", "baseline": {"source": "pytorch (live)", "status": "failed",
                                              "first_diverging_step": 2}},
        {"name": "lora/gpt2/1_lora", "baseline": {"source": "pytorch (live)",
                                                  "status": "skipped"}}])
    assert line == ("baseline (pytorch (live)): 1 failed, 1 skipped; first diverging: "
                    "basic/gpt2/1 at step 2")


def test_the_report_shows_both_verdicts_and_the_divergence_step_by_step():
    from harness.report.baseline import section

    loss = {"steps": [1, 2], "diffs": [3e-6, 4e-4], "worst_step": 2, "max_abs_diff": 4e-4,
            "threshold": "relative 1e-05"}
    lines = section([{"name": "basic/gpt2/1", "trainer": "infinitrain", "self_check": "passed",
                      "baseline": {"source": "pytorch (live)", "status": "failed",
                                   "first_diverging_step": 2, "loss": loss,
                                   "reason": "first diverging step 2"}}])
    text = "\n".join(lines)
    assert "| `basic/gpt2/1` | passed | failed | pytorch (live) | 2 | 0.0004 (2) |" in text
    assert "- `basic/gpt2/1`: 1: 3e-06, 2: 0.0004" in text
    assert section([{"trainer": "infinitrain", "baseline": None}])[2] == NONE_CHECKED


def test_the_report_says_what_the_gradients_against_the_baseline_showed():
    from harness.report.baseline import section

    def row(name: str, **baseline) -> str:
        record = {"name": name, "trainer": "infinitrain", "self_check": "passed",
                  "baseline": {"source": "pytorch (live)", "status": "passed", **baseline}}
        return next(line for line in section([record]) if line.startswith(f"| `{name}`"))

    failed = {"parameters": 101, "ok": False, "mismatched": 3, "missing": ["wpe.weight"],
              "extra": [], "shape_errors": [],
              "relative": {"failed": ["ln_f.bias", "h.0.ln_1.weight"],
                           "worst_parameter": "ln_f.bias", "worst": 1e-3}}
    assert "| failed: 2 of 101 differ, worst `ln_f.bias` 0.001; 1 missing, extra or of " \
           "another shape |" in row("a", gradients=failed)
    assert "| passed (101 parameters) |" in row("b", gradients={"parameters": 101, "ok": True})
    assert "| not compared: not dumped by this trainer |" in row(
        "c", gradients=None, gradients_reason="not dumped by this trainer")
    assert "| - |" in row("d")  # an older record: no gradients keys at all
