"""`python -m harness.logs`: the lines, report.md and the exit codes, on the fixtures (always)
and on the real InfiniTrain-Test logs under /work/shared (when they are there)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.logs import read_paths
from harness.logs.cli import FAILED, PASSED, main, pair

FIXTURES = Path(__file__).parent / "fixtures"
MEGATRON = FIXTURES / "megatron"
RUN = FIXTURES / "run" / "logs"
LRS = FIXTURES / "lr_scheduler"  # the real feat/lr_scheduler logs (fixtures/README.md)
LR_RUN = LRS / "infinitrain" / "logs" / "lr_scheduler"
REAL = Path("/work/shared/data/infinitrain-test")
REAL_RUN = REAL / "infinitrain/logs/202511_a800/20251127/e7d57db_master"


def _main(capsys, *argv):
    code = main([str(a) for a in argv])
    return code, capsys.readouterr()


def test_a_passing_case_exits_0_and_writes_the_report(tmp_path, capsys):
    report = tmp_path / "out.md"
    code, out = _main(capsys, MEGATRON, RUN / "llama3_1.log", "-o", report)
    assert code == 0, out
    # the lr too: Megatron's `learning rate: 1.000000E-05` against InfiniTrain's `lr 1.00e-05`
    assert re.search(r"^PASSED llama3/1 float32 3 steps, worst \S+ at step \d "
                     r"\(threshold relative 1e-05\); lr 3 steps within print resolution, "
                     r"worst lr \|diff\| 0\.0e\+00 at step 1$", out.out, re.M)
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


# --- the lr_scheduler recording: InfiniTrain g3025 20260708 feat/lr_scheduler against
# InfiniTrain-Test's PyTorch baseline (docs/infinitrain_baseline.md "Against a recorded baseline") ---

# case: (status, worst |loss diff|, its step, worst |lr diff|)
LR_SCHEDULER = {
    "gpt2/3_bfloat16_linear": (PASSED, 3.719e-3, 4, 1e-8),
    "gpt2/3_none_zero2": (FAILED, 9.5e-5, 10, 0.0),
    "gpt2/4_bfloat16_inverse_sqrt_tp4_distopt": (PASSED, 7.44e-3, 5, 0.0),
    "gpt2/4_constant_tp4": (FAILED, 9.5e-5, 10, 0.0),
    "gpt2/5_bfloat16_constant_tp4_sp": (PASSED, 6.3e-3, 10, 0.0),
    "gpt2/5_linear_tp4_sp_distopt": (FAILED, 4.54e-4, 8, 1e-8),
    "gpt2/6_cosine_pp8": (FAILED, 5.7e-5, 10, 0.0),
    "gpt2/7_inverse_sqrt_pp4_vpp2": (FAILED, 5.7e-5, 10, 0.0),
    "gpt2/8_bfloat16_none_all_parallel": (PASSED, 9.877e-3, 10, 0.0),
    "gpt2/8_cosine_all_parallel_distopt": (FAILED, 3.14e-4, 8, 0.0),
    "llama3/3_bfloat16_linear": (PASSED, 3.851e-3, 5, 1e-8),
    "llama3/3_none_zero2": (PASSED, 2e-6, 6, 0.0),
    "llama3/4_bfloat16_inverse_sqrt_tp4_distopt": (PASSED, 2.994e-3, 5, 0.0),
    "llama3/4_constant_tp4": (FAILED, 5e-5, 2, 0.0),
    "llama3/5_bfloat16_constant_tp4_sp": (PASSED, 1.724e-3, 4, 0.0),
    "llama3/5_linear_tp4_sp_distopt": (FAILED, 8.7e-5, 4, 1e-8),
    "llama3/6_cosine_pp8": (PASSED, 2e-6, 3, 0.0),
    "llama3/7_inverse_sqrt_pp4_vpp2": (PASSED, 2e-6, 3, 0.0),
    "llama3/8_bfloat16_none_all_parallel": (PASSED, 1.839e-3, 6, 0.0),
    "llama3/8_cosine_all_parallel_distopt": (FAILED, 5.6e-5, 4, 0.0),
}


def _lr_cases(baseline):
    """The cases by model/case (their logs sit under logs/lr_scheduler/, the tag)."""
    cases = pair(read_paths([baseline]), read_paths([LRS / "infinitrain"]))
    assert {c.tag for c in cases} == {"lr_scheduler"}
    return {c.label.removeprefix("lr_scheduler/"): c for c in cases}


def test_the_real_lr_scheduler_logs_give_the_documented_figures():
    cases = _lr_cases(LRS / "pytorch")
    got = {label: (c.status, c.verdict.max_abs_diff, c.verdict.worst_step, c.lr.max_abs_diff)
           for label, c in cases.items()}
    assert got == {label: (status, pytest.approx(loss, abs=1e-9), step, pytest.approx(lr))
                   for label, (status, loss, step, lr) in LR_SCHEDULER.items()}
    # every lr is within print resolution; the only differing texts are the linear schedules'
    # exact halves, InfiniTrain 8.87e-06 / 6.62e-06 against PyTorch 8.88e-06 / 6.63e-06
    assert all(c.lr.ok for c in cases.values())
    halves = {label: [(s, f"{r:.2e}", f"{b:.2e}") for s, r, b in
                      zip(c.lr.steps, c.lr.run_lrs, c.lr.base_lrs) if f"{r:.2e}" != f"{b:.2e}"]
              for label, c in cases.items()}
    linear = [label for label in halves if "linear" in label]
    assert {label for label, diff in halves.items() if diff} == set(linear) and len(linear) == 4
    assert all(halves[label] == [(4, "8.87e-06", "8.88e-06"), (6, "6.62e-06", "6.63e-06")]
               for label in linear)


def test_the_earlier_pytorch_log_ran_its_bfloat16_cases_in_float32():
    # result_pytorch_with_lr_scheduler.log (05e9ab0): each bfloat16 section prints the float32
    # losses of the same schedule, so every bfloat16 case fails against InfiniTrain
    runs = {r.case: r for r in read_paths([LRS / "pytorch_with"]).runs if r.model == "gpt2"}
    assert runs["3_bfloat16_linear"].losses == runs["5_linear_tp4_sp_distopt"].losses
    assert runs["5_bfloat16_constant_tp4_sp"].losses == runs["4_constant_tp4"].losses
    cases = _lr_cases(LRS / "pytorch_with")
    bf16 = {label: c.status for label, c in cases.items() if "bfloat16" in label}
    assert len(bf16) == 8 and set(bf16.values()) == {FAILED}
    assert cases["llama3/5_bfloat16_constant_tp4_sp"].verdict.max_abs_diff == \
        pytest.approx(0.258458)
    fp32 = {label: c.status for label, c in cases.items() if "bfloat16" not in label}
    assert fp32 == {label: LR_SCHEDULER[label][0] for label in fp32}


def test_a_planted_lr_drift_fails_the_case_at_its_step(tmp_path, capsys):
    # llama3/6_cosine_pp8 passes on its loss; its step 8 made to print 3.88e-06, not 3.78e-06
    log = tmp_path / "llama3_6_cosine_pp8.log"
    text = (LR_RUN / log.name).read_text()
    log.write_text(text.replace("| lr 3.78e-06 |", "| lr 3.88e-06 |"))
    baseline = LRS / "pytorch"
    code, out = _main(capsys, baseline, log, "-o", tmp_path)
    assert code == 1
    (line,) = [x for x in out.out.splitlines() if "llama3/6_cosine_pp8" in x]
    assert line.startswith("FAILED llama3/6_cosine_pp8 float32 10 steps, worst 2.0e-06 at step 3")
    assert ("; lr first diverging step 8: run 3.88e-06 == baseline 3.78e-06 ± 1.0e-08 failed "
            "(|diff| 1e-07); worst lr |diff| 1.0e-07 at step 8") in line
    report = (tmp_path / "report.md").read_text()
    assert "- llama3/6_cosine_pp8:\n  - lr first diverging step 8" in report


def test_a_log_without_an_lr_column_gets_one_line_naming_it(tmp_path, capsys):
    log = tmp_path / "llama3_6_cosine_pp8.log"
    text = (LR_RUN / log.name).read_text()
    log.write_text(re.sub(r"\| lr \S+ ", "", text))
    code, out = _main(capsys, LRS / "pytorch", log, "-o", tmp_path)
    (line,) = [x for x in out.out.splitlines() if "llama3/6_cosine_pp8" in x]
    assert line.startswith("PASSED llama3/6_cosine_pp8 float32 10 steps")  # the loss still
    assert line.endswith(f"; lr not compared: the subject {log} prints no lr; expected `lr X` "
                         f"on every step line, as {LRS / 'pytorch'}/result_pytorch_trainng_lr_"
                         f"scheduler.log [train_llama3.2_1B.py / 6_cosine_pp8] prints")
    report = (tmp_path / "report.md").read_text()
    assert "## Learning rate not compared" in report and f"the subject {log} prints no lr" in report


def test_an_lr_missing_at_one_step_is_a_bad_input_naming_the_step(tmp_path, capsys):
    log = tmp_path / "llama3_6_cosine_pp8.log"
    text = (LR_RUN / log.name).read_text()
    log.write_text(text.replace("| lr 3.78e-06 ", ""))
    code, out = _main(capsys, LRS / "pytorch", log, "-o", tmp_path)
    assert code == 1
    (line,) = [x for x in out.out.splitlines() if "llama3/6_cosine_pp8" in x]
    assert line.startswith("BAD INPUT llama3/6_cosine_pp8 float32 10 steps")
    assert (f"lr bad pairing: subject {log} against baseline " in line and
            "the run printed no lr at step 8 (the baseline printed 3.78e-06); expected a finite "
            "learning rate at every step" in line)
