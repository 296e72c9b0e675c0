"""Diff a run against its single-device reference: loss per step and every gradient file."""

from .diff import (
    GradientDiff,
    LossDiff,
    ParameterDiff,
    compare_gradients,
    compare_losses,
    gradient_names,
    within,
)
from .locate import Locator
from .render import gradient_lines, loss_lines
from .tp_shards import ShardMatch, match_shard

__all__ = ["GradientDiff", "Locator", "LossDiff", "ParameterDiff", "ShardMatch",
           "compare_gradients", "compare_losses", "gradient_lines", "gradient_names",
           "loss_lines", "match_shard", "within"]
