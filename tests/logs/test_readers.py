"""harness/logs/readers.py: every reader on fixture lines copied from the real logs
(tests/logs/fixtures/README.md), and every bad input as one line naming the file."""

import json
import math
from pathlib import Path

import pytest

from harness.results import new_record
from harness.logs.readers import (
    MEGATRON_NOTE,
    kind_of,
    read_megatron,
    read_megatron_steps,
    read_paths,
    read_pytorch,
    read_session,
    split_id,
)

FIXTURES = Path(__file__).parent / "fixtures"
LRS = FIXTURES / "lr_scheduler"  # the real feat/lr_scheduler logs (fixtures/README.md)
GLOG = ("E20251127 07:51:43.145181 140071820840960 main.cc:325] step    {step}/10 | train loss "
        "{loss} | lr 1.00e-04 | (73.62 ms | 3477 tok/s, DP=1, TP=1, SP=0, PP=1)\n")
MEGATRON = (" [2026-09-24 01:27:06.472020] iteration        {step}/      10 | consumed samples:  "
            "          4 | learning rate: 1.000000E-05 | lm loss: {loss} | loss scale: 1.0 |\n")


def test_pytorch_id_sections():
    runs = read_pytorch(FIXTURES / "pytorch_ids" / "result_pytorch.log")
    assert not runs.bad
    gpt2, llama3 = runs.runs
    assert (gpt2.kind, gpt2.model, gpt2.case, gpt2.dtype) == ("pytorch", "gpt2", "1", "float32")
    assert gpt2.steps == (1, 2, 3) and gpt2.losses == (5.356192, 5.060585, 4.860328)
    assert gpt2.source.endswith("result_pytorch.log [gpt2_1 (fp32)]")
    assert (llama3.model, llama3.case) == ("llama3", "1")


@pytest.mark.parametrize("section, model, case, dtype", [
    ("gpt2_1 (fp32)", "gpt2", "1", "float32"),
    ("gpt2_1_bfloat16", "gpt2", "1_bfloat16", "bfloat16"),
    ("gpt2_3 (fp32, 8 GPUs)", "gpt2", "3", "float32"),
    ("llama3_3_bfloat16 (8 GPUs)", "llama3", "3_bfloat16", "bfloat16"),
])
def test_pytorch_section_names(tmp_path, section, model, case, dtype):
    log = tmp_path / "result_pytorch.log"
    log.write_text(f"Running: {section}\nstep    1/10 | train loss 5.356192 | norm -1.0000\n")
    (run,) = read_pytorch(log).runs
    assert (run.model, run.case, run.dtype) == (model, case, dtype)


def test_pytorch_descriptive_sections_keep_no_case():
    runs = read_pytorch(FIXTURES / "pytorch_descriptive" / "result_pytorch.log").runs
    assert [(r.model, r.case, r.section) for r in runs] == [
        ("gpt2", None, "GPT-2 (Single GPU, default batch, fp32)"),
        ("llama3", None, "LLaMA3_2 (Single GPU, default batch, fp32)")]


def test_megatron_step_2_is_corrected():
    # planted bug: fails if the step-2 correction is removed (4.493197 is the mean of 1-2)
    (run,) = read_megatron(FIXTURES / "megatron" / "result_megatron_training_llama3.log").runs
    assert (run.kind, run.model, run.case, run.dtype) == ("megatron", "llama3", "1", "float32")
    assert run.losses[0] == 4.899450 and run.losses[2] == 3.874061
    assert run.losses[1] == pytest.approx(2 * 4.493197 - 4.899450)
    assert run.note == MEGATRON_NOTE


def test_megatron_without_iteration_1_is_a_bad_input(tmp_path):
    log = tmp_path / "result_megatron_training_llama3.log"
    log.write_text("Running: llama3_1 (float32)\n" + MEGATRON.format(step=2, loss="4.493197E+00")
                   + MEGATRON.format(step=3, loss="3.874061E+00"))
    reading = read_megatron(log)
    assert not reading.runs
    (bad,) = reading.bad
    assert str(log) in bad.message and "no iteration 1" in bad.message
    assert (bad.model, bad.case) == ("llama3", "1")


def test_infinitrain_flat_folder_with_glog_prefixes():
    reading = read_paths([FIXTURES / "run"])
    assert not reading.bad
    gpt2, llama3 = sorted(reading.runs, key=lambda r: r.model)
    assert (gpt2.kind, gpt2.model, gpt2.case, gpt2.tag) == ("infinitrain", "gpt2", "1", None)
    assert gpt2.losses == (5.356189, 5.060790, 4.860480)
    assert llama3.losses == (4.899448, 4.086943, 3.874064)


def test_infinitrain_tagged_folder_with_metadata():
    (run,) = read_paths([FIXTURES / "tagged"]).runs
    assert (run.model, run.case, run.tag) == ("gpt2", "1", "basic")
    assert run.meta["git_commit"] == "e7d57db" and run.meta["git_branch"] == "master"
    assert run.meta["run_started_at"] == "2025-11-27 07:50:00"
    assert run.meta["config_file"] == "scripts/test_config.json"


def test_infinitrain_case_and_dtype_from_the_file_name(tmp_path):
    log = tmp_path / "logs" / "gpt2_1_bfloat16.log"
    log.parent.mkdir()
    log.write_text(GLOG.format(step=1, loss="5.336104"))
    (run,) = read_paths([tmp_path]).runs
    assert (run.model, run.case, run.dtype) == ("gpt2", "1_bfloat16", "bfloat16")


def _session(tmp_path, **fields):
    record = new_record(**{"name": "basic/gpt2/1", "model": "gpt2", "case_id": "1",
                           "tag": "basic", "losses": [5.356189, 5.06079], "steps": [1, 2],
                           "flags": {"dtype": "float32"}, "status": "passed", **fields})
    (tmp_path / "results.jsonl").write_text(json.dumps(record) + "\n")
    return tmp_path / "results.jsonl"


def test_harness_session_folder(tmp_path):
    (run,) = read_session(_session(tmp_path)).runs
    assert (run.kind, run.model, run.case, run.tag, run.dtype) == (
        "harness", "gpt2", "1", "basic", "float32")
    assert run.steps == (1, 2) and run.losses == (5.356189, 5.06079)
    assert "basic/gpt2/1" in run.source


def test_harness_session_without_losses_is_a_bad_input(tmp_path):
    reading = read_session(_session(tmp_path, losses=None, steps=None, status="error"))
    (bad,) = reading.bad
    assert "results.jsonl [basic/gpt2/1]: no losses" in bad.message


def test_harness_session_unreadable_is_a_bad_input(tmp_path):
    (tmp_path / "results.jsonl").write_text("{not json\n")
    (bad,) = read_paths([tmp_path]).bad
    assert "results.jsonl" in bad.message and "expected" in bad.message


@pytest.mark.parametrize("lines, expected", [
    ("[COMMAND] ./gpt2 --dtype float32\n", "no `step N/M | train loss X` lines"),
    (GLOG.format(step=1, loss="5.3") + GLOG.format(step=1, loss="5.3"), "step 1 appears twice"),
])
def test_infinitrain_bad_logs(tmp_path, lines, expected):
    log = tmp_path / "gpt2_1.log"
    log.write_text(lines)
    reading = read_paths([tmp_path])
    assert not reading.runs
    (bad,) = reading.bad
    assert bad.message.startswith(str(log)) and expected in bad.message
    assert (bad.model, bad.case) == ("gpt2", "1")


def test_a_nan_loss_is_read_as_nan(tmp_path):
    (tmp_path / "gpt2_1.log").write_text(GLOG.format(step=1, loss="nan"))
    (run,) = read_paths([tmp_path]).runs
    assert run.losses[0] != run.losses[0]


def test_kinds_and_a_missing_path(tmp_path):
    assert kind_of(Path("result_pytorch_with_lora.log")) == "pytorch"
    assert kind_of(Path("result_megatron_training_gpt2.log")) == "megatron"
    assert kind_of(Path("llama3_1_bfloat16.log")) == "infinitrain"
    assert kind_of(Path("run_metadata.log")) is None
    assert kind_of(Path("results.jsonl")) == "harness"
    with pytest.raises(FileNotFoundError, match="nowhere"):
        read_paths([tmp_path / "nowhere"])
    (tmp_path / "notes.txt").write_text("step    1/10 | train loss 5.0\n")
    with pytest.raises(FileNotFoundError, match="no recorded run"):
        read_paths([tmp_path])


def test_a_file_name_pairing_renames_an_infinitrain_log(tmp_path):
    from harness.logs.pairing import resolve

    (tmp_path / "gpt2_default.log").write_text(GLOG.format(step=1, loss="5.356189"))
    (run,) = read_paths([tmp_path]).runs
    assert (run.model, run.case) == ("gpt2", "default")
    paired = resolve(run, {"gpt2_default.log": ("gpt2", "1")})
    assert (paired.model, paired.case, paired.meta["paired_by"]) == ("gpt2", "1", "--pairing")


# --- the lr column, the script-style sections, Megatron's step-line logs --------------------

def test_pytorch_script_sections_with_their_lr_column():
    reading = read_pytorch(LRS / "pytorch" / "result_pytorch_trainng_lr_scheduler.log")
    assert not reading.bad and len(reading.runs) == 20
    runs = {(r.model, r.case): r for r in reading.runs}
    assert {m for m, _ in runs} == {"gpt2", "llama3"}
    zero2 = runs["gpt2", "3_none_zero2"]
    assert (zero2.kind, zero2.dtype, zero2.tag, zero2.note) == ("pytorch", "float32", None, None)
    assert zero2.source.endswith("[train_gpt2.py / 3_none_zero2]")
    assert zero2.lrs == (1e-5,) * 10 and zero2.lr_resolutions == (pytest.approx(1e-7),) * 10
    linear = runs["llama3", "5_linear_tp4_sp_distopt"]  # train_llama3.2_1B.py
    assert linear.lrs[:4] == (0.0, 5e-6, 1e-5, 8.88e-6) and linear.lrs[-1] == 2.13e-6
    assert linear.lr_resolutions[:2] == (0.0, pytest.approx(1e-8))  # 0.00e+00 is exact
    assert runs["gpt2", "3_bfloat16_linear"].dtype == "bfloat16"
    assert runs["gpt2", "3_bfloat16_linear"].losses[0] == 5.212680


def test_an_unknown_training_script_is_a_bad_input(tmp_path):
    log = tmp_path / "result_pytorch_x.log"
    log.write_text("Running: train_qwen3.py / 3_none_zero2\n"
                   "step    1/10 | train loss 5.2 | norm -1.0000 | lr 1.00e-05 | (1 ms)\n")
    reading = read_pytorch(log)
    (bad,) = reading.bad
    assert not reading.runs and bad.case == "3_none_zero2"
    assert bad.message == (f"{log} [train_qwen3.py / 3_none_zero2]: script 'train_qwen3.py'; "
                           "expected one of train_gpt2.py, train_llama3.2_1B.py (InfiniTrain's "
                           "gpt2, llama3)")


def test_infinitrain_lr_scheduler_logs_read_their_lr():
    (run,) = read_paths([LRS / "infinitrain" / "logs" / "lr_scheduler" /
                         "gpt2_5_linear_tp4_sp_distopt.log"]).runs
    assert (run.model, run.case, run.dtype, run.tag) == (
        "gpt2", "5_linear_tp4_sp_distopt", "float32", "lr_scheduler")
    # logs/<tag>/ is the tag without a run_metadata.log too: InfiniTrain-Test's nights of
    # 2026-06-18 to 07-03 on g3025 keep logs/basic/ with no metadata file
    assert run.lrs == (0.0, 5e-6, 1e-5, 8.87e-6, 7.75e-6, 6.62e-6, 5.5e-6, 4.38e-6, 3.25e-6,
                       2.13e-6)
    assert run.lr_resolutions[0] == 0.0 and run.lr_resolutions[3] == pytest.approx(1e-8)


def test_megatron_iterations_read_their_learning_rate():
    (run,) = read_megatron(FIXTURES / "megatron" / "result_megatron_training_llama3.log").runs
    assert run.lrs == (1e-5,) * 3  # `learning rate: 1.000000E-05`
    assert run.lr_resolutions == (pytest.approx(1e-11),) * 3


def test_megatron_step_line_log_of_tiny_mixtral():
    log = LRS / "megatron" / "result_megatron_tiny_mixtral.log"
    assert kind_of(log) == "megatron_steps"
    reading = read_megatron_steps(log)
    assert not reading.bad
    assert [(r.kind, r.model, r.case, r.dtype) for r in reading.runs] == [
        ("megatron", "tiny_mixtral", "1", "float32"),
        ("megatron", "tiny_mixtral", "1_bfloat16", "bfloat16"),
        ("megatron", "tiny_mixtral", "2", "float32"),
        ("megatron", "tiny_mixtral", "2_bfloat16", "bfloat16")]
    first = reading.runs[0]
    # one loss a step: no running-mean correction, no note
    assert first.losses[:2] == (11.946559, 11.686954) and first.note is None
    assert first.lrs == (1e-4,) * 10


def test_program_names_with_an_underscore_split_as_one_model():
    assert split_id("tiny_mixtral_1_bfloat16") == ("tiny_mixtral", "1_bfloat16")
    assert split_id("gpt2_3_none_zero2") == ("gpt2", "3_none_zero2")
    assert split_id("mystery_7") == ("mystery", "7")  # not a program: the first word
    assert split_id("gpt2") is None


@pytest.mark.parametrize("lines, lrs", [
    (GLOG.format(step=1, loss="5.3"), (1e-4,)),
    ("step    1/10 | train loss 5.3 | (1 ms)\nstep    2/10 | train loss 5.2 | (1 ms)\n", ()),
])
def test_a_log_without_an_lr_has_no_lr_column(tmp_path, lines, lrs):
    (tmp_path / "gpt2_1.log").write_text(lines)
    (run,) = read_paths([tmp_path]).runs
    assert run.lrs == lrs and len(run.lr_resolutions) == len(lrs)


def test_a_step_line_without_its_lr_reads_nan_there(tmp_path):
    (tmp_path / "gpt2_1.log").write_text(GLOG.format(step=1, loss="5.3")
                                         + "step    2/10 | train loss 5.2 | (1 ms)\n")
    (run,) = read_paths([tmp_path]).runs
    assert run.lrs[0] == 1e-4 and math.isnan(run.lrs[1]) and run.lr_resolutions[1] is None
