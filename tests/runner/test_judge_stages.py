"""The verdict's stages with run data that differs from the reference, in process: no trainer
is launched (the heavy end-to-end tests were the only ones to see these plants, ~5 minutes).

Plants this module catches, each named by the test that sees it:
  A  `judge` handed the reference twice: the losses or the gradients compared ref vs ref
     (in `judge` itself, or in `CaseRunner.judge` passing the reference as the run).
  B  a collected failure (the run crashed, `Collected.failure`) returned as a pass by
     `CaseRunner._run`, or judged on whatever dumps the crashed run left.
  C  `settle` calibrating something other than the case's plan, reference, run and verdict,
     or dropping the float64 oracle's ratio (survivors of the mutation run, 2026-12-04).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from harness.compare.case_verdict import CaseVerdict, judge
from harness.compare.verdict import RelativeThresholds
from harness.contracts.records import write_steps
from harness.contracts.tolerance import Tolerance

TOL = Tolerance(atol=1e-5, rtol=0.0)
REF_STEPS = [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}]
RUN_STEPS = [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.7}]  # step 2's loss is off
REF_GRADS = {"h.0.w": [1.0, 2.0], "h.1.w": [3.0, 4.0]}
RUN_GRADS = {"h.0.w": [1.0, 2.0], "h.1.w": [3.0, 4.5]}  # h.1.w is off


def _dump(folder, arrays):
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in arrays.items():
        np.save(folder / f"{name}.npy", np.asarray(value, np.float32))
    return folder


def test_judge_fails_run_losses_and_gradients_that_differ_from_the_reference(tmp_path):
    """Plant A (in `judge`): the reference compared with itself, losses or gradients."""
    run, ref = _dump(tmp_path / "run", RUN_GRADS), _dump(tmp_path / "ref", REF_GRADS)
    verdict = judge(RUN_STEPS, REF_STEPS, TOL, 1e-5, (run, ref), TOL, 1e-5, None)
    assert not verdict.loss.ok, "the run's losses were not compared with the reference's"
    assert not verdict.gradients.ok, "the run's gradients were not compared with the reference's"
    assert [d.name for d in verdict.gradients.mismatched] == ["h.1.w"]
    assert not verdict.ok
    same = judge(REF_STEPS, REF_STEPS, TOL, 1e-5, (ref, ref), TOL, 1e-5, None)
    assert same.ok  # the same data passes: the failures above are the differences


@pytest.fixture
def runner(tmp_path):
    """A CaseRunner of one plain gpt2 case, and the case; nothing launches."""
    from harness.cases import load_config
    from harness.runner import CaseRunner, Settings

    (tmp_path / "cases.json").write_text(json.dumps({
        "models": ["gpt2"],
        "test_groups": [{"tag": "t", "tests": [{"id": "one", "args": {}}]}]}))
    config = load_config(tmp_path / "cases.json")
    settings = Settings(session_id="s", session_dir=tmp_path / "session",
                        reference_root=tmp_path / "refs", lease_dir=tmp_path / "leases",
                        slots=1, device="cpu", timeout_s=60)
    return CaseRunner(config, settings), config.cases[0]


def _staged(tmp_path, case):
    """What the plan, reference and collect stages hand the judge: the run differing."""
    from harness.runner.stages import Collected

    ref_steps = tmp_path / "reference" / "steps.jsonl"
    ref_steps.parent.mkdir(parents=True)
    write_steps(ref_steps, REF_STEPS)
    reference = SimpleNamespace(steps_file=ref_steps, path=ref_steps.parent, key="k",
                                built=False, info={},
                                gradients_dir=_dump(tmp_path / "reference" / "gradients",
                                                    REF_GRADS))
    planned = SimpleNamespace(case=case, flags={}, out=tmp_path / "run", gradients=True,
                              checkpoint=tmp_path / "gpt2.bin", input_bin=tmp_path / "t.bin",
                              updates=None, relative=RelativeThresholds(loss=1e-5,
                                                                        gradients=1e-5),
                              # what the record is assembled from
                              record_flags={}, gradients_note=None, calibration=None,
                              layout=None, target=None)
    outputs = SimpleNamespace(steps=RUN_STEPS, gradients_dir=_dump(tmp_path / "run" / "gradients",
                                                                   RUN_GRADS))
    return planned, reference, Collected(outputs, None, None)


def test_judge_compares_the_run_not_the_reference_with_itself(runner, tmp_path):
    """Plant A (in `CaseRunner.judge`): the reference's steps or gradient folder passed as the
    run's."""
    runner, case = runner
    planned, reference, collected = _staged(tmp_path, case)
    judged = runner.judge(planned, collected, reference)
    assert not judged.verdict.ok
    assert judged.summary["loss"]["ok"] is False, judged.summary
    assert judged.summary["gradients"]["ok"] is False, judged.summary


def test_a_collected_failure_is_the_outcome_never_a_pass(runner, tmp_path, monkeypatch):
    """Plant B: `CaseRunner._run` returning a collected failure (the run crashed) as a pass,
    or going on to judge the dumps the crashed run left (here they would pass)."""
    from harness.runner import stages
    from harness.runner.settings import Outcome
    from harness.runner.stages import Collected, Referenced

    runner, case = runner
    planned, reference, _ = _staged(tmp_path, case)
    crashed = Collected(SimpleNamespace(steps=REF_STEPS, gradients_dir=reference.gradients_dir),
                        None, "t/gpt2/one: rank 0 exited with 1: boom")
    judged = []
    monkeypatch.setattr(runner, "plan", lambda case, layout: planned)
    monkeypatch.setattr(runner, "reference", lambda *args: Referenced(reference, 0.0))
    monkeypatch.setattr(runner, "num_layers", lambda model: None)
    monkeypatch.setattr(stages, "run", lambda *args, **kwargs: SimpleNamespace(launched=None))
    monkeypatch.setattr(runner, "collect", lambda *args: crashed)
    monkeypatch.setattr(runner, "judge", lambda *args: judged.append(1) or CaseVerdict(
        None, None, None))
    monkeypatch.setattr(runner, "baseline", lambda *args: None)
    monkeypatch.setattr(runner, "settle", lambda *args: Outcome("passed", ""))
    outcome = runner.run(case)
    assert outcome.status == "failed", (outcome.status, outcome.message)
    assert "boom" in outcome.message
    assert outcome.record["status"] == "failed" and outcome.record["self_check"] == "failed"
    assert not judged, "a crashed run's dumps were judged"


def _launched(planned, collected):
    """What `settle` takes of the launch: where the run wrote, and its command."""
    spec = SimpleNamespace(gradients_dir=collected.outputs.gradients_dir,
                           output_dir=planned.out)
    return SimpleNamespace(spec=spec, result=SimpleNamespace(argv=["trainer"]))


def test_a_calibration_session_measures_the_run_it_settles(runner, tmp_path, monkeypatch):
    """--harness-calibrate: `settle` hands the float64 oracle and the repeats the case's own
    plan (case, checkpoint, input, folder), its reference, the run's steps and, when the
    verdict passed, the verdict's summary; the oracle's ratio is kept in what it settles,
    and a calibration's problem is the case's error. Plants (mutation survivors of
    `settle`): any of `_calibrate`'s four arguments None, the ratio not passed on."""
    import dataclasses

    from harness.runner import case_runner
    from harness.runner.calibrate import CalibrationError

    runner, case = runner
    runner.settings = dataclasses.replace(runner.settings, calibrate_repeats=3)
    planned, reference, collected = _staged(tmp_path, case)
    same = SimpleNamespace(steps=REF_STEPS, gradients_dir=_dump(tmp_path / "run" / "g2",
                                                                REF_GRADS))
    collected = dataclasses.replace(collected, outputs=same)  # a run that passes
    launched, judged = _launched(planned, collected), runner.judge(planned, collected, reference)
    assert judged.verdict.ok
    calls = []
    monkeypatch.setattr(case_runner, "oracle_ratio", lambda *args: calls.append(
        ("oracle", args)) or {"ratio": 0.5})
    monkeypatch.setattr(case_runner, "measure", lambda *args: calls.append(("measure", args)))
    settled = runner.settle(planned, launched, reference, collected, judged)
    assert settled.outcome.status == "passed", settled.outcome.message
    assert settled.fp64_ratio == {"ratio": 0.5}
    assert calls == [
        ("oracle", (runner, case, reference, planned.checkpoint, planned.input_bin, planned.out,
                    REF_STEPS)),
        ("measure", (runner, case, reference, planned.checkpoint, planned.input_bin,
                     judged.summary))]

    # a run that failed: the repeats get no summary to measure against, and it still fails
    calls.clear()
    differing = _staged(tmp_path / "failing", case)[2]  # the run off the reference
    judged_failing = runner.judge(planned, differing, reference)
    settled = runner.settle(planned, launched, reference, differing, judged_failing)
    assert settled.outcome.status == "failed"
    assert calls[1] == ("measure", (runner, case, reference, planned.checkpoint,
                                    planned.input_bin, None))

    def fails(*args):
        raise CalibrationError("the repeats disagree: planted")

    monkeypatch.setattr(case_runner, "measure", fails)
    settled = runner.settle(planned, launched, reference, collected, judged)
    assert (settled.outcome.status, settled.outcome.message) == (
        "error", "t/gpt2/one: the repeats disagree: planted")
    assert settled.fp64_ratio == {"ratio": 0.5}  # measured before the repeats failed


@pytest.mark.parametrize("self_check", ["passed", "failed"])
@pytest.mark.parametrize("baseline", [None, "passed", "skipped", "failed", "error"])
def test_settle_says_both_verdicts_each_under_its_name(runner, tmp_path, self_check, baseline):
    """The outcome of each self-check x baseline status, and its text's first lines: a
    baseline that failed or errored fails a case whose self-check passed, and the header
    names what the run differs from. Plants (mutation survivors of `settle`): the baseline's
    failing statuses misspelt or negated, `baseline_failed` None, the self-check's line
    changed."""
    import dataclasses

    from harness.baseline.live import BaselineCheck

    runner, case = runner
    planned, reference, collected = _staged(tmp_path, case)
    if self_check == "passed":
        collected = dataclasses.replace(collected, outputs=SimpleNamespace(
            steps=REF_STEPS, gradients_dir=_dump(tmp_path / "run" / "g2", REF_GRADS)))
    launched, judged = _launched(planned, collected), runner.judge(planned, collected, reference)
    check = None if baseline is None else BaselineCheck(
        "pytorch (live)", baseline, reason=f"planted {baseline}")
    outcome = runner.settle(planned, launched, reference, collected, judged, check).outcome
    red = baseline in ("failed", "error")
    assert outcome.status == ("passed" if self_check == "passed" and not red else "failed")
    if outcome.status == "passed":
        assert outcome.message == ""
        return
    lines = outcome.message.splitlines()
    against = [*(["the single-device reference"] if self_check == "failed" else []),
               *(["the pytorch (live) baseline"] if red else [])]
    assert lines[0] == f"t/gpt2/one: the run differs from {' and from '.join(against)}"
    assert lines[1] == f"  self-check (against its own single-device run): {self_check}"
    assert sum("self-check" in line for line in lines) == 1  # said once, as it went
    said = f"  baseline (pytorch (live)): {baseline}: planted {baseline}"
    assert (said in lines) is red
    if self_check == "failed":
        assert lines[2].startswith("  loss: ")  # the self-check's own lines under its name
    assert lines[-3:] == [f"run folder: {planned.out}", f"reference: {reference.path}",
                          "command: trainer"]


def test_judge_cuts_the_reference_by_the_shards_the_backend_names_for_the_flags(runner,
                                                                                 tmp_path):
    """A trainer that dumps un-gathered TP shards (InfiniTrain): `judge` asks the backend,
    with the case's flags, how many shards a file is cut by, and compares slices. Plants
    (mutation survivors of `CaseRunner.judge`): the shards left out, or asked of no flags."""
    runner, case = runner
    planned, reference, collected = _staged(tmp_path, case)
    planned.flags = {"tensor_parallel": 2}
    asked = []
    runner.backend.gradient_shards = lambda flags: asked.append(flags) or int(
        flags.get("tensor_parallel", 1))
    judged = runner.judge(planned, collected, reference)
    assert asked == [{"tensor_parallel": 2}]
    assert "tp_slices" in judged.summary["gradients"]  # compared as TP-2 slices


def test_a_calibration_that_cannot_judge_makes_the_plan_an_error(runner, monkeypatch):
    """A calibration that is unreadable, or whose noise is above the ceiling, makes the case
    an error before anything launches, named by the case. Plants (mutation survivors of
    `CaseRunner.plan`): the status or the text changed or dropped."""
    from harness.runner import case_runner
    from harness.runner.calibrate import CalibrationError

    runner, case = runner

    def above(*args):
        raise CalibrationError("the calibration x.json measured gradient noise 1e-4: planted")

    monkeypatch.setattr(case_runner, "session_thresholds", above)
    monkeypatch.setattr(runner, "model_files", lambda model: (None, None))
    outcome = runner.plan(case, None)
    assert (outcome.status, outcome.message) == (
        "error", "t/gpt2/one: the calibration x.json measured gradient noise 1e-4: planted")


def test_the_plan_carries_the_thresholds_and_the_calibration_it_was_given(runner, monkeypatch):
    """What the session's thresholds are (the defaults, or this machine's calibration) goes
    into the plan whole: the record says which calibration judged the case. Plant (mutation
    survivor of `CaseRunner.plan`): the calibration dropped."""
    from harness.runner import case_runner

    runner, case = runner
    relative = RelativeThresholds(loss=2e-5, gradients=3e-5)
    calibration = {"file": "x.json", "thresholds": relative.to_dict(), "problem": None}
    monkeypatch.setattr(case_runner, "session_thresholds", lambda *args: (relative, calibration))
    monkeypatch.setattr(runner, "model_files", lambda model: (None, None))
    planned = runner.plan(case, None)
    assert (planned.relative, planned.calibration) == (relative, calibration)
