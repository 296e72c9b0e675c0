"""The trainer flags a case may set: who owns which (the harness, InfiniTrain only, the
trainer), the trainer's defaults, and each flag's typed value after @VAR@ substitution."""

from __future__ import annotations

import math
import re
from typing import Any

from harness.trainer.flags import DTYPES, OPTIMIZERS, SCHEDULES, TrainerFlags  # no torch

from .schema import ARG_TYPES

# Flags the harness sets itself for every run; a case may not set them.
HARNESS_OWNED = {
    "model": "list the model in `models`",
    "llmc_filepath": "set `model_files.<model>.checkpoint`",
    "input_bin": "set `model_files.<model>.input_bin`",
    "device": "use --harness-device",
    "output_dir": "the harness gives every run its own folder",
    "dump_gradients": "the harness dumps gradients when `compare.gradients` is true",
    "profile_layers": "not a precision-test setting",
}
# InfiniTrain flags (scripts/test_config.json) our trainer does not implement: a case using one
# is collected and skipped with the reason, so their whole file loads.
INFINITRAIN_ONLY = frozenset({
    "zero_stage", "use_distributed_optimizer", "lr_decay_style", "min_lr", "lr_warmup_iters",
    "lr_warmup_init", "lr_decay_iters", "activation_recompute", "recompute_granularity",
    "recompute_method", "recompute_num_layers", "lora_rank", "lora_alpha",
    "lora_target_modules", "save", "load", "save_interval", "save_optimizer_state",
    "max_checkpoint_keep", "global_batch_size", "micro_batch_size", "flash", "llmc_filepath_val",
    "input_val_bin", "val_loss_every", "sample_every", "overfit_single_batch", "grad_clip",
    "num_threads",
})
# Defaults of the hyper-parameters every case resolves (the trainer's own defaults).
TRAINER_DEFAULTS = {
    name: getattr(TrainerFlags(), name)
    for name in ("dtype", "batch_size", "sequence_length", "num_iteration", "learning_rate",
                 "weight_decay", "optimizer", "seed", "tensor_parallel", "sequence_parallel",
                 "pipeline_parallel", "virtual_pipeline_parallel")
}
_INT_FLAGS = {n for n, t in ARG_TYPES.items() if "integer" in t["type"]}
_NUM_FLAGS = {n for n, t in ARG_TYPES.items() if "number" in t["type"]}
_BOOL_FLAGS = {n for n, t in ARG_TYPES.items() if "boolean" in t["type"]}


def coerce(name: str, value: Any, fail) -> Any:
    """The typed value of one trainer flag (after substitution)."""
    if name in _BOOL_FLAGS:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        fail(f"{value!r} is not a boolean; expected true or false")
    if name in _INT_FLAGS:
        if isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value.strip()):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            fail(f"{value!r} is not an integer")
        if name != "seed" and value <= 0:
            fail(f"{value!r} is not a positive integer")
        if name == "seed" and not -(2**63) <= value <= 2**64 - 1:
            fail(f"{value!r} is out of range; expected an integer from -2**63 to 2**64-1")
        return value
    if name in _NUM_FLAGS:
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                fail(f"{value!r} is not a number")
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or value < 0:
            fail(f"{value!r} is not a finite number >= 0")
        return float(value)
    if name == "dtype" and value not in DTYPES:
        fail(f"{value!r} is not one of {', '.join(DTYPES)}")
    if name == "optimizer" and value not in OPTIMIZERS:
        fail(f"{value!r} is not one of {', '.join(OPTIMIZERS)}")
    if name == "pipeline_schedule":
        if value not in SCHEDULES:
            fail(f"{value!r} is not one of {', '.join(SCHEDULES)}")
    if not isinstance(value, str):
        fail(f"{value!r} is not a string")
    return value
