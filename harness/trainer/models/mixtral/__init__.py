"""tiny Mixtral: the model (model.py) and its tensor-parallel plan (parallelize.py), as one
TrainSpec with its torch-free contract (harness.contracts.models.MIXTRAL_SPEC; the facts it
follows: harness.contracts.mixtral_facts)."""

from __future__ import annotations

from harness.contracts.models import MIXTRAL_SPEC
from harness.trainer.models.mixtral.model import Mixtral
from harness.trainer.models.mixtral.parallelize import parallelize_mixtral
from harness.trainer.models.train_spec import TrainSpec

# its fused q/k/v and sequence-parallel norms are llm.c's (TrainSpec's defaults)
TRAIN_SPEC = TrainSpec(contract=MIXTRAL_SPEC, model=Mixtral, parallelize=parallelize_mixtral)
