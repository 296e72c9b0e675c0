"""harness.compare.case_verdict in process, no trainer: which comparisons `judge` makes from
what it is handed, and the failure text and record fields a verdict gives.

Written from the mutation check (benchmarks/mutation.py): the tests that reached this module
were plugin sessions and tests/runner/test_run_record.py, whose module fixture runs every case
once, so mutmut credits all of it to that module's first test and runs only that one; the
checks of the later tests (a path with "gradients" in it left alone, ...) never judged a
mutant. These check the same behaviour here, one call each."""

from __future__ import annotations

import numpy as np

from harness.compare.case_verdict import CaseVerdict, UpdatesRequest, judge
from harness.contracts.tolerance import Tolerance

TOL = Tolerance(atol=1e-5, rtol=0.0)
STEPS = [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}]


def _dump(folder, arrays):
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in arrays.items():
        np.save(folder / f"{name}.npy", np.asarray(value, np.float32))
    return folder


def _grads(tmp_path, run=None, ref=None):
    ref = ref or {"h.0.w": [1.0, 2.0, 3.0, 4.0]}
    return (_dump(tmp_path / "run" / "gradients", run or ref),
            _dump(tmp_path / "ref" / "gradients", ref))


def test_no_reference_steps_is_no_loss_comparison(tmp_path):
    verdict = judge(STEPS, None, TOL, 1e-5, _grads(tmp_path), TOL, 1e-5, None)
    assert verdict.loss is None and verdict.ok
    assert "loss" not in verdict.record() and "gradients" in verdict.record()
    lines = verdict.lines()
    assert lines and all(line.startswith("gradients") for line in lines), lines


def test_the_loss_is_judged_with_the_scale_free_threshold_too(tmp_path):
    # 2.0005 vs 2.0: within an atol of 1e-3, 2.5e-4 over the scale-free 1e-5
    run = [{"step": 1, "loss": 2.0005}]
    verdict = judge(run, [{"step": 1, "loss": 2.0}], Tolerance(atol=1e-3, rtol=0.0), 1e-5,
                    None, TOL, 1e-5, None)
    assert not verdict.ok and verdict.loss.elementwise_ok
    relative = verdict.record()["loss"]["relative"]
    assert relative["threshold"] == 1e-5 and relative["ok"] is False


def test_without_tensor_parallel_a_file_of_another_shape_is_a_shape_error(tmp_path):
    ref = {"h.0.w": np.arange(1.0, 9.0)}
    run = {"h.0.w": ref["h.0.w"][4:]}  # half of it: TP rank 1's slice at tp 2
    verdict = judge(STEPS, STEPS, TOL, 1e-5, _grads(tmp_path, run, ref), TOL, 1e-5, None)
    assert not verdict.ok
    assert verdict.gradients.shape_errors == ["h.0.w: shape (4,), reference (8,)"]
    assert "tp_slices" not in verdict.record()["gradients"]
    tp2 = judge(STEPS, STEPS, TOL, 1e-5, _grads(tmp_path, run, ref), TOL, 1e-5, None,
                tensor_parallel=2)
    assert tp2.ok and tp2.record()["gradients"]["tp_slices"] == 1


def test_a_verdict_without_a_loss_has_lines(tmp_path):
    gradients = judge(STEPS, STEPS, TOL, 1e-5, _grads(tmp_path, {"h.0.w": [1, 2, 3, 5]}), TOL,
                      1e-5, None).gradients
    lines = CaseVerdict(None, gradients, None).lines()
    assert lines[0].startswith("gradients: mismatched 1 of 1 parameters"), lines


def test_the_lines_are_loss_then_gradients_then_updates(tmp_path):
    run_steps = [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.7}]
    grads = _grads(tmp_path, {"h.0.w": [1, 2, 3, 5]})
    _dump(tmp_path / "ref" / "updates", {"h.0.w": [0.1, 0.2]})
    _dump(tmp_path / "run" / "updates", {"h.0.w": [0.1, 0.3]})
    verdict = judge(run_steps, STEPS, TOL, 1e-5, grads, TOL, 1e-5, None,
                    updates=UpdatesRequest(tmp_path / "run" / "updates",
                                           tmp_path / "ref" / "updates", 1e-3, 0.0))
    heads = [line.split(":")[0] for line in verdict.lines()]
    assert heads[0].startswith("loss") and "gradients" in heads, heads
    assert heads.index("gradients") < heads.index("parameter updates"), heads


def test_only_the_heading_of_an_update_line_is_renamed(tmp_path):
    # a folder with "gradients" in its name: the path in an update's error stays as it is
    grads = _grads(tmp_path)
    ref_updates = _dump(tmp_path / "ref" / "updates", {"h.0.w": [0.1, 0.2]})
    run_updates = tmp_path / "gradients-run" / "updates"
    run_updates.mkdir(parents=True)
    path = run_updates / "h.0.w.npy"
    np.save(path, np.array([0.1, 0.2]))  # float64: read whole, and its error names the file
    path.write_bytes(path.read_bytes()[:-4])  # cut short
    verdict = judge(STEPS, STEPS, TOL, 1e-5, grads, TOL, 1e-5, None,
                    updates=UpdatesRequest(run_updates, ref_updates, 1e-3, 0.0))
    line = next(l for l in verdict.lines() if "cannot be read" in l)
    assert line.startswith("parameter updates: h.0.w: the run's gradient file cannot be read")
    assert str(path) in line, line


def test_updates_the_reference_lacks_are_recorded_as_not_compared_and_failed(tmp_path):
    grads = _grads(tmp_path)
    _dump(tmp_path / "run" / "updates", {"h.0.w": [0.1, 0.2]})
    verdict = judge(STEPS, STEPS, TOL, 1e-5, grads, TOL, 1e-5, None,
                    updates=UpdatesRequest(tmp_path / "run" / "updates",
                                           tmp_path / "ref" / "updates", 1e-3, 0.0))
    reason = (f"the reference has no parameter updates in {tmp_path / 'ref' / 'updates'} (its "
              f"build did not dump them)")
    assert verdict.updates_missing == reason and not verdict.ok
    assert verdict.record()["gradients"]["parameter_updates"] == {
        "compared": False, "ok": False, "reason": reason}
    assert verdict.lines()[-1] == f"parameter updates: not compared: {reason}"


LOOSE = Tolerance(atol=1e-2, rtol=0.0)  # element-wise: every difference below is within it
REF = {"h.0.w": [1.0, 2.0, 3.0, 4.0], "h.1.w": [1.0, 2.0, 3.0, 4.0]}
OFF = {"h.0.w": [1.0, 2.0, 3.0, 4.0], "h.1.w": [1.0, 2.001, 3.0, 4.0]}  # 1.8e-4 of ||ref||


def test_the_gradients_are_judged_with_the_scale_free_threshold_too(tmp_path):
    verdict = judge(STEPS, STEPS, LOOSE, 1e-5, _grads(tmp_path, OFF, REF), LOOSE, 1e-5, None)
    assert not verdict.ok and verdict.gradients.elementwise_ok
    assert [d.name for d in verdict.gradients.relative_failures] == ["h.1.w"]
    assert verdict.record()["gradients"]["relative"]["threshold"] == 1e-5


def _updates(tmp_path, resolution, locator=None):
    grads = _grads(tmp_path, REF, REF)
    request = UpdatesRequest(_dump(tmp_path / "run" / "updates", OFF),
                             _dump(tmp_path / "ref" / "updates", REF), 1e-5, resolution)
    return judge(STEPS, STEPS, LOOSE, 1e-3, grads, LOOSE, 1e-3, locator, updates=request)


def test_updates_are_judged_with_their_own_threshold_and_resolution(tmp_path):
    # the gradients' threshold is 1e-3; the updates' own 1e-5 fails the 1.8e-4 difference
    verdict = _updates(tmp_path, 0.0)
    assert verdict.gradients.ok and not verdict.updates.ok and not verdict.ok
    updates = verdict.record()["gradients"]["parameter_updates"]
    assert updates["relative"]["threshold"] == 1e-5 and updates["relative"]["ok"] is False
    assert "parameter updates (scale-free): worst" in "\n".join(verdict.lines())
    # a per-element resolution of 1e-3 takes the 1e-3 difference as rounding
    assert _updates(tmp_path, 1e-3).ok


def test_updates_are_located_as_the_gradients_are(tmp_path):
    from harness.compare.locate import Locator

    verdict = _updates(tmp_path, 0.0, Locator(((0, 0, 1), (1, 1, 2))))
    located = {d.name: (d.stage, d.layer) for d in verdict.updates.diffs}
    assert located == {"h.0.w": ("0", "0"), "h.1.w": ("1", "1")}
    assert located == {d.name: (d.stage, d.layer) for d in verdict.gradients.diffs}


def test_an_empty_reference_updates_folder_is_no_reference_updates(tmp_path):
    grads = _grads(tmp_path)
    (tmp_path / "ref" / "updates").mkdir()
    verdict = judge(STEPS, STEPS, TOL, 1e-5, grads, TOL, 1e-5, None,
                    updates=UpdatesRequest(_dump(tmp_path / "run" / "updates", REF),
                                           tmp_path / "ref" / "updates", 1e-3, 0.0))
    assert verdict.updates is None and not verdict.ok
    assert verdict.updates_missing.startswith("the reference has no parameter updates in ")
