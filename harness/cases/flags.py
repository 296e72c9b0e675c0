"""The trainer flags a case may set, read from the flag table (`harness.spec.flags`): which the
harness owns, the bundled trainer's defaults, and each flag's typed value after @VAR@
substitution. A flag the table does not know is a foreign trainer's own: kept as written."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from harness.spec.flags import FLAG_TABLE, FLAGS, FlagError, expected

# Flags the harness sets itself for every run, and what a config does instead.
HARNESS_OWNED = {
    "model": "list the model in `models`",
    "llmc_filepath": "set `model_files.<model>.checkpoint`",
    "input_bin": "set `model_files.<model>.input_bin`",
    "device": "use --harness-device",
    "output_dir": "the harness gives every run its own folder",
    "dump_gradients": "the harness dumps gradients when `compare.gradients` is true",
    "dump_parameter_updates": "the harness dumps them when `compare.gradients` is true",
    "profile_layers": "not a precision-test setting",
}
assert set(HARNESS_OWNED) == {f.name for f in FLAGS if f.owner == "harness"}, \
    "HARNESS_OWNED must name exactly the flag table's harness-owned flags"
# The bundled trainer's defaults of the hyper-parameters every case resolves.
TRAINER_DEFAULTS = {
    name: FLAG_TABLE[name].default
    for name in ("dtype", "batch_size", "sequence_length", "num_iteration", "learning_rate",
                 "weight_decay", "optimizer", "seed", "tensor_parallel", "sequence_parallel",
                 "pipeline_parallel", "virtual_pipeline_parallel")
}


def coerce(name: str, value: Any, fail) -> Any:
    """The typed value of one flag (after substitution); a foreign flag's value as written."""
    flag = FLAG_TABLE.get(name)
    if flag is None:
        return value
    try:
        return flag.check(value)
    except FlagError:
        pass
    try:  # the right type, out of bounds?
        replace(flag, minimum=None, value_range=None, choices=()).check(value)
    except FlagError:
        fail(f"{value!r} is not {_KIND[flag.type]}")
    fail(f"{value!r} is not {expected(flag)}")


_KIND = {int: "an integer", float: "a number", bool: "a boolean; expected true or false",
         str: "a string"}
