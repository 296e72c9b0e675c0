"""Model hyper-parameters, as the llm.c checkpoint headers store them, and what the trainer reads
of every family's config.

The dataclasses live with the families' torch-free contract in ``harness.contracts.models``; this
module keeps the old import path. ``ModelConfig`` names every field the trainer's parallel plans,
checks and dumps read of a config, whatever the family: each family's config declares all of
them (as a dataclass field or a property), so nothing reads one with a default, and a family
that leaves one out is refused when its ``TrainSpec`` is defined (``missing_config_fields``).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from harness.contracts.models import GPT2Config, LLaMA3Config, MixtralConfig, Qwen3Config

__all__ = ["CONFIG_FIELDS", "GPT2Config", "LLaMA3Config", "MixtralConfig", "ModelConfig",
           "Qwen3Config", "missing_config_fields"]


class ModelConfig(Protocol):
    """What the trainer reads of a model config (every family declares each one)."""

    block_size: int  # the longest sequence
    vocab_size: int
    n_layer: int
    n_head: int  # query heads
    n_kv_head: int  # key/value heads (GPT-2: n_head); TP needs whole ones per shard
    n_embd: int
    head_dim: int  # n_embd // n_head
    ffn_dim: int  # the MLP's hidden width (GPT-2: 4 * n_embd; Mixtral: an expert's), split by TP


CONFIG_FIELDS: tuple[str, ...] = tuple(ModelConfig.__annotations__)


def missing_config_fields(config_type: type) -> list[str]:
    """The ModelConfig fields that ``config_type`` declares neither as a dataclass field nor as
    a class attribute (a property)."""
    declared = {f.name for f in dataclasses.fields(config_type)} \
        if dataclasses.is_dataclass(config_type) else set()
    return [name for name in CONFIG_FIELDS
            if name not in declared and not hasattr(config_type, name)]
