"""The test config: schema, loading, @VAR@ substitution, InfiniTrain mapping, case expansion."""

from .config import (
    Case,
    Compare,
    ConfigError,
    HarnessConfig,
    ModelFiles,
    Tolerance,
    Tolerances,
    TrainerSpec,
    load_config,
    read_tags,
)

__all__ = ["Case", "Compare", "ConfigError", "HarnessConfig", "ModelFiles", "Tolerance",
           "Tolerances", "TrainerSpec", "load_config", "read_tags"]
