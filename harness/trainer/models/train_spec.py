"""A model family on the trainer's side: ``TrainSpec`` (torchtitan's name for the same thing).

A family is two files of code in ``harness/trainer/models/<family>/``: ``model.py``, the torch
module (names = the llm.c checkpoint's keys, no torch.distributed), and ``parallelize.py``, its
tensor- and sequence-parallel plan, a function that applies torch.distributed.tensor.parallel
styles by module name. Its ``__init__.py`` puts them together with the family's torch-free
contract (``harness.contracts.models.ModelSpec``: config, llm.c formats, tied parameters, the name ->
place rule) as one ``TrainSpec``; ``harness.trainer.models.registry`` lists the families.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from harness.contracts.models import ModelSpec
from harness.trainer.models.common import (ModelPart, is_fused_qkv, is_sequence_norm,
                                           no_parameter)
from harness.trainer.models.configs import missing_config_fields

# (part, the mesh's "tp" dimension, sequence_parallel) -> None: shards the part in place
Parallelize = Callable[[ModelPart, object, bool], None]


@dataclass(frozen=True)
class TrainSpec:
    contract: ModelSpec  # the torch-free side: config, llm.c formats, tied parameters, places
    model: type[ModelPart]  # builds a whole model or a part: (config, layers=..., embedding=...)
    parallelize: Parallelize  # the TP plan (with the SP entries when asked), as code
    # Parameters (by name) whose rows parallelize re-orders to whole-head [q_r; k_r; v_r]
    # shards: the gradient dump undoes that order. By default llm.c's h.{i}.attn.c_attn.
    fused_qkv: Callable[[str], bool] = is_fused_qkv
    # Parameters of the modules that run on this rank's sequence slice under SP: their
    # gradients are summed over the TP group after the backward. By default llm.c's norms.
    sequence_norm: Callable[[str], bool] = is_sequence_norm
    # Replicated parameters of modules that run on this rank's heads only under TP (qwen3's
    # q / k norms): their gradients are summed over the TP group after the backward. None by
    # default.
    head_norm: Callable[[str], bool] = no_parameter

    def __post_init__(self) -> None:
        if not (isinstance(self.model, type) and issubclass(self.model, ModelPart)):
            raise TypeError(f"TrainSpec {self.contract.name!r}: model {self.model!r} is not a "
                            f"ModelPart subclass")
        missing = missing_config_fields(self.contract.config)
        if missing:  # read by the parallel plans and dumps: never guessed
            raise TypeError(f"TrainSpec {self.contract.name!r}: config "
                            f"{self.contract.config.__name__} does not declare "
                            f"{', '.join(missing)} (harness.trainer.models.configs.ModelConfig: "
                            f"every field the trainer reads, a dataclass field or a property)")

    @property
    def name(self) -> str:
        return self.contract.name
