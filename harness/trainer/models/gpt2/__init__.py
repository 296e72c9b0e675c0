"""GPT-2: the model (model.py) and its tensor-parallel plan (parallelize.py), as one TrainSpec
with its torch-free contract (harness.contracts.models.GPT2_SPEC)."""

from __future__ import annotations

from harness.contracts.models import GPT2_SPEC
from harness.trainer.models.gpt2.model import GPT2
from harness.trainer.models.gpt2.parallelize import parallelize_gpt2
from harness.trainer.models.train_spec import TrainSpec

# its fused q/k/v and sequence-parallel norms are llm.c's (TrainSpec's defaults)
TRAIN_SPEC = TrainSpec(contract=GPT2_SPEC, model=GPT2, parallelize=parallelize_gpt2)
