"""What InfiniTrain's newer runner reads beyond each program's facts, read as it reads it
(harness.contracts.programs RUNNER): a group's `infini_run_args`, `$NAME` in a case's args (the
runner evals each command, so the shell expands them, per program), DEVICE_BACKEND, and a config
file other than test_config.json.

tests/infinitrain/data/branches/lora_ddp_loss.json and fix_muxi_device_registry_test_config_maca.json
are those branches' files byte for byte (`git show lora_ddp_loss:scripts/test_config.json` at
f408788, `git show fix_muxi_device_registry:scripts/test_config_maca.json` at ddf0a48).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cases import ConfigError, Overrides, load_config
from harness.launch import LaunchSpec
from harness.launch.infinitrain import InfiniTrainBackend
from tests.cases.config_files import write

BRANCHES = Path(__file__).resolve().parents[1] / "infinitrain" / "data" / "branches"
LORA = BRANCHES / "lora_ddp_loss.json"
MACA = BRANCHES / "fix_muxi_device_registry_test_config_maca.json"
BUILD = Overrides(build_dir="/nonexistent/build")


def _infinitrain(groups, **variables) -> dict:
    """A config of InfiniTrain's shape (its BUILD_DIR variable) with these test groups."""
    return {"variables": {"BUILD_DIR": "../build", **variables}, "test_groups": groups}


def _eight_proc(**group):
    return [{"tag": "basic", "tests": [{"id": "1", "args": {"dtype": "float32"}}]},
            {"tag": "8_proc", **group, "tests": [
                {"id": "dp", "args": {"dtype": "float32"}},
                {"id": "tp4", "args": {"dtype": "float32", "tensor_parallel": 4,
                                       "total_batch_size": 1024}},
                {"id": "threads", "args": {"dtype": "float32", "nthread_per_process": 2}}]}]


# ------------------------------------------------------------------ infini_run_args


def test_a_group_launched_through_infini_run_counts_its_processes_times_their_threads(tmp_path):
    config = load_config(write(tmp_path, _infinitrain(_eight_proc(
        infini_run_args={"nproc_per_node": 8}))), BUILD)
    cases = {(c.tag, c.case_id, c.model): c for c in config.cases}
    assert {c.launcher_processes for c in config.cases if c.tag == "basic"} == {0}
    for model in ("gpt2", "llama3"):
        assert cases[("8_proc", "dp", model)].launcher_processes == 8
        assert cases[("8_proc", "dp", model)].world_size == 8
        assert cases[("8_proc", "tp4", model)].world_size == 8
        assert cases[("8_proc", "tp4", model)].dp == 2
        # InfiniTrain's ranks: PROC_WORLD_SIZE x nthread_per_process
        assert cases[("8_proc", "threads", model)].world_size == 16
        # the reference is still one device
        assert cases[("8_proc", "tp4", model)].reference_world_size == 1
    note = next(n for n in config.notes if "infini_run_args" in n)
    assert "tag '8_proc'" in note and "6 case(s)" in note and "-- ./<program>" in note


@pytest.mark.parametrize("launch", [{}, {"nproc_per_node": None}, {"nproc_per_node": ""}])
def test_an_empty_launch_is_no_launch_as_jqs_empty(tmp_path, launch):
    config = load_config(write(tmp_path, _infinitrain(_eight_proc(infini_run_args=launch))), BUILD)
    assert {c.launcher_processes for c in config.cases} == {0}
    assert {c.world_size for c in config.cases if c.case_id == "dp"} == {1}


def test_an_infini_run_args_key_the_runner_does_not_read_is_one_line(tmp_path):
    path = write(tmp_path, _infinitrain(_eight_proc(
        infini_run_args={"nproc_per_node": 8, "nnodes": 2})))
    with pytest.raises(ConfigError) as error:
        load_config(path, BUILD)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: tag '8_proc', field infini_run_args.nnodes: ")
    assert "reads no infini_run_args key 'nnodes'; expected nproc_per_node" in message
    assert "run_models_and_profile.bash:539" in message


@pytest.mark.parametrize("count, expected", [
    (0, "is not a process count; expected a positive integer"),
    ("eight", "is not a process count; expected a positive integer"),
    (-2, "is not a process count; expected a positive integer"),
    (True, "True is not of type integer or string or null")])  # the schema's words
def test_a_process_count_that_is_not_one_is_refused(tmp_path, count, expected):
    path = write(tmp_path, _infinitrain(_eight_proc(infini_run_args={"nproc_per_node": count})))
    with pytest.raises(ConfigError, match=r"field infini_run_args\.nproc_per_node: .*"
                                          + expected):
        load_config(path, BUILD)


def test_a_world_the_models_parallelism_does_not_divide_names_processes_and_threads(tmp_path):
    groups = [{"tag": "p3", "infini_run_args": {"nproc_per_node": 3}, "tests": [
        {"id": "tp2", "args": {"tensor_parallel": 2, "nthread_per_process": 1}}]}]
    with pytest.raises(ConfigError, match=r"field infini_run_args\.nproc_per_node: 3 processes x "
                                          r"1 threads = 3 ranks is not a multiple of "
                                          r"tensor_parallel \* pipeline_parallel = 2 \* 1 = 2"):
        load_config(write(tmp_path, _infinitrain(groups)), BUILD)


def test_the_bundled_trainer_runs_the_same_world(tmp_path):
    """A group's launch is InfiniTrain's; under --harness-trainer harness its cases keep their
    world size (the ranks), and nothing else changes."""
    config = load_config(write(tmp_path, _infinitrain(_eight_proc(
        infini_run_args={"nproc_per_node": 4}))), Overrides(backend="harness"))
    assert config.trainer.backend == "harness"
    assert {(c.case_id, c.world_size, c.launcher_processes) for c in config.cases
            if c.tag == "8_proc"} == {("dp", 4, 4), ("tp4", 4, 4), ("threads", 8, 4)}


def test_infinitrain_is_launched_through_infini_run_with_the_groups_processes(tmp_path):
    build = tmp_path / "build"
    build.mkdir()
    for name in ("gpt2", "infini_run"):
        (build / name).write_text("#!/bin/sh\n")
    backend = InfiniTrainBackend(build, launch="threads", device_backend="maca")
    spec = LaunchSpec(case="c", model="gpt2", flags={"nthread_per_process": 2, "dtype": "float32"},
                      world_size=16, checkpoint=tmp_path / "m.bin", input_bin=tmp_path / "t.bin",
                      output_dir=tmp_path / "out", gradients_dir=None, log_dir=tmp_path / "logs",
                      device="cuda", port=29511, launcher_processes=8)
    backend._facts["gpt2"] = _accepting_everything()
    argv = backend.command(spec)
    assert argv[:4] == [str(build / "infini_run"), "--nproc_per_node=8",
                        "--rdzv_endpoint=127.0.0.1:29511", "--"]
    assert argv[4] == str(build / "gpt2")
    # the case's threads as it says (8 processes x 2 threads), the device word DEVICE_BACKEND's
    assert "--nthread_per_process=2" in argv and "--device=maca" in argv
    # one device, threads mode: the binary alone; a CPU run passes cpu whatever DEVICE_BACKEND
    alone = backend.command(LaunchSpec(**{**spec.__dict__, "world_size": 1, "device": "cpu",
                                          "launcher_processes": 0, "flags": {"dtype": "float32"}}))
    assert alone[0] == str(build / "gpt2") and "--device=cpu" in alone


def _accepting_everything():
    class Facts:
        def accepts(self, name):
            return name != "dump_gradients"
    return Facts()


# ------------------------------------------------------------------ $NAME, per program


def test_lora_ddp_loss_config_unchanged_each_program_gets_its_own_lora_weights():
    """lora_ddp_loss's `"lora_load_path": "$LORA_WEIGHTS_DIR"`: the runner sets
    LORA_WEIGHTS_DIR from GPT2_LORA_WEIGHTS_DIR before gpt2's command and from
    LLAMA3_LORA_WEIGHTS_DIR before llama3's, and evals each."""
    config = load_config(LORA, BUILD)
    variables = json.loads(LORA.read_text())["variables"]
    loaded = [c for c in config.cases if "lora_load_path" in c.args]
    assert {c.model for c in loaded} == {"gpt2", "llama3"} and len(loaded) == 16
    for case in loaded:
        expected = variables[f"{case.model.upper()}_LORA_WEIGHTS_DIR"]
        assert case.args["lora_load_path"] == expected, case.name
        # mathematics: the weights a run starts from stay in its reference
        assert case.reference_args()["lora_load_path"] == expected


def test_a_missing_variable_behind_a_shell_name_is_one_line_naming_it(tmp_path):
    data = json.loads(LORA.read_text())
    del data["variables"]["LLAMA3_LORA_WEIGHTS_DIR"]
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as error:
        load_config(path, BUILD)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{path}: tag 'lora', case '1_lora', "
                                                      "field args.lora_load_path: ")
    assert ("InfiniTrain's runner sets $LORA_WEIGHTS_DIR for llama3 from the variable "
            "LLAMA3_LORA_WEIGHTS_DIR") in message
    assert "--harness-var LLAMA3_LORA_WEIGHTS_DIR=VALUE" in message


def test_a_program_the_runner_sets_no_such_variable_for_is_refused_not_guessed(tmp_path):
    groups = [{"tag": "lora", "tests": [{"id": "1", "args": {"lora_load_path": "$LORA_WEIGHTS_DIR"}}]}]
    path = write(tmp_path, _infinitrain(groups, QWEN3_TEST_GROUPS="lora", GPT2_TEST_GROUPS="",
                                        LLAMA3_TEST_GROUPS="", GPT2_LORA_WEIGHTS_DIR="/w.bin"))
    with pytest.raises(ConfigError, match=r"sets \$LORA_WEIGHTS_DIR for gpt2, llama3 only .*for "
                                          r"qwen3 it holds whatever the program run before it "
                                          r"left, which the harness does not guess"):
        load_config(path, BUILD)


@pytest.mark.parametrize("text, expected", [
    ("$OUT/x", "/o/x"), ("${OUT}x", "/ox"), ("a$OUT", "a/o"), ("$BATCH", 8),
    ("no dollar", "no dollar")])
def test_config_variables_are_the_shells_as_exported(tmp_path, text, expected):
    groups = [{"tag": "basic", "tests": [{"id": "1", "args": {
        "my_path": text, "batch_size": "$BATCH" if expected == 8 else 4}}]}]
    config = load_config(write(tmp_path, _infinitrain(groups, OUT="/o", BATCH=8)), BUILD)
    for case in config.cases:
        if expected == 8:
            assert case.args["batch_size"] == 8 and case.flags["batch_size"] == 8
        else:
            assert case.args["my_path"] == expected


@pytest.mark.parametrize("text", ["$(whoami)", "${OUT:-x}", "$1", "cost$"])
def test_shell_syntax_the_harness_does_not_evaluate_is_refused(tmp_path, text):
    groups = [{"tag": "basic", "tests": [{"id": "1", "args": {"my_path": text}}]}]
    with pytest.raises(ConfigError, match=r"field args\.my_path: .*shell syntax at .* that the "
                                          r"harness does not evaluate; expected \$NAME"):
        load_config(write(tmp_path, _infinitrain(groups, OUT="/o")), BUILD)


def test_an_undefined_shell_name_is_one_line(tmp_path):
    groups = [{"tag": "basic", "tests": [{"id": "1", "args": {"my_path": "$NOPE/x"}}]}]
    with pytest.raises(ConfigError, match=r"field args\.my_path: '\$NOPE/x': \$NOPE is neither a "
                                          r"variable of the config nor one InfiniTrain's runner "
                                          r"sets for gpt2"):
        load_config(write(tmp_path, _infinitrain(groups)), BUILD)


def test_the_harnesss_own_config_expands_nothing(tmp_path):
    data = {"models": ["gpt2"], "test_groups": [{"tag": "basic", "tests": [
        {"id": "1", "args": {"my_path": "$HOME/x"}}]}]}
    config = load_config(write(tmp_path, data))
    assert config.cases[0].args["my_path"] == "$HOME/x"


# ------------------------------------------------------------------ DEVICE_BACKEND, the file


def test_the_maca_config_from_its_own_file_name_passes_its_device_word(tmp_path):
    """fix_muxi_device_registry's scripts/test_config_maca.json, unchanged, read from its own
    name (InfiniTrain's --test-config; the harness's --harness-config): DEVICE_BACKEND is the
    `--device` word on an accelerator, said once in the notes."""
    config = load_config(MACA, BUILD)
    assert config.path == MACA and MACA.name != "test_config.json"
    assert config.trainer.backend == "infinitrain"
    assert config.trainer.device_backend == "maca"
    note = next(n for n in config.notes if "DEVICE_BACKEND" in n)
    assert "--device maca on an accelerator" in note and "a CPU run passes --device cpu" in note
    assert {c.model for c in config.cases} == {"gpt2", "llama3"} and len(config.cases) == 80


def test_without_device_backend_the_word_is_cuda(tmp_path):
    config = load_config(write(tmp_path, _infinitrain(_eight_proc())), BUILD)
    assert config.trainer.device_backend == "cuda"
    assert not any("DEVICE_BACKEND" in n for n in config.notes)


def test_a_device_backend_that_is_no_word_names_the_variable(tmp_path):
    path = write(tmp_path, _infinitrain(_eight_proc(), DEVICE_BACKEND="cuda --evil"))
    with pytest.raises(ConfigError, match=r"field variables\.DEVICE_BACKEND: device backend "
                                          r"'cuda --evil': expected a device word"):
        load_config(path, BUILD)
