"""The trainer's model families: one ``TrainSpec`` per family of ``harness.contracts.models``."""

from __future__ import annotations

from harness.contracts.models import spec_for_config
from harness.trainer.models import gpt2, llama3, mixtral, qwen3
from harness.trainer.models.train_spec import TrainSpec

# Every family of harness.contracts.models has one (tests/trainer/models/test_train_specs.py checks).
TRAIN_SPECS: dict[str, TrainSpec] = {
    spec.name: spec for spec in (gpt2.TRAIN_SPEC, llama3.TRAIN_SPEC, qwen3.TRAIN_SPEC,
                                 mixtral.TRAIN_SPEC)
}


def train_spec_for_config(config) -> TrainSpec:
    """The TrainSpec of the family whose config type ``config`` is (UnknownModelError, naming
    the known ones, for another type)."""
    return TRAIN_SPECS[spec_for_config(config).name]
