"""Qwen3's tensor-parallel plan, as code: LLaMA 3's (harness/trainer/models/llama3/
parallelize.py), applied by module name from outside the model.

The one addition is where the q / k norms stand. Their gains are replicated, but under TP a rank
normalizes only the heads of its own c_attn rows, so each rank's gradient of a gain is its heads'
share: ``is_head_norm`` names them, and the trainer sums their gradients over the TP group after
the backward (harness.trainer.parallel.reductions, ``head_parallel``), with or without sequence
parallel (the attention runs on the gathered sequence either way).
"""

from __future__ import annotations

import re

from harness.trainer.models.llama3.parallelize import parallelize_llama3
from harness.trainer.models.qwen3.model import Qwen3

_HEAD_NORM = re.compile(r"h\.[^.]+\.attn\.[qk]_norm\.[^.]+")


def is_head_norm(name: str) -> bool:
    """A parameter of a per-head norm, h.{i}.attn.q_norm / k_norm: replicated, but a TP rank
    applies it to its own heads only."""
    return bool(_HEAD_NORM.fullmatch(name))


def parallelize_qwen3(part: Qwen3, tp_mesh, sequence_parallel: bool) -> None:
    """Shard ``part`` over ``tp_mesh`` (the mesh's "tp" dimension), in place: LLaMA 3's plan."""
    parallelize_llama3(part, tp_mesh, sequence_parallel)
