"""The test config: schema, loading, @VAR@ substitution, InfiniTrain mapping, case expansion.

    load.py          read, parse, validate, build: load_config, read_tags
    validate.py      JSON Schema errors as one line; tags and ids matched in full
    errors.py        ConfigError and where in the file an error is
    build.py         variables, model files, assets, trainer
    expand.py        test groups -> (tag, case, model) Cases, tolerances and comparisons layered
    args.py          a case's flags: @VAR@ substitution, typed values from the flag table,
                     defaults < group < case, owned flags refused, world size (dp /
                     nthread_per_process x tp x pp) and total-batch arithmetic
    node_ids.py      case names from pytest node ids
    config_types.py  the dataclasses: Compare, ModelFiles, TrainerSpec, Case, ... (Tolerance(s):
                     harness.contracts.tolerance, re-exported here)
    schema.py        the JSON Schema
"""

from .config_types import (
    Case,
    Compare,
    HarnessConfig,
    ModelFiles,
    Overrides,
    TrainerSpec,
)
from harness.contracts.tolerance import Tolerance, Tolerances  # the package API: configs use them
from .errors import ConfigError
from .load import load_config, read_tags

__all__ = ["Case", "Compare", "ConfigError", "HarnessConfig", "ModelFiles", "Overrides", "Tolerance",
           "Tolerances", "TrainerSpec", "load_config", "read_tags"]
