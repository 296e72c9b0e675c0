"""--harness-calibrate end to end with the fake trainer (tests/plugin/fake_trainer.py, its
FAKE_GRAD_NOISE / FAKE_LOSS_NOISE run-to-run noise): a calibration session under xdist writes
one file per dtype beside the reference cache from every worker's repeats and passing cases
(a failing case's error is no noise); the next session judges with noise x MARGIN and says so in
the record and the report; a calibration above the ceiling makes the cases errors; one made on
another host is reported, not used. And the merge of measurements on its own."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harness.compare.calibration import MARGIN, Calibration, calibration_path
from harness.compare.verdict import relative_thresholds
from harness.runner.calibrate import MEASUREMENTS, write_calibrations
from tests.plugin.conftest import fake_config, plugin_args

pytestmark = pytest.mark.subprocess  # every session launches the fake trainer

F32 = relative_thresholds("float32")
PP2 = {"pipeline_parallel": 2}


def folder(tmp_path: Path, tests: list[dict]) -> Path:
    for model in ("gpt2", "llama3"):
        (tmp_path / f"{model}.bin").write_bytes(model.encode() * 8)
        (tmp_path / f"{model}_tokens.bin").write_bytes(b"tokens" * 8)
    (tmp_path / "cases.json").write_text(json.dumps(fake_config(tests)))
    (tmp_path / "records").mkdir()
    return tmp_path


def session(where: Path, *more: str, grad_noise: float = 0.0, loss_noise: float = 0.0):
    env = {**os.environ, "FAKE_GRAD_NOISE": str(grad_noise), "FAKE_LOSS_NOISE": str(loss_noise),
           "FAKE_RECORD_DIR": str(where / "records")}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *plugin_args(), "--harness-config",
         str(where / "cases.json"), "--harness-output", str(where / "out"),
         "--harness-device", "cpu", "-p", "no:cacheprovider", "-q", *more],
        cwd=where, env=env, capture_output=True, text=True, timeout=120)
    sessions = sorted((where / "out" / "sessions").glob("*/results.jsonl"))
    records = {}
    if sessions:
        for line in sessions[-1].read_text().splitlines():
            record = json.loads(line)
            records[record["name"]] = record
    return run, records, sessions[-1].parent if sessions else None


def test_k_below_3_is_a_usage_error(tmp_path):
    where = folder(tmp_path, [{"id": "ok"}])
    run, _, _ = session(where, "--harness-calibrate", "2")
    assert run.returncode == 4
    assert "a calibration needs K >= 3 repeats to estimate anything; got 2" in run.stderr


def _failed(records: dict) -> str:
    """The session's records that did not pass, each with its reason and errors: what a flaky
    failure (issue 35: `fake/gpt2/ok2` failed once in a calibration session in CI) leaves to
    read once its temporary folder is gone."""
    return "\n".join(f"{name}: {r['status']}: {r.get('reason')}\n" + "\n".join(
        str(e) for e in r.get("errors") or []) for name, r in sorted(records.items())
        if r["status"] != "passed") or "every record passed"


# The fake's run-to-run noise scales a whole parameter by 1 + E u (u in [-1, 1)), so two runs of
# a gradient of 2.64 may differ by up to 2 x 2e-6 x 2.64 = 1.06e-5: over the default elementwise
# atol of 1e-5 (CI failed `ok` once on 1.00136e-05; issue 35's flaky test). What a calibration
# loosens are the scale-free thresholds; the elementwise atol is the config's, so these cases set
# one their noise fits (1e-4, 9x the widest difference), and only the thresholds the calibration
# decides can fail them.
NOISY = {"gradients": {"atol": 1e-4, "rtol": 0}}


def test_calibrate_under_xdist_then_the_next_session_uses_it(tmp_path):
    where = folder(tmp_path, [{"id": "ok", "args": PP2, "tolerances": NOISY},
                              {"id": "ok2", "args": PP2, "tolerances": NOISY},
                              {"id": "bad-grad", "args": PP2, "tolerances": NOISY},
                              {"id": "bf", "args": {"dtype": "bfloat16"}}])
    run, records, session_dir = session(where, "--harness-calibrate", "3", "-n", "2",
                                        grad_noise=2e-6, loss_noise=2e-8)
    assert run.returncode == 1, run.stdout + run.stderr  # bad-grad fails, as without it
    assert {n: r["status"] for n, r in records.items()} == {
        "fake/gpt2/ok": "passed", "fake/gpt2/ok2": "passed", "fake/gpt2/bad-grad": "failed",
        "fake/gpt2/bf": "passed"}, _failed(records)
    assert {r["worker"] for r in records.values()} == {"gw0", "gw1"}
    # A calibration session judges with the defaults, and its record says so.
    assert records["fake/gpt2/ok"]["calibration"] == {
        "file": None, "gradients_noise": None, "loss_noise": None,
        "thresholds": F32.to_dict(), "problem": None,
        "fp64_ratio": None}  # a foreign trainer: no float64 oracle
    # Each reference key: built once, repeated twice (the PP cases share one key).
    references = (where / "records" / "references.jsonl").read_text().splitlines()
    assert len(references) == 2 * 3
    measured = [json.loads(x) for x in (session_dir / MEASUREMENTS).read_text().splitlines()]
    assert sorted(m["case"] for m in measured if m["kind"] == "case") == \
        ["fake/gpt2/bf", "fake/gpt2/ok", "fake/gpt2/ok2"]  # never the failing case
    assert sum(m["kind"] == "repeat" for m in measured) == 4

    root = where / "out" / "reference-cache"
    path = calibration_path(root, "fake-1", "cpu", "float32")
    assert f"calibration written: {path}" in run.stdout
    data = json.loads(path.read_text())
    assert {k: data[k] for k in ("format", "trainer", "trainer_version", "device", "host",
                                 "dtype", "repeats", "cases")} == {
        "format": "harness.calibration/1", "trainer": "command", "trainer_version": "fake-1",
        "device": "cpu", "host": socket.gethostname(), "dtype": "float32", "repeats": 3,
        "cases": 2}
    # The noise is run-to-run (at most 2 x 2e-6 here); bad-grad's 0.5 was not counted.
    assert 1e-6 < data["gradients_noise"] < 5e-6
    assert 0 < data["loss_noise"] < 1e-7
    assert data["worst_parameter"].startswith(("h.", "w", "ln_f"))
    # a passing case, or a repeat of the PP reference (which the failing case may have run)
    assert data["worst_case"] in ("fake/gpt2/ok", "fake/gpt2/ok2") or \
        "(reference repeat " in data["worst_case"]
    assert calibration_path(root, "fake-1", "cpu", "bfloat16").is_file()

    run, records, session_dir = session(where, grad_noise=2e-6, loss_noise=2e-8)
    assert run.returncode == 1, run.stdout + run.stderr
    ok = records["fake/gpt2/ok"]
    expected = {"loss": max(F32.loss, data["loss_noise"] * MARGIN),
                "gradients": max(F32.gradients, data["gradients_noise"] * MARGIN)}
    assert expected["gradients"] > F32.gradients  # this noise loosened the default
    assert ok["status"] == "passed", _failed(records)
    assert ok["calibration"] == {"file": str(path), "gradients_noise": data["gradients_noise"],
                                 "loss_noise": data["loss_noise"], "thresholds": expected,
                                 "problem": None, "fp64_ratio": None}
    assert ok["gradients"]["relative"]["threshold"] == expected["gradients"]
    assert records["fake/gpt2/bad-grad"]["status"] == "failed"  # a real bug still fails
    report = subprocess.run([sys.executable, "-m", "harness.report", str(session_dir)],
                            capture_output=True, text=True, cwd=where)
    assert report.returncode == 0, report.stderr
    text = (session_dir / "report.md").read_text()
    assert f"- calibrated by `{path}`" in text
    assert "`fake/gpt2/ok`" in text.split(f"calibrated by `{path}`")[1].splitlines()[0]


def test_a_calibration_above_the_ceiling_makes_the_next_sessions_cases_errors(tmp_path):
    where = folder(tmp_path, [{"id": "ok", "args": PP2}])
    run, records, _ = session(where, "--harness-calibrate", "3", grad_noise=1e-4)
    path = calibration_path(where / "out" / "reference-cache", "fake-1", "cpu", "float32")
    noise = json.loads(path.read_text())["gradients_noise"]
    assert noise * MARGIN > 5e-5, run.stdout  # the repeats count whatever the case did

    run, records, _ = session(where)  # a deterministic run: it would pass, but nothing can judge it
    assert run.returncode == 1
    record = records["fake/gpt2/ok"]
    assert record["status"] == "error" and record["calibration"] is None
    assert f"the calibration {path} measured gradient noise" in record["reason"]
    assert "above the ceiling 5e-05" in record["reason"]
    assert "no threshold both passes this machine's noise and catches a 1e-4 stage bug" in \
        record["reason"]
    assert str(path) in run.stdout

    # The same file made on another host: reported, not used. The defaults judge, and fail
    # the run against the reference the noisy calibration session built (1e-4 off).
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "host": "elsewhere"}))
    run, records, _ = session(where)
    assert records["fake/gpt2/ok"]["status"] == "failed", run.stdout
    assert records["fake/gpt2/ok"]["gradients"]["relative"]["threshold"] == F32.gradients
    stored = records["fake/gpt2/ok"]["calibration"]
    assert stored["file"] is None and stored["thresholds"] == F32.to_dict()
    assert f"the calibration {path} was made for another environment (host 'elsewhere', " \
           f"this session '{socket.gethostname()}')" in stored["problem"]


# ---------------------------------------------------------------------- the float64 oracle

# A 1e-4 bug planted in the launched processes, never in the trainer's code: pipeline stage 1's
# gradients of the cases named *-bug scaled by 1 + 1e-4 after every backward. Patched when the
# parallel engine is imported (the zygote imports it once, before forking ranks; processes that
# never import it, pytest's own, pay nothing), so the session's PYTHONPATH carries it and the
# zygote still serves (the trainer's environment is the session's).
PLANTED = """
import importlib.abc, importlib.util, os, sys

def _patch(engine):
    original = engine.ParallelEngine.forward_backward
    def forward_backward(self, inputs, targets):
        loss = original(self, inputs, targets)
        if os.environ.get("HARNESS_CASE", "").endswith("-bug") and self.world.pp_rank == 1:
            for part in self.parts:
                for parameter in part.parameters():
                    if parameter.grad is not None:
                        parameter.grad.mul_(1 + 1e-4)
        return loss
    engine.ParallelEngine.forward_backward = forward_backward

class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "harness.trainer.parallel.engine":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            _patch(module)
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _Finder())
"""


@pytest.mark.torchrun  # the bundled trainer's ranks (through the zygote)
def test_a_bundled_trainer_calibration_runs_a_float64_oracle_per_reference_key(tmp_path):
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(PLANTED)
    config = {"models": ["gpt2"], "assets": {"preset": "tiny", "seed": 0},
              "defaults": {"batch_size": 2, "sequence_length": 16, "total_batch_size": 128,
                           "num_iteration": 2, "learning_rate": 0.001},
              "test_groups": [{"tag": "cal", "tests": [{"id": "pp2", "args": PP2},
                                                       {"id": "pp2-bug", "args": PP2}]}]}
    (tmp_path / "cases.json").write_text(json.dumps(config))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(shim), *filter(None, [os.environ.get("PYTHONPATH")])])}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *plugin_args(), "--harness-config",
         str(tmp_path / "cases.json"), "--harness-output", str(tmp_path / "out"),
         "--harness-device", "cpu", "--gpus", "2", "--harness-calibrate", "3", "-n", "2",
         "-p", "no:cacheprovider", "-q"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    session_dir = sorted((tmp_path / "out" / "sessions").glob("*/results.jsonl"))[-1].parent
    records = {r["name"]: r for r in map(json.loads,
                                         (session_dir / "results.jsonl").read_text().splitlines())}
    assert {n: r["status"] for n, r in records.items()} == {
        "cal/gpt2/pp2": "passed", "cal/gpt2/pp2-bug": "failed"}, run.stdout[-3000:]

    # Another rounding order (or none: a CPU pipeline can be bitwise the reference) is as far
    # from the exact answer as the reference is: order 1.
    clean = records["cal/gpt2/pp2"]["calibration"]["fp64_ratio"]
    assert 0 <= clean["gradients"] <= 3 and 0 <= clean["loss"] <= 3, clean
    assert isinstance(clean["gradients_parameter"], str)
    # The 1e-4 stage bug is ~1e3 x the reference's float32 distance from float64.
    bug = records["cal/gpt2/pp2-bug"]["calibration"]["fp64_ratio"]
    assert bug["gradients"] > 100, bug
    assert bug["gradients_parameter"].startswith(("h.4.", "h.5.", "h.6.", "h.7.", "ln_f", "wte")), bug

    # One float64 run for the key both cases share: one device, the reference's flags, float64;
    # its gradient dump removed at the session's end (every ratio is in its record).
    oracles = list((session_dir / "calibration").glob("*/fp64"))
    assert len(oracles) == 1 and (oracles[0] / "DONE").is_file()
    ran = json.loads((oracles[0] / "run.json").read_text())
    assert ran["flags"]["dtype"] == "float64" and ran["flags"]["pipeline_parallel"] == 1
    assert ran["environment"]["world_size"] == 1
    assert not (oracles[0] / "gradients").exists()
    # The calibration itself is as before: the failing case's error is no noise.
    assert "calibration written: " in run.stdout

    report = subprocess.run([sys.executable, "-m", "harness.report", str(session_dir)],
                            capture_output=True, text=True, cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    text = (session_dir / "report.md").read_text()
    assert "Float64 oracle (calibration session" in text
    lines = [x for x in text.splitlines() if x.startswith("- `cal/gpt2/pp2")]
    assert lines[0].startswith("- `cal/gpt2/pp2-bug`: gradients ")  # the largest ratio first
    assert f"at `{bug['gradients_parameter']}`" in lines[0]


# ---------------------------------------------------------------------- the merge alone


def line(kind, case, loss, gradients, parameter=None, dtype="float32", **more):
    return {"trainer": "command", "trainer_version": "v1", "device": "cuda", "dtype": dtype,
            "host": "gpu-1", "kind": kind, "case": case, "loss": loss, "gradients": gradients,
            "parameter": parameter, **more}


def test_the_merge_takes_the_worst_of_repeats_and_cases_per_group(tmp_path):
    entries = [line("case", "t/gpt2/a", 1e-8, 2e-7, "h.0.w"),
               line("repeat", "t/gpt2/a (reference repeat 1)", 3e-8, 9e-7, "h.5.w", repeat=1),
               line("case", "t/gpt2/b", 5e-8, 1e-7, "h.1.w"),
               line("repeat", "t/gpt2/b (reference repeat 1)", None, None, repeat=1),
               line("case", "t/gpt2/bf", 1e-6, 1e-3, "wte", dtype="bfloat16"),
               line("failure", "t/gpt2/bf", None, None, dtype="bfloat16", problem="crashed\nx")]
    (tmp_path / MEASUREMENTS).write_text("".join(json.dumps(e) + "\n" for e in entries)
                                         + '{"cut short')
    lines = write_calibrations(tmp_path, tmp_path / "cache", 4)
    path = calibration_path(tmp_path / "cache", "v1", "cuda", "float32")
    written = Calibration.read(path)
    assert (written.loss_noise, written.gradients_noise) == (5e-8, 9e-7)
    assert (written.worst_parameter, written.worst_case) == \
        ("h.5.w", "t/gpt2/a (reference repeat 1)")
    assert (written.repeats, written.cases, written.host) == (4, 2, "gpu-1")
    assert not calibration_path(tmp_path / "cache", "v1", "cuda", "bfloat16").exists()
    assert any("bfloat16 not written: 1 reference repeat(s) failed" in x and "crashed" in x
               for x in lines)
    assert any(x.startswith(f"calibration written: {path}") for x in lines)
