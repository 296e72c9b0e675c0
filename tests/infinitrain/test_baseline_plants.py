"""Planted bugs that every configuration shares, each passed by the self-check and caught by the
PyTorch baseline check (`--harness-baseline pytorch`), through sessions on the InfiniTrain
stand-in (tests/infinitrain_standin), beside a control session without the plant:

- the lr schedule (feat/lr_scheduler's gpt2, STANDIN_PLANT_LR): `warmup_short` ends the warmup
  one step early, `cosine_floor` decays the cosine to 2 x min_lr. The case's DP 2 run and its
  single-device reference share the schedule, so the self-check passes; the baseline's lr per
  step (harness.compare.baseline.judge_lr, the record's `baseline.lr`) names the first step the
  printed lr leaves the schedule's: step W for the short warmup, the decay's last steps for the
  floor. The stand-in's gpt2 is a toy model (tests/infinitrain_standin/model.py), so its losses
  never match GPT-2's: the control shows that the lr comparison alone passes without the plant.
- the MoE router (feat/support_moe's tiny_mixtral, STANDIN_PLANT_ROUTER=other_order): the
  softmax over every expert then the top k, where the source takes the top k of the logits then
  their softmax. The stand-in computes the real tiny Mixtral from the checkpoint, so without the
  plant the whole baseline passes (the bundled trainer's `mixtral` family on the same file);
  with it the losses diverge.

Each session is one small case (6 steps, a few thousand tokens), from a cold cache in its own
output folder: a shared reference cache would hand a planted session the clean reference.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.infinitrain_standin import lr_schedule
from tests.infinitrain_standin.build import make_build_dir
from tests.infinitrain_standin.model_files import micro_model_vars

# a cosine after a 2-step warmup from 0, decayed over steps 3-4 (lr_decay_iters 4 of 6 steps),
# then min_lr; DP 2 (two threads), so the self-check compares two topologies
WARMUP, DECAY, STEPS, MAX_LR, MIN_LR = 2, 4, 6, 1e-4, 1e-5
LR_CASE = {"dtype": "float32", "nthread_per_process": 2, "num_iteration": STEPS, "batch_size": 2,
           "sequence_length": 16, "total_batch_size": 64, "learning_rate": MAX_LR, "min_lr": MIN_LR,
           "lr_decay_style": "cosine", "lr_warmup_iters": WARMUP, "lr_warmup_init": 0.0,
           "lr_decay_iters": DECAY}
# tiny_mixtral at Adam lr 1e-3, 2 micro batches of 4 sequences of 32 tokens a step
MOE_CASE = {"dtype": "float32", "num_iteration": STEPS, "global_batch_size": 8,
            "micro_batch_size": 4, "sequence_length": 32, "learning_rate": 1e-3}


def _config(tmp_path: Path, name: str, variables: dict, tag: str, case: dict) -> Path:
    """A config of InfiniTrain's shape with one tag of one case (id `1`)."""
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"variables": {"BUILD_DIR": "../build", **variables},
                                "test_groups": [{"tag": tag, "tests": [{"id": "1", "args": case}]}]}))
    return path


def _session(tmp_path: Path, build: Path, config: Path, var_args: list[str], node: str,
             env: dict) -> dict:
    """One inner session with the live PyTorch baseline; the case's record."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "pytest", "-c", str(tmp_path / "pytest.ini"), "--rootdir",
            str(tmp_path), "-p", "no:cacheprovider", "-q", f"--harness-config={config}",
            f"--infinitrain-build={build}", "--gpus", "2", f"--harness-output={out}",
            "--harness-baseline", "pytorch", *var_args, f"{config}::{node}"]
    result = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                            env={**os.environ, **env})
    results = sorted(out.glob("sessions/*/results.jsonl"))
    records = [json.loads(line) for line in results[-1].read_text().splitlines()] if results else []
    assert [r["name"] for r in records] == [node], (result.stdout + result.stderr)[-3000:]
    return records[0]


def _printed(plant: str | None) -> list[str]:
    """The lr the stand-in prints at each step (`{:.2e}`), with the plant or without."""
    return [f"{float(x):.2e}" for x in lr_schedule.schedule(
        "cosine", MAX_LR, MIN_LR, WARMUP, 0.0, DECAY, STEPS, plant=plant)]


@pytest.fixture(scope="module")
def gpt2_vars(tmp_path_factory) -> list[str]:
    return micro_model_vars(tmp_path_factory.mktemp("gpt2-files"))


@pytest.mark.parametrize("plant", [None, "warmup_short", "cosine_floor"])
def test_an_lr_schedule_bug_is_caught_by_the_baselines_lr_and_passed_by_the_self_check(
        plant, tmp_path, gpt2_vars):
    config = _config(tmp_path, "lr", {}, "lr", LR_CASE)
    build = make_build_dir(tmp_path / "build", flavour="lr_scheduler", models=("gpt2",))
    record = _session(tmp_path, build, config, gpt2_vars, "lr/gpt2/1",
                      {"STANDIN_PLANT_LR": plant or ""})
    assert record["self_check"] == "passed", record["reason"]
    baseline = record["baseline"]
    assert baseline["source"] == "pytorch (live)" and baseline["lr"] is not None, baseline
    lr = baseline["lr"]
    # the baseline's schedule is the branch's: what the stand-in prints without a plant
    assert [f"{x:.2e}" for x in lr["base_lrs"]] == _printed(None), lr
    assert [f"{x:.2e}" for x in lr["run_lrs"]] == _printed(plant), lr
    if plant is None:
        assert lr["ok"] is True and lr["first_diverging_step"] is None, lr
        assert "lr:" not in (baseline["reason"] or "")
        return
    # the first step whose printed lr differs
    first = next(i for i, (a, b) in enumerate(zip(_printed(None), _printed(plant)), 1) if a != b)
    if plant == "warmup_short":
        # step W prints max_lr one step early (the branch's prints (W - 1) / W of it)
        assert first == WARMUP and _printed(plant)[WARMUP - 1] == f"{MAX_LR:.2e}"
    else:
        # the decay's last step and every step after it stay at 2 x min_lr
        assert first == DECAY and _printed(plant)[DECAY:] == [f"{2 * MIN_LR:.2e}"] * (STEPS - DECAY)
        assert lr["worst_step"] > DECAY
    assert baseline["status"] == "failed" and lr["ok"] is False, baseline
    assert lr["first_diverging_step"] == first, lr
    assert f"lr: first diverging step {first}," in baseline["reason"], baseline["reason"]
    assert record["status"] == "failed"


@pytest.mark.parametrize("plant", [None, "other_order"])
def test_a_router_bug_is_caught_by_the_baselines_losses_and_passed_by_the_self_check(
        plant, tmp_path):
    from harness.assets import ensure_assets

    assets = ensure_assets("tiny")
    var_args = [f"--harness-var=MIXTRAL_LLMC_FILEPATH={assets.checkpoint('mixtral')}",
                f"--harness-var=MIXTRAL_INPUT_BIN={assets.tokens('mixtral')}"]
    config = _config(tmp_path, "moe", {"MIXTRAL_TEST_GROUPS": "moe"}, "moe", MOE_CASE)
    # a tiny_mixtral compiled with the file's own config (the preset's tiny Mixtral, not
    # config.h's 3.4 GB one)
    build = make_build_dir(tmp_path / "build", flavour="support_moe", models=("tiny_mixtral",),
                           mixtral_config="file")
    record = _session(tmp_path, build, config, var_args, "moe/tiny_mixtral/1",
                      {"STANDIN_PLANT_ROUTER": plant or ""})
    assert record["self_check"] == "passed", record["reason"]
    baseline = record["baseline"]
    assert baseline["source"] == "pytorch (live)", baseline
    assert baseline["run"]["model"] == "mixtral" and baseline["lr"]["ok"] is True, baseline
    if plant is None:
        assert baseline["status"] == "passed", baseline
        assert record["status"] == "passed", record["reason"]
        return
    assert baseline["status"] == "failed", baseline
    assert baseline["loss"]["ok"] is False and baseline["first_diverging_step"] is not None
    assert baseline["reason"].startswith(
        f"first diverging step {baseline['first_diverging_step']},"), baseline["reason"]
    assert record["status"] == "failed"
