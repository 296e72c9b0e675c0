"""Each InfiniTrain feature branch's own scripts/test_config.json, unchanged, run through the
`infinitrain` backend against the stand-in playing that branch (its flag sets, rank layout and
CHECKs, and tiny_mixtral): every case selected is compared, or skipped with the reason.

A session per branch runs what the branch adds (its new tag, or its new cases by node id: a
node id never depends on the folder's name, as `-k` would), from a cold cache under -n 2; the
rest of each config is master's, run by tests/infinitrain/test_infinitrain_config.py, and how
each file is read (programs per tag, roles, notes) is tests/cases/test_branch_configs.py.
The files are the branches' own, byte for byte (tests/infinitrain/data/branches/).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.infinitrain_standin.build import make_build_dir
from tests.infinitrain_standin.model_files import micro_model_vars, mixtral_model_vars

BRANCHES = Path(__file__).parent / "data" / "branches"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_vars(tmp_path_factory):
    root = tmp_path_factory.mktemp("branch-models")
    return micro_model_vars(root) + mixtral_model_vars(root)


def run_branch(tmp_path: Path, flavour: str, config: Path, model_vars: list[str], *select: str,
               env: dict | None = None, more: tuple = (),
               models: tuple | None = None) -> tuple[str, list[dict]]:
    # tiny_mixtral compiled with its checkpoint's own config: mixtral_model_vars' small file
    build = make_build_dir(tmp_path / "build", flavour=flavour, mixtral_config="file",
                           **({"models": models} if models else {}))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "pytest", "-c", str(tmp_path / "pytest.ini"), "--rootdir",
            str(tmp_path), "-p", "no:cacheprovider", "-q", f"--harness-config={config}",
            f"--infinitrain-build={build}", "--gpus", "16", "-n", "2",
            f"--harness-output={out}", *model_vars, *more, *select]
    result = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=1200,
                            env={**os.environ, **(env or {})})
    results = sorted(out.glob("sessions/*/results.jsonl"))
    records = [json.loads(line) for line in results[-1].read_text().splitlines()] \
        if results else []
    return result.stdout + result.stderr, records


def _node_ids(config: Path, tag: str, ids: tuple[str, ...], models=("gpt2", "llama3")):
    return [f"{config}::{tag}/{model}/{case}" for model in models for case in ids]


def _failures(records):
    return "\n\n".join(r["errors"][0] for r in records if r["errors"])[:6000]


def test_feat_context_parallel_runs_its_cp_cases_with_the_branchs_rank_layout(tmp_path, model_vars):
    config = BRANCHES / "feat_context_parallel.json"
    select = (_node_ids(config, "basic", ("9", "9_bfloat16", "10", "10_bfloat16"))
              + _node_ids(config, "zero", ("9_distopt", "9_zero2", "9_bfloat16_distopt",
                                           "9_bfloat16_zero2")))
    output, records = run_branch(tmp_path, "context_parallel", config, model_vars, *select)
    assert len(records) == 16, output[-3000:]
    assert Counter(r["status"] for r in records) == {"passed": 16}, _failures(records)
    nine = next(r for r in records if r["name"] == "basic/gpt2/9")
    assert nine["world_size"] == 4 and nine["parallel"]["dp"] == 2 and nine["parallel"]["cp"] == 2
    assert "--context_parallel=2" in nine["command"] and "--nthread_per_process=4" in nine["command"]
    # the reference is one device without CP: the branch's binary would abort it otherwise
    # (global.cc:126: world % (TP * CP * PP) == 0)
    reference = nine["reference"]["command"]
    assert not any(a.startswith(("--context_parallel", "--cp_comm_type")) for a in reference)
    ten = next(r for r in records if r["name"] == "basic/llama3/10")
    assert (ten["world_size"], ten["parallel"]["dp"], ten["parallel"]["cp"]) == (8, 1, 2)


def test_feat_activation_checkpointing_compares_recompute_with_the_run_without(tmp_path, model_vars):
    config = BRANCHES / "feat_activation_checkpointing.json"
    output, records = run_branch(tmp_path, "activation_checkpointing", config, model_vars,
                                 "-m", "recompute")
    assert len(records) == 28, output[-3000:]
    statuses = Counter(r["status"] for r in records)
    # The branch's config passes --use_distributed_optimizer, which its binaries do not define
    # (InfiniTrain's own runner fails those cases): the harness skips them, naming the flag.
    distopt = [r for r in records if r["flags"].get("use_distributed_optimizer")]
    assert len(distopt) == 8 and all(
        r["status"] == "skipped" and "does not accept --use_distributed_optimizer" in r["reason"]
        for r in distopt)
    assert statuses == {"passed": 20, "skipped": 8}, _failures(records)
    for record in records:
        if record["status"] == "passed":
            assert "--activation_recompute=true" in record["command"]
            assert not any("recompute" in a for a in record["reference"]["command"])


def test_a_recompute_bug_is_caught_because_the_reference_runs_without_recompute(tmp_path, model_vars):
    """Planted: with --activation_recompute every update is twice what it should be (one device too). A
    reference that kept the recompute flags would carry the same bug and pass."""
    config = BRANCHES / "feat_activation_checkpointing.json"
    select = _node_ids(config, "recompute", ("2_recompute_uniform2", "7_recompute_uniform2"),
                       models=("gpt2",))
    output, records = run_branch(tmp_path, "activation_checkpointing", config, model_vars,
                                 *select, env={"STANDIN_PLANT_RECOMPUTE": "1.0"})
    assert {r["name"]: r["status"] for r in records} == {
        "recompute/gpt2/2_recompute_uniform2": "failed",
        "recompute/gpt2/7_recompute_uniform2": "failed"}, output[-3000:]


def test_feat_lr_scheduler_runs_its_schedules(tmp_path, model_vars):
    config = BRANCHES / "feat_lr_scheduler.json"
    # GPT-2's ten cases: LLaMA 3's live baselines took 5 of this test's 6.7 minutes in CI, and
    # its schedules are the same code (the real llama3 lr cases: docs/benchmarks.md#baseline-branches)
    output, records = run_branch(tmp_path, "lr_scheduler", config, model_vars, "-m",
                                 "lr_scheduler", "--harness-cases", "lr_scheduler/gpt2/*",
                                 more=("--harness-baseline", "pytorch",
                                                       # traces: tests/infinitrain_standin/
                                                       # test_trace_baseline_standin.py
                                                       "--harness-trace", "none"))
    assert len(records) == 10 and {r["model"] for r in records} == {"gpt2"}, output[-3000:]
    distopt = [r for r in records if r["flags"].get("use_distributed_optimizer")]
    assert len(distopt) == 4 and all(r["status"] == "skipped" for r in distopt)
    ran = [r for r in records if r["status"] != "skipped"]
    assert len(ran) == 6 and all(r["self_check"] == "passed" for r in ran), _failures(records)
    # the reference keeps the schedule: its printed lr follows it step by step
    linear = next(r for r in records if r["name"] == "lr_scheduler/gpt2/3_bfloat16_linear")
    assert "--lr_decay_style=linear" in linear["reference"]["command"]
    # the baseline runs the same schedule: every step's printed lr within print resolution,
    # warmup from 0.00e+00 included (the stand-in's gpt2 is a toy model, so its losses are
    # not GPT-2's and the baseline's loss verdict is red; tests/infinitrain/
    # test_baseline_plants.py plants a schedule bug against a control)
    for record in ran:
        lr = record["baseline"]["lr"]
        assert lr is not None and lr["ok"], (record["name"], record["baseline"])
        assert len(lr["steps"]) == 10
        assert record["baseline"]["run"]["flags"].get("lr_decay_style") == \
            record["flags"].get("lr_decay_style", "constant")
    assert "builds (build_1, build_2): recorded, not run" in output
    # the branch's binaries save ./checkpoints/checkpoint_final after every run: the scratch
    # working folder goes, so no reference in the cache keeps one
    assert not list((tmp_path / "out").rglob("checkpoint_final")), "left in the run folders"


def test_feat_support_moe_runs_tiny_mixtral_on_the_moe_tag(tmp_path, model_vars):
    config = BRANCHES / "feat_support_moe.json"
    output, records = run_branch(tmp_path, "support_moe", config, model_vars, "-m", "moe",
                                 more=("--harness-baseline", "pytorch"))
    assert {r["name"] for r in records} == {f"moe/tiny_mixtral/{i}" for i in
                                            ("1", "1_bfloat16", "2", "2_bfloat16")}, output[-3000:]
    assert Counter(r["status"] for r in records) == {"passed": 4}, _failures(records)
    two = next(r for r in records if r["case_id"] == "2")
    assert two["command"][0].endswith("/tiny_mixtral")
    assert "--global_batch_size=80" in two["command"] and len(two["losses"]) == 10
    # the stand-in computes the real tiny Mixtral: the bundled trainer's mixtral family matches it
    assert all(r["baseline"]["status"] == "passed" and r["baseline"]["run"]["model"] == "mixtral"
               for r in records), [r["baseline"] for r in records]
    assert "  moe / tiny_mixtral: 4 passed" in output
    # the nightly's second session, into the same output folder: the same verdicts, from the
    # warm reference cache
    again_output, again = run_branch(tmp_path, "support_moe", config, model_vars, "-m", "moe",
                                     more=("--harness-baseline", "pytorch"))
    assert {r["name"]: r["status"] for r in again} == {r["name"]: r["status"] for r in records}, \
        again_output[-3000:]
    assert all(r["reference"]["built"] is False for r in again)


def test_feat_add_qwen3_runs_its_zero_cases_without_zero_stage(tmp_path, model_vars):
    config = BRANCHES / "feat_add_Qwen3-8B.json"
    output, records = run_branch(tmp_path, "qwen3", config, model_vars, "-m", "zero")
    assert len(records) == 16, output[-3000:]
    assert Counter(r["status"] for r in records) == {"passed": 16}, _failures(records)
    assert all("--use_distributed_optimizer=true" in r["command"] for r in records)


def test_a_program_whose_binary_the_build_lacks_is_one_error_line_per_case(tmp_path, model_vars):
    config = BRANCHES / "feat_support_moe.json"
    output, records = run_branch(tmp_path, "support_moe", config, model_vars, "-m", "moe",
                                 models=("gpt2", "llama3"))
    assert len(records) == 4 and all(r["status"] == "error" for r in records), output[-3000:]
    build = tmp_path / "build"
    for record in records:
        assert record["errors"][0] == (
            f"{record['name']}: InfiniTrainError: {build.resolve()}: no `tiny_mixtral` binary in "
            f"InfiniTrain's build folder (build it, or leave tiny_mixtral out: variable "
            f"MIXTRAL_TEST_GROUPS names its tags, a config's `models` its models)")


def test_qwen3_runs_the_tags_its_groups_variable_names_with_a_pytorch_baseline(tmp_path, model_vars):
    """feat/add_Qwen3-8B's config, unchanged, with QWEN3_TEST_GROUPS=basic (the newer runner's
    variable; empty by default): its one-device qwen3 cases run the stand-in's qwen3 (Hugging
    Face's Qwen3 trained as example/qwen3/main.cc trains it) on the harness's synthetic
    `infinitrain` qwen3 file, pass their self-check, and the bundled Qwen3 baseline beside
    them passes too; a warm second session decides the same from the cache."""
    config = BRANCHES / "feat_add_Qwen3-8B.json"
    # case 1 alone: each stand-in run imports transformers (about 10 s); case 2 is the same
    # program at 5,120 tokens a step, run on the real build (docs/infinitrain.md#qwen3-real-build)
    select = ("--harness-var", "QWEN3_TEST_GROUPS=basic", "--harness-cases", "basic/qwen3/1")
    output, records = run_branch(tmp_path, "qwen3", config, model_vars, *select,
                                 more=("--harness-baseline", "pytorch"))
    assert {r["name"] for r in records} == {"basic/qwen3/1"}, output[-3000:]
    assert Counter(r["status"] for r in records) == {"passed": 1}, _failures(records)
    for record in records:
        assert record["command"][0].endswith("/qwen3") and record["self_check"] == "passed"
        assert record["baseline"]["status"] == "passed", record["baseline"]
        assert record["baseline"]["run"]["model"] == "qwen3"
        # qwen3's Adam (0.9, 0.95): the semantics hand the baseline its beta2
        assert record["baseline"]["run"]["flags"]["adam_beta2"] == 0.95
    assert len(records[0]["losses"]) == 10
    again_output, again = run_branch(tmp_path, "qwen3", config, model_vars, *select,
                                     more=("--harness-baseline", "pytorch"))
    assert {r["name"]: r["status"] for r in again} == {r["name"]: r["status"] for r in records}, \
        again_output[-3000:]
    assert all(r["reference"]["built"] is False for r in again)


def test_the_renamed_mixtral_runs_the_moe_tag_and_its_newer_step_line_is_read(tmp_path, model_vars):
    """A build of the later commit that renamed tiny_mixtral holds `mixtral`: the moe tag runs it
    (the build decides, harness.contracts.programs built_programs), its stdout step line with
    `| peak used: ... MB | peak reserved: ... MB` is read, and the mixtral baseline passes."""
    config = BRANCHES / "feat_support_moe.json"
    output, records = run_branch(tmp_path, "support_moe", config, model_vars, "-m", "moe",
                                 "--harness-cases", "moe/mixtral/1,moe/mixtral/2",
                                 more=("--harness-baseline", "pytorch"),
                                 models=("gpt2", "llama3", "mixtral"))
    assert {r["name"] for r in records} == {"moe/mixtral/1", "moe/mixtral/2"}, output[-3000:]
    assert Counter(r["status"] for r in records) == {"passed": 2}, _failures(records)
    for record in records:
        assert record["command"][0].endswith("/mixtral")
        assert record["baseline"]["status"] == "passed", record["baseline"]
    assert len(next(r for r in records if r["case_id"] == "2")["losses"]) == 10
    # what the binary printed: the newer step line, read above into the ten losses
    printed = [p.read_text() for p in (tmp_path / "out").rglob("cases/moe/mixtral/2/logs/launcher.stdout")]
    assert printed and "| peak used:     0 MB | peak reserved:     0 MB)" in printed[0], printed


def _group_launch_config(tmp_path: Path, processes: int) -> Path:
    """master's config, its test groups replaced by one of its own launch (the newer runner's
    infini_run_args): data parallel over the processes, and TP 2 over 2 threads in each."""
    data = json.loads((Path(__file__).parent / "data" / "infinitrain_test_config.json").read_text())
    common = {"dtype": "float32", "num_iteration": 10, "batch_size": 40, "total_batch_size": 5120}
    data["test_groups"] = [{"tag": f"{processes}_proc", "infini_run_args": {"nproc_per_node": processes},
                            "tests": [{"id": "dp", "args": common},
                                      {"id": "tp2", "args": {**common, "nthread_per_process": 2,
                                                             "tensor_parallel": 2}}]}]
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "test_config_group_launch.json"
    path.write_text(json.dumps(data))
    return path


def test_a_group_with_infini_run_args_runs_through_infini_run_and_a_planted_rank_bug_fails(
        tmp_path, model_vars):
    """A group of the newer runner's shape, `"infini_run_args": {"nproc_per_node": 2}`: each case
    runs through the build's infini_run with 2 processes (each with the case's threads: 2 x 2 make
    4 ranks, TP 2 x DP 2), `--` kept before the program, and is compared with its one-device
    reference; the same cases with a gradient bug planted in multi-rank runs fail."""
    config = _group_launch_config(tmp_path, 2)
    select = ("--harness-cases", "2_proc/gpt2/*")
    # pr209's build: master's gpt2 refuses TP on a micro vocabulary (its padded-vocab CHECK)
    output, records = run_branch(tmp_path / "clean", "pr209", config, model_vars, *select)
    assert {r["name"]: r["status"] for r in records} == {
        "2_proc/gpt2/dp": "passed", "2_proc/gpt2/tp2": "passed"}, _failures(records) or output[-3000:]
    for record in records:
        command = record["command"]
        assert command[0].endswith("/infini_run") and command[1] == "--nproc_per_node=2"
        assert command[3] == "--" and command[4].endswith("/gpt2")
        assert not record["reference"]["command"][0].endswith("/infini_run")
    tp2 = next(r for r in records if r["case_id"] == "tp2")
    assert tp2["world_size"] == 4 and "--nthread_per_process=2" in tp2["command"]
    assert "tag '2_proc': infini_run_args" in output
    _, planted = run_branch(tmp_path / "planted", "pr209", config, model_vars, *select,
                            env={"STANDIN_PLANT": "transformer.h.5.mlp.c_fc.weight:1e-3"})
    assert {r["name"]: r["status"] for r in planted} == {
        "2_proc/gpt2/dp": "failed", "2_proc/gpt2/tp2": "failed"}, _failures(planted)
