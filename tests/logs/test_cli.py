"""`python -m harness.logs`: the lines, report.md and the exit codes, on the fixtures (always)
and on the real InfiniTrain-Test logs under /work/shared (when they are there)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.logs.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
MEGATRON = FIXTURES / "megatron"
RUN = FIXTURES / "run" / "logs"
REAL = Path("/work/shared/data/infinitrain-test")
REAL_RUN = REAL / "infinitrain/logs/202511_a800/20251127/e7d57db_master"


def _main(capsys, *argv):
    code = main([str(a) for a in argv])
    return code, capsys.readouterr()


def test_a_passing_case_exits_0_and_writes_the_report(tmp_path, capsys):
    report = tmp_path / "out.md"
    code, out = _main(capsys, MEGATRON, RUN / "llama3_1.log", "-o", report)
    assert code == 0, out
    assert re.search(r"^PASSED llama3/1 float32 3 steps, worst \S+ at step \d "
                     r"\(threshold relative 1e-05\)$", out.out, re.M)
    text = report.read_text()
    assert "PASSED: 1" in text and "| llama3 | 1 | float32 | 3 |" in text
    assert "step 2 := 2*L2 - L1" in text


def test_a_failing_case_exits_1_with_its_first_diverging_step(tmp_path, capsys):
    code, out = _main(capsys, FIXTURES / "pytorch_ids", RUN / "gpt2_1.log", "-o", tmp_path)
    assert code == 1
    assert ("FAILED gpt2/1 float32 first diverging step 2: run 5.060790 baseline 5.060585"
            in out.out)
    text = (tmp_path / "report.md").read_text()
    assert "FAILED: 1" in text and "## Failures" in text
    assert "- llama3/1: no subject for the baseline" in text  # unpartnered, listed


def test_no_partner_exits_1_and_is_in_the_report(tmp_path, capsys):
    code, out = _main(capsys, MEGATRON, RUN, "-o", tmp_path / "r.md")
    assert code == 1
    assert "NO PARTNER gpt2/1 float32: no baseline for the subject" in out.out
    assert "PASSED llama3/1" in out.out
    assert "NO PARTNER: 1" in (tmp_path / "r.md").read_text()


def test_a_bad_input_is_one_line_and_its_case_stays(tmp_path, capsys):
    subject = tmp_path / "logs"
    subject.mkdir()
    (subject / "llama3_1.log").write_text("[COMMAND] ./llama3 --dtype float32\n")
    code, out = _main(capsys, MEGATRON, subject, "-o", tmp_path / "r.md")
    assert code == 1
    (line,) = [x for x in out.out.splitlines() if x.startswith("BAD INPUT")]
    assert f"BAD INPUT llama3/1 float32: subject: {subject / 'llama3_1.log'}: no " in line
    text = (tmp_path / "r.md").read_text()
    assert "| llama3 | 1 | float32 | 0 |" in text and "## Bad inputs" in text
    assert "NO PARTNER" not in out.out  # the baseline of a bad subject is not unpartnered


def test_a_nan_loss_is_a_bad_input_naming_the_file(tmp_path, capsys):
    log = tmp_path / "llama3_1.log"
    text = (RUN / "llama3_1.log").read_text().replace("train loss 4.086943", "train loss nan")
    log.write_text(text)
    code, out = _main(capsys, MEGATRON, log, "-o", tmp_path / "r.md")
    assert code == 1
    assert (f"BAD INPUT llama3/1 float32: subject {log} against baseline {MEGATRON}"
            in out.out)
    assert "the run loss at step 2 is nan; expected a finite loss" in out.out


def test_the_modules_are_torch_free():
    code = ("import sys, harness.logs, harness.logs.cli, harness.compare.baseline\n"
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("argv", [
    ["/nowhere/at/all", str(RUN)],
    [str(FIXTURES / "README.md"), str(RUN)],
    [str(MEGATRON)],
    [str(MEGATRON), str(RUN), "--pairing", "/nowhere/pairing.json"],
])
def test_unusable_arguments_exit_2(argv, capsys, tmp_path):
    assert main(argv + ["-o", str(tmp_path / "r.md")]) == 2
    assert not (tmp_path / "r.md").exists()


def test_a_pairing_file_through_the_cli(tmp_path, capsys):
    pairing = tmp_path / "pairing.json"
    pairing.write_text(json.dumps({"LLaMA3_2 (Single GPU, default batch, fp32)": "llama3_1"}))
    code, out = _main(capsys, FIXTURES / "pytorch_descriptive", RUN / "llama3_1.log",
                      "--pairing", pairing, "-o", tmp_path)
    # the GPT-2 section is paired by the table and has no subject here
    assert code == 1 and "PASSED llama3/1" in out.out and "NO PARTNER gpt2/1" in out.out


def test_module_entry_point(tmp_path):
    result = subprocess.run([sys.executable, "-m", "harness.logs", str(MEGATRON),
                             str(RUN / "llama3_1.log"), "-o", str(tmp_path / "r.md")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "PASSED llama3/1" in result.stdout


def _verdicts(capsys, baseline, tmp_path):
    code, out = _main(capsys, baseline, REAL_RUN, "-o", tmp_path / "r.md")
    lines = {m.group(2): (m.group(1), float(m.group(3))) for m in re.finditer(
        r"^(PASSED|FAILED) (\S+) \S+ .*?worst (\S+) at step", out.out, re.M)}
    return code, lines


@pytest.mark.skipif(not REAL_RUN.is_dir(), reason=f"the real InfiniTrain-Test logs are not "
                                                  f"here ({REAL_RUN}); the fixtures stand in")
def test_the_real_logs_give_the_documented_figures(capsys, tmp_path):
    code, got = _verdicts(capsys, REAL / "baseline/pytorch/logs/202511_a800", tmp_path)
    assert code == 1
    assert got["llama3/1"][0] == "PASSED" and got["llama3/1"][1] <= 3e-6 + 1e-9
    assert got["llama3/3"][0] == "PASSED" and got["llama3/3"][1] <= 3e-6 + 1e-9
    assert got["gpt2/1"][0] == "FAILED" and 6e-4 < got["gpt2/1"][1] < 8e-4  # 7e-4 at step 10
    assert got["gpt2/1_bfloat16"] == ("FAILED", pytest.approx(2.7e-2, abs=1e-3))
    code, got = _verdicts(capsys, REAL / "baseline/megatron/logs/qy_a100_g3025", tmp_path)
    assert got["llama3/1"][0] == "PASSED" and got["llama3/1"][1] <= 3e-6 + 1e-9
    assert got["llama3/3"][0] == "PASSED"
