"""LLaMA 3: the model (model.py) and its tensor-parallel plan (parallelize.py), as one
TrainSpec with its torch-free contract (harness.contracts.models.LLAMA3_SPEC)."""

from __future__ import annotations

from harness.contracts.models import LLAMA3_SPEC
from harness.trainer.models.llama3.model import LLaMA3
from harness.trainer.models.llama3.parallelize import parallelize_llama3
from harness.trainer.models.train_spec import TrainSpec

# its fused q/k/v and sequence-parallel norms are llm.c's (TrainSpec's defaults)
TRAIN_SPEC = TrainSpec(contract=LLAMA3_SPEC, model=LLaMA3, parallelize=parallelize_llama3)
