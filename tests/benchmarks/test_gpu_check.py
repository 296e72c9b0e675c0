"""benchmarks/gpu_check.sh: its CPU dry-run end to end on a tiny selection (every part, the same
code paths as on CUDA with --harness-device cpu), the summary's structure and counts; the
refusal without CUDA; a part past its budget killed with everything it started."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_check  # noqa: E402

SCRIPT = REPO / "benchmarks" / "gpu_check.sh"
PARTS = ["environment", "matrix/torchrun", "matrix/zygote", "cross_device/cpu",
         "cross_device/device", "throughput"]


def md_rows(markdown: str) -> list[list[str]]:
    """The cells of every markdown table row (escaped pipes kept inside their cell)."""
    return [[cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            for line in markdown.splitlines() if line.startswith("|")]


def _env(**extra) -> dict:
    env = dict(os.environ, PYTHON=sys.executable, **extra)
    env.pop("GPU_CHECK_DEVICE", None)
    return env


@pytest.mark.slow
def test_cpu_dry_run_summary(tmp_path):
    out = tmp_path / "check"
    started = time.time()
    done = subprocess.run(
        [str(SCRIPT), "--device", "cpu", "-k", "gpt2 and single", "--out", str(out),
         "--budget-scale", "5", "--throughput-preset", "tiny", "--throughput-models", "gpt2",
         "--throughput-dtypes", "float32", "--throughput-steps", "3",
         "--throughput-warmup", "1"],
        cwd=REPO, env=_env(GPU_CHECK_TIMEOUT="1500"), capture_output=True, text=True,
        timeout=1600)
    wall = time.time() - started
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

    summary = json.loads((out / "gpu_check_summary.json").read_text())
    assert summary["format"] == "harness.gpu_check/1"
    assert summary["complete"] is True and summary["ok"] is True
    assert summary["device"] == "cpu" and summary["dry_run"] is True and summary["gpus"] == 1
    assert summary["wall_s"] <= wall + 1
    assert summary["problems"] == []

    env = summary["environment"]
    assert env["torch"] and env["python"]
    assert isinstance(env["gpu_count"], int) and isinstance(env["cuda_available"], bool)
    assert set(summary["plan"]["dtypes"]) == {"float32", "bfloat16"}
    assert "basic/gpt2/single" in summary["plan"]["fit_names"]

    parts = summary["parts"]
    assert [p["name"] for p in parts] == PARTS
    for part in parts:
        assert part["returncode"] == 0 and part["timed_out"] is False and part["ok"] is True
        assert 0 < part["wall_s"] <= part["budget_s"]
        assert Path(part["log"]).is_file()
    budgets = summary["budgets"]
    assert budgets["matrix/torchrun"] == 5 * gpu_check.BUDGETS["matrix/torchrun"]

    # The matrix: the one selected case under each launcher, per-step results and timings.
    cases = summary["matrix"]["cases"]
    assert sorted((c["launcher"], c["name"]) for c in cases) == [
        ("torchrun", "basic/gpt2/single"), ("zygote", "basic/gpt2/single")]
    for case in cases:
        assert case["status"] == "passed" and case["device"] == "cpu"
        assert case["dtype"] == "float32" and case["world_size"] == 1
        assert len(case["losses"]) == 4 and case["losses"] == case["reference_losses"]
        assert len(case["step_times_ms"]) == 3
        assert case["timings"]["run_s"] > 0 and case["tokens_per_s"] > 0
        assert case["loss_max_abs_diff"] == 0 and case["grad_max_abs_diff"] == 0
        assert case["tolerances"]["loss"]["atol"] == 1e-5
    for launcher in ("torchrun", "zygote"):
        assert summary["matrix"]["counts"][launcher] == {
            "passed": 1, "failed": 0, "skipped": 0, "error": 0, "total": 1}
    assert summary["matrix"]["launchers_agree"]["compared"] == 1
    assert summary["matrix"]["launchers_agree"]["identical"] == 1

    # Cross-device: one check per dtype of the config; on CPU both sides are CPU: identical.
    checks = {c["dtype"]: c for c in summary["cross_device"]["checks"]}
    assert set(checks) == {"float32", "bfloat16"}
    for dtype, check in checks.items():
        assert check["name"] == f"cross_device/gpt2/single-{dtype}"
        assert check["status"] == "passed", check
        assert check["key_match"] is True and check["reference_devices"] == ["cpu", "cpu"]
        assert check["loss"]["compared"] == 4 and check["loss"]["max_abs_diff"] == 0
        assert check["gradients"]["parameters"] > 0 and check["gradients"]["mismatched"] == 0
        assert [s["step"] for s in check["steps"]] == [1, 2, 3, 4]
        assert all(s["abs_diff"] == 0 for s in check["steps"])
        assert Path(check["cpu_reference"], "COMPLETE.json").is_file()
    assert checks["bfloat16"]["tolerances"]["gradients"] == {"atol": 3e-3, "rtol": 2e-2}
    assert checks["bfloat16"]["relative_thresholds"]["gradients"] == 2e-2
    assert summary["cross_device"]["counts"]["passed"] == 2

    rows = summary["throughput"]["rows"]
    assert [(r["model"], r["dtype"], r["device"]) for r in rows] == [("gpt2", "float32", "cpu")]
    assert rows[0]["trainer_tokens_per_s"] > 0 and rows[0]["plain_tokens_per_s"] > 0
    assert summary["throughput"]["status"] == "passed"

    # 2 matrix runs + 2 cross-device checks + the throughput benchmark.
    assert summary["counts"] == {"passed": 5, "failed": 0, "skipped": 0, "error": 0, "total": 5}
    md = (out / "gpu_check_summary.md").read_text()
    assert md == summary["markdown"]
    assert "dry-run on CPU" in md and "**result: PASS**" in md
    rows = md_rows(md)
    assert ["torchrun", "`basic/gpt2/single`", "float32", "1", "passed"] in [r[:5] for r in rows]
    assert ["`cross_device/gpt2/single-bfloat16`", "bfloat16", "passed"] in [r[:3] for r in rows]
    print(f"gpu_check CPU dry-run: {wall:.1f} s")


def test_summary_tables_are_markdown_tables():
    """Each table of the summary is a pipe table (tabulate's), one row per part, case, check
    and throughput row; a pipe inside a cell (a reason) stays inside it."""
    passed = gpu_check.count(["passed"])
    summary = {
        "dry_run": False, "device": "cuda", "gpus": 1, "select": None, "marker": "basic",
        "complete": True, "ok": False, "counts": gpu_check.count(["passed", "failed"]),
        "environment": {"gpus": [{"name": "H200"}], "driver": "570"},
        "parts": [{"name": "environment", "budget_s": 30, "wall_s": 1.25, "returncode": 0,
                   "timed_out": False, "ok": True},
                  {"name": "matrix/torchrun", "budget_s": 110, "wall_s": 110.0,
                   "returncode": -9, "timed_out": True}],
        "matrix": {"cases": [
            {"launcher": "torchrun", "name": "basic/gpt2/single", "dtype": "float32",
             "world_size": 1, "status": "passed", "loss_max_abs_diff": 0.0,
             "timings": {"run_s": 3.21}},
            {"launcher": "torchrun", "name": "basic/gpt2/pp4", "status": "skipped"}],
            "counts": {"torchrun": passed}},
        "cross_device": {"checks": [
            {"name": "cross_device/gpt2/single-bfloat16", "dtype": "bfloat16",
             "status": "failed", "reason": "loss | gradients", "loss": {"max_abs_diff": 2e-5},
             "relative_thresholds": {"gradients": 0.02}}]},
        "throughput": {"rows": [{"model": "gpt2", "dtype": "float32", "device": "cuda",
                                 "tokens_per_step": 512, "trainer_tokens_per_s": 1000.4,
                                 "plain_tokens_per_s": 999.0, "ratio": 1.0014}]},
    }
    md = gpu_check.markdown(summary)
    assert "# GPU check (cuda)" in md and "**result: FAIL**" in md and "(H200)" in md
    rows = md_rows(md)
    assert ["part", "budget s", "wall s", "rc", "timed out", "ok"] in rows
    assert ["environment", "30", "1.25", "0", "no", "yes"] in rows
    assert ["matrix/torchrun", "110", "110", "-9", "yes", "NO"] in rows
    assert ["torchrun", "`basic/gpt2/single`", "float32", "1", "passed", "0", "–", "–", "–",
            "3.21"] in rows
    assert not any("`basic/gpt2/pp4`" in row for row in rows)  # skipped: counted, not listed
    assert "1 skipped (need more devices than 1" in md
    assert ["`cross_device/gpt2/single-bfloat16`", "bfloat16", "failed", "2e-05", "–",
            "– (0.02)", "loss \\| gradients"] in rows
    assert ["gpt2", "float32", "cuda", "512", "1000", "999", "1.001"] in rows
    assert all(len(row) == len(rows[0]) for row in rows[:4])  # the parts table: one shape


def test_cuda_refused_without_a_device(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "check"
    done = subprocess.run([str(SCRIPT), "--out", str(out)], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    summary = json.loads((out / "gpu_check_summary.json").read_text())
    assert summary["device"] == "cuda" and summary["ok"] is False
    assert [p["name"] for p in summary["parts"]] == ["environment"]
    assert "no CUDA device" in summary["problems"][0] and "--device cpu" in done.stderr


def test_part_past_its_budget_is_killed_with_what_it_started(tmp_path):
    """A part whose process starts a child in a session of its own (as torchrun and the
    zygote do) is killed whole when it runs past its budget."""
    pid_file = tmp_path / "grandchild.pid"
    code = ("import subprocess, sys, time\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
            "start_new_session=True)\n"
            f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
            "time.sleep(600)\n")
    summary = {"parts": []}
    part = gpu_check.run_part(summary, "sleeper", [sys.executable, "-c", code], 3.0,
                              tmp_path / "sleeper.log")
    assert part["timed_out"] is True  # how fast: benchmarks/timing_bounds.py
    grandchild = int(pid_file.read_text())
    for _ in range(50):
        if not Path(f"/proc/{grandchild}").exists() or \
                Path(f"/proc/{grandchild}/stat").read_text().split(") ")[1].startswith("Z"):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"process {grandchild} outlived its part")
    assert summary["parts"] == [part]
