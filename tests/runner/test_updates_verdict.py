"""Parameter updates are judged, or the verdict says why not: never dropped in silence.

Planted: the reference's trainer stops dumping parameter updates. The old runner compared them
only `if updates and reference_updates.is_dir()`, so the case passed on its loss and gradients
alone and the record said nothing of the updates."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from harness.compare.case_verdict import UpdatesRequest, judge
from harness.contracts.tolerance import Tolerance

# The reference build (HARNESS_CASE=reference) runs without writing its updates.
NO_REFERENCE_UPDATES = textwrap.dedent("""
    import os
    if os.environ.get("HARNESS_CASE") == "reference":
        from harness.trainer import main

        main._dump_updates = lambda *args, **kwargs: None
""")


def _write(folder, values):
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in values.items():
        np.save(folder / f"{name}.npy", np.asarray(value, dtype=np.float32))


def _judge(tmp_path):
    """One step's loss, the gradients of run/ and ref/, and their updates, judged."""
    steps = [{"step": 1, "loss": 2.0}]
    tol = Tolerance(atol=1e-5, rtol=0.0)
    return judge(steps, steps, tol, 1e-5, (tmp_path / "run" / "gradients",
                                           tmp_path / "ref" / "gradients"), tol, 1e-5, None,
                 updates=UpdatesRequest(tmp_path / "run" / "updates",
                                        tmp_path / "ref" / "updates", 1e-3, 0.0))


def test_updates_without_reference_updates_fail_with_the_reason(tmp_path):
    _write(tmp_path / "run" / "gradients", {"h.0.w": [1.0, 2.0]})
    _write(tmp_path / "ref" / "gradients", {"h.0.w": [1.0, 2.0]})
    _write(tmp_path / "run" / "updates", {"h.0.w": [0.1, 0.2]})
    verdict = _judge(tmp_path)
    assert not verdict.ok
    assert verdict.lines()[-1].startswith("parameter updates: not compared: the reference has no "
                                          "parameter updates in ")
    assert verdict.record()["gradients"]["parameter_updates"]["compared"] is False
    _write(tmp_path / "ref" / "updates", {"h.0.w": [0.1, 0.2]})  # with them: compared, passes
    again = _judge(tmp_path)
    assert again.ok and again.record()["gradients"]["parameter_updates"]["ok"] is True


def test_a_run_that_writes_no_updates_fails_every_parameter_missing(tmp_path):
    """Planted: in `judge`, the update comparison guarded with `updates.got.is_dir()`. A run
    whose trainer stopped dumping its updates then passed on loss and gradients alone, and the
    record said nothing of the updates. It must fail with every parameter `missing`, and say
    the run wrote none."""
    names = {"h.0.w": [1.0, 2.0], "h.1.w": [3.0, 4.0]}
    _write(tmp_path / "run" / "gradients", names)
    _write(tmp_path / "ref" / "gradients", names)
    _write(tmp_path / "ref" / "updates", {"h.0.w": [0.1, 0.2], "h.1.w": [0.3, 0.4]})
    verdict = _judge(tmp_path)
    assert not verdict.ok
    updates = verdict.record()["gradients"]["parameter_updates"]
    assert updates["missing"] == ["h.0.w", "h.1.w"], updates
    assert updates["ok"] is False and updates["run_wrote_none"] is True
    assert "the run wrote no parameter updates" in updates["reason"]
    text = "\n".join(verdict.lines())
    assert "parameter updates: 2 missing from the run" in text, text
    assert "the run wrote no parameter updates" in text, text
    (tmp_path / "run" / "updates").mkdir()  # an empty folder: the same
    assert not _judge(tmp_path).ok


@pytest.mark.slow
def test_a_reference_that_dumps_no_updates_is_an_error_not_a_pass(pytester, tiny_assets):
    from tests.plugin.conftest import plugin_args

    shim = pytester.mkdir("shim")
    (shim / "sitecustomize.py").write_text(NO_REFERENCE_UPDATES)
    (pytester.path / "cases.json").write_text(json.dumps({
        "models": ["gpt2"], "trainer": {"env": {"PYTHONPATH": str(shim)}},
        "defaults": {"batch_size": 2, "sequence_length": 32, "total_batch_size": 64,
                     "num_iteration": 2, "learning_rate": 0.001},
        "test_groups": [{"tag": "upd", "tests": [{"id": "one", "args": {}}]}]}))
    out = pytester.path / "out"
    result = pytester.runpytest_subprocess(
        *plugin_args(), "--harness-config", str(pytester.path / "cases.json"),
        "--harness-output", str(out), "--harness-device", "cpu", "--gpus", "1",
        "--harness-reference-cache", str(pytester.path / "refs"), "-p", "no:cacheprovider",
        timeout=600)
    result.assert_outcomes(failed=1)
    record = json.loads(next(out.glob("sessions/*/results.jsonl")).read_text().splitlines()[0])
    assert record["status"] == "error", record["status"]
    assert "the reference run of gpt2 dumped no parameter updates (--dump_parameter_updates)" \
        in record["errors"][0]
