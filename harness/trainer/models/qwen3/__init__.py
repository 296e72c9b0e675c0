"""Qwen3: the model (model.py) and its tensor-parallel plan (parallelize.py), as one TrainSpec
with its torch-free contract (harness.contracts.models.QWEN3_SPEC)."""

from __future__ import annotations

from harness.contracts.models import QWEN3_SPEC
from harness.trainer.models.qwen3.model import Qwen3
from harness.trainer.models.qwen3.parallelize import is_head_norm, parallelize_qwen3
from harness.trainer.models.train_spec import TrainSpec

# its fused q/k/v and sequence-parallel norms are llm.c's (TrainSpec's defaults); its q / k
# norms see this rank's heads only under TP
TRAIN_SPEC = TrainSpec(contract=QWEN3_SPEC, model=Qwen3, parallelize=parallelize_qwen3,
                       head_norm=is_head_norm)
