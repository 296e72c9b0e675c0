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


def test_calibrate_under_xdist_then_the_next_session_uses_it(tmp_path):
    where = folder(tmp_path, [{"id": "ok", "args": PP2}, {"id": "ok2", "args": PP2},
                              {"id": "bad-grad", "args": PP2},
                              {"id": "bf", "args": {"dtype": "bfloat16"}}])
    run, records, session_dir = session(where, "--harness-calibrate", "3", "-n", "2",
                                        grad_noise=2e-6, loss_noise=2e-8)
    assert run.returncode == 1, run.stdout + run.stderr  # bad-grad fails, as without it
    assert {n: r["status"] for n, r in records.items()} == {
        "fake/gpt2/ok": "passed", "fake/gpt2/ok2": "passed", "fake/gpt2/bad-grad": "failed",
        "fake/gpt2/bf": "passed"}
    assert {r["worker"] for r in records.values()} == {"gw0", "gw1"}
    # A calibration session judges with the defaults, and its record says so.
    assert records["fake/gpt2/ok"]["calibration"] == {
        "file": None, "gradients_noise": None, "loss_noise": None,
        "thresholds": F32.to_dict(), "problem": None}
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
    assert ok["status"] == "passed"
    assert ok["calibration"] == {"file": str(path), "gradients_noise": data["gradients_noise"],
                                 "loss_noise": data["loss_noise"], "thresholds": expected,
                                 "problem": None}
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
