"""benchmarks/sensitivity.py, noise_floor.py and verdict_matrix.py: their own logic (argument
handling, the thresholds a probe is judged with, the table assembly), on small synthetic
dumps and records; no trainer run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import noise_floor  # noqa: E402
import sensitivity  # noqa: E402
import verdict_matrix  # noqa: E402

from harness.compare.calibration import Calibration  # noqa: E402
from harness.compare.verdict import RelativeThresholds  # noqa: E402

FP32_TOL = {"loss": {"atol": 1e-5, "rtol": 0}, "gradients": {"atol": 1e-5, "rtol": 0}}


def calibration(tmp_path, dtype="float32", gradients=1.8e-7, loss=2.1e-8, name="cal.json"):
    cal = Calibration(trainer="harness", trainer_version="v1", device="cpu", host="h",
                      dtype=dtype, repeats=3, cases=5, loss_noise=loss,
                      gradients_noise=gradients, worst_parameter="h.0.ln_1.weight",
                      worst_case="basic/gpt2/tp2", created_at="2026-12-01T00:00:00")
    path = tmp_path / name
    path.write_text(json.dumps(cal.to_json()))
    return path


# --- sensitivity.py -------------------------------------------------------------------------

def test_parse_args_defaults_and_calibration():
    a = sensitivity.parse_args(["S"])
    assert (a.session, a.case, a.no_runs, a.calibration, a.tablefmt) == \
        ("S", "basic/gpt2/pp2", False, None, "simple")
    a = sensitivity.parse_args(["S", "--calibration", "c.json", "--no-runs", "--case", "x/y/z",
                                "--tablefmt", "github"])
    assert a.calibration == Path("c.json") and a.no_runs and a.case == "x/y/z"
    with pytest.raises(SystemExit):
        sensitivity.parse_args([])


def test_threshold_sets_defaults_only_without_a_file():
    sets = sensitivity.threshold_sets("float32", None)
    assert [s.label for s in sets] == ["default"]
    assert sets[0].thresholds == RelativeThresholds(loss=1e-5, gradients=1e-5)


def test_threshold_sets_calibrated_is_max_of_default_and_ten_times_noise(tmp_path):
    # fp32 noise far below the defaults: the calibration keeps the defaults
    sets = sensitivity.threshold_sets("float32", calibration(tmp_path))
    assert [s.label for s in sets] == ["default", "calibrated"]
    assert sets[1].thresholds == sets[0].thresholds
    assert "1.8e-07" in sets[1].source and "3 repeats" in sets[1].source
    # bf16 gradient noise 2.07e-3: 10x is above the default 2e-2, so it loosens it
    sets = sensitivity.threshold_sets("bfloat16", calibration(tmp_path, "bfloat16", 2.07e-3,
                                                              7.3e-6))
    assert sets[1].thresholds.gradients == pytest.approx(2.07e-2)
    assert sets[1].thresholds.loss == 1e-4  # 7.3e-5 < the default


def test_threshold_sets_refuses_another_dtype_a_ceiling_and_junk(tmp_path):
    with pytest.raises(ValueError, match="for bfloat16, the case is float32"):
        sensitivity.threshold_sets("float32", calibration(tmp_path, "bfloat16", 1e-3, 1e-6))
    with pytest.raises(ValueError, match="above the ceiling"):
        sensitivity.threshold_sets("float32", calibration(tmp_path, gradients=1e-5))
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match="format"):
        sensitivity.threshold_sets("float32", bad)
    with pytest.raises(ValueError, match="not a readable calibration"):
        sensitivity.threshold_sets("float32", tmp_path / "missing.json")


def test_trainer_flags_of_each_launcher():
    flags = ["--dtype=float32", "--batch_size=2"]
    zygote = ["py", "-m", "harness.launch.zygote", "run", "--nproc-per-node", "1", "--log-dir",
              "L", "--", *flags]
    assert sensitivity.trainer_flags(zygote) == flags
    assert sensitivity.trainer_flags(["py", "-m", "harness.trainer", *flags]) == flags
    assert sensitivity.trainer_flags(["torchrun", "--nproc_per_node=2", "-m", "harness.trainer",
                                      *flags]) == flags
    with pytest.raises(ValueError, match="not a bundled-trainer command"):
        sensitivity.trainer_flags(["./infini_train", *flags])


def test_dropped_microbatch_flags():
    flags = ["--batch_size=2", "--sequence_length=32", "--total_batch_size=512", "--seed=1"]
    fewer, n = sensitivity.dropped_microbatch_flags(flags)
    assert n == 8
    assert fewer == ["--batch_size=2", "--sequence_length=32", "--seed=1",
                     "--total_batch_size=448"]
    with pytest.raises(ValueError, match="nothing to drop"):
        sensitivity.dropped_microbatch_flags(["--batch_size=2", "--sequence_length=32",
                                              "--total_batch_size=64"])


def _dumps(tmp_path, scale=1.0):
    ref, got = tmp_path / "ref", tmp_path / f"got-{scale:g}"
    ref.mkdir(exist_ok=True)
    got.mkdir()
    rng = np.random.default_rng(0)
    for name, size in (("a.weight", 64), ("b.bias", 8)):
        a = (rng.standard_normal(size) * 1e-3).astype(np.float32)
        np.save(ref / f"{name}.npy", a)
        np.save(got / f"{name}.npy", (a * np.float32(scale)) if name == "a.weight" else a)
    return got, ref


def test_measure_and_which_verdict_catches(tmp_path):
    sets = [sensitivity.ThresholdSet("default", RelativeThresholds(1e-5, 1e-5), "d"),
            sensitivity.ThresholdSet("calibrated", RelativeThresholds(1e-5, 2e-4), "c")]
    losses = [{"step": 1, "loss": 6.0}]
    got, ref = _dumps(tmp_path, 1 + 1e-4)
    m = sensitivity.measure("x 1e-4", got, ref, losses, losses, FP32_TOL, None,
                            loss_compared=False)
    assert m.grad_rel == pytest.approx(1e-4, rel=1e-3) and m.grad_rel_at == "a.weight"
    assert not m.grad_elementwise_caught  # gradients of 1e-3: moved by 1e-7 < atol 1e-5
    assert sensitivity.caught_by(m, sets) == ["grad scale-free default"]
    r = sensitivity.row(m, sets)
    assert len(r) == len(sensitivity.headers(sets, FP32_TOL))
    assert r[4].startswith("CAUGHT (0.1x)") and r[5].startswith("pass (2x)")
    assert r[6:10] == ["(as run)"] * 4 and r[-1] == "grad scale-free default"
    # a loss 1e-3 off (relative): every loss verdict catches it
    m = sensitivity.measure("loss", ref, ref, [{"step": 1, "loss": 6.006}], losses, FP32_TOL,
                            None)
    assert m.grad_rel == 0 and m.loss_rel == pytest.approx(1e-3)
    assert sensitivity.caught_by(m, sets) == ["loss element-wise", "loss scale-free default",
                                              "loss scale-free calibrated"]
    noise = sensitivity.measure("noise", ref, ref, losses, losses, FP32_TOL, None)
    assert sensitivity.row(noise, sets)[-1] == "nothing"
    assert "pass (infx)" in sensitivity.row(noise, sets)


def test_table_side_by_side(tmp_path):
    sets = sensitivity.threshold_sets("float32", calibration(tmp_path))
    losses = [{"step": 1, "loss": 6.0}]
    got, ref = _dumps(tmp_path, 1 + 1e-3)
    text = sensitivity.table([sensitivity.measure("p", got, ref, losses, losses, FP32_TOL,
                                                  None)], sets, FP32_TOL, "github")
    header = text.splitlines()[0]
    assert "scale-free default (1e-05)" in header and "scale-free calibrated (1e-05)" in header
    assert "element-wise (atol 1e-05, rtol 0)" in header and "caught by" in header
    assert "grad scale-free default, grad scale-free calibrated" in text


# --- noise_floor.py -------------------------------------------------------------------------

def test_noise_floor_margins_default_recorded_and_calibrated(tmp_path):
    rows = [{"case": "c1", "dtype": "float32", "grad_max_abs": 1e-7, "grad_rel": 2e-7,
             "grad_rel_at": "w", "loss_abs": 1e-7, "loss_rel": 1e-8,
             "thresholds": {"loss": 1e-5, "gradients": 1e-5}, "calibration_file": None},
            {"case": "c2", "dtype": "float32", "grad_max_abs": 0.0, "grad_rel": 0.0,
             "grad_rel_at": "-", "loss_abs": 0.0, "loss_rel": 0.0,
             "thresholds": {"loss": 1e-5, "gradients": 1e-5}, "calibration_file": "F"}]
    cal = Calibration.read(calibration(tmp_path, gradients=2e-6))  # 10x: 2e-5 > 1e-5
    lines = noise_floor.margin_lines(rows, [cal])
    assert lines[0].startswith("float32: 2 cases; worst grad ‖Δ‖/‖ref‖ 2e-07 (c1, w)")
    assert lines[1] == "  default: gradients 1e-05 (margin 50x), loss 1e-05 (margin 1e+03x)"
    assert lines[2].startswith("  as recorded (F): ") and lines[3].startswith(
        "  as recorded (defaults): ")
    assert lines[4].endswith("gradients 2e-05 (margin 100x), loss 1e-05 (margin 1e+03x)")
    # a calibration of another dtype adds nothing
    assert len(noise_floor.margin_lines(rows, [Calibration.read(
        calibration(tmp_path, "bfloat16", 1e-3, 1e-6, "b.json"))])) == 4


# --- verdict_matrix.py ----------------------------------------------------------------------

def _record(name, status, dtype="float32", file=None, th=(1e-5, 1e-5)):
    return {"name": name, "status": status, "flags": {"dtype": dtype},
            "calibration": {"file": file, "thresholds": {"loss": th[0], "gradients": th[1]},
                            "problem": None}}


def test_verdict_matrix_counts_rates_and_thresholds(tmp_path):
    session = tmp_path / "s1"
    session.mkdir()
    records = [_record("a", "passed"), _record("b", "failed"), _record("c", "skipped"),
               _record("d", "passed", "bfloat16", "C.json", (1e-4, 2.07e-2)),
               _record("a", "passed")]  # a retried case counts once
    (session / "results.jsonl").write_text("\n".join(map(json.dumps, records)) + "\nnot json\n")
    read = verdict_matrix.read_records(session)
    assert sorted(r["name"] for r in read) == ["a", "b", "c", "d"]
    bf16, fp32 = verdict_matrix.summarize(read)
    assert (fp32["dtype"], fp32["ran"], fp32["passed"], fp32["failed"], fp32["skipped"]) == \
        ("float32", 2, 1, 1, 1)
    assert fp32["failing"] == ["b"] and verdict_matrix.rate(fp32) == "1/2 (50.0 %)"
    assert fp32["thresholds"] == {"grad 1e-05, loss 1e-05 (defaults)": 2}
    assert bf16["files"] == ["C.json"]
    assert bf16["thresholds"] == {"grad 0.0207, loss 0.0001 (calibrated)": 1}
    table = verdict_matrix.rows([("s1", read)])
    assert table[0][:8] == ["s1", "bfloat16", 1, 1, 0, 0, "0/1 (0.0 %)", 0]
    assert table[1][-1] == "b" and len(table[0]) == len(verdict_matrix.HEADERS)
    assert verdict_matrix.main([str(session)]) == 0
