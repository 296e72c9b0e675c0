"""The bundled trainer's lr, case by case, against what InfiniTrain's feat/lr_scheduler and
InfiniTrain-Test's PyTorch baseline printed on an A100 machine (tests/logs/fixtures/
lr_scheduler: g3025 20260708 runs, the PyTorch lr-scheduler log): every step of every case
within print resolution (harness.compare.baseline.judge_lr), which needs no GPU. The trainer
prints LRSchedule.printed(step) (harness/trainer/main.py's loop), so this is its lr column."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.compare.baseline import judge_lr
from harness.logs.readers import read_paths
from harness.trainer.flags import parse_flags

ROOT = Path(__file__).parents[2]
FIXTURES = ROOT / "tests" / "logs" / "fixtures" / "lr_scheduler"
CONFIG = ROOT / "tests" / "infinitrain" / "data" / "branches" / "feat_lr_scheduler.json"
SCHEDULE_FLAGS = ("learning_rate", "min_lr", "lr_decay_style", "lr_warmup_iters",
                  "lr_warmup_init", "lr_decay_iters", "num_iteration")


def _config_args() -> dict[str, dict]:
    groups = json.loads(CONFIG.read_text())["test_groups"]
    return {t["id"]: t["args"] for g in groups if g["tag"] == "lr_scheduler" for t in g["tests"]}


def _args(case: str) -> dict:
    """The case's flags in the branch's config. The 20260708 recording ran `3_none_zero2`,
    which today's config calls `3_none_distopt` (the same lr flags: style none, lr 1e-5; only
    the ZeRO flag was renamed)."""
    args = _config_args()
    return args[case] if case in args else args[case.replace("_zero2", "_distopt")]


def _readings():
    return [("InfiniTrain", run) for run in read_paths([FIXTURES / "infinitrain"]).runs] + \
        [("PyTorch", run) for run in read_paths([FIXTURES / "pytorch"]).runs]


def test_every_recorded_case_is_read():
    readings = _readings()
    assert len(readings) == 40  # 20 InfiniTrain logs, 20 PyTorch sections
    assert {run.case for _, run in readings} <= {c.replace("_distopt", "_zero2")
                                                  for c in _config_args()} | set(_config_args())


@pytest.mark.parametrize("side, run", _readings(), ids=lambda x: x if isinstance(x, str) else
                         f"{x.model}/{x.case}")
def test_the_bundled_trainers_lr_matches_the_recorded_lr_at_every_step(side, run):
    args = _args(run.case)
    argv = [f"--{name}={args[name]}" for name in SCHEDULE_FLAGS if name in args]
    schedule = parse_flags(argv).lr_schedule()
    ours = [schedule.printed(step) for step in run.steps]
    verdict = judge_lr(run.steps, run.lrs, run.lr_resolutions, run.steps, ours,
                       [0.0] * len(ours), where=f"{side} {run.source}")
    assert verdict.ok, verdict.lines()
    assert len(run.steps) == int(args["num_iteration"])
