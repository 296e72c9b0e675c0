"""The models: GPT-2, LLaMA 3, Qwen3 and tiny Mixtral as plain PyTorch modules, and their
llm.c-named weights.

One folder per family, torchtitan style (gpt2/, llama3/, qwen3/, mixtral/): ``model.py`` (the
module, no torch.distributed) and ``parallelize.py`` (its TP / SP plan, as code) beside it, put
together as one ``TrainSpec`` (train_spec.py) and listed in registry.py.

``build_model(config, ...)`` makes a whole model or a part (a pipeline stage / chunk) from a
config; ``load_weights(part, tensors)`` fills a part from named tensors (llm.c names with
global layer indices, docs/design.md), strictly.
"""

from __future__ import annotations

# The configs import no torch, so reading a checkpoint header (harness.contracts.llmc) and
# generating synthetic assets stay quick; the torch modules load on first use.
from harness.trainer.models.configs import GPT2Config, LLaMA3Config, MixtralConfig, Qwen3Config

__all__ = [
    "GPT2",
    "GPT2Config",
    "LLaMA3",
    "LLaMA3Config",
    "Mixtral",
    "MixtralConfig",
    "ModelPart",
    "Qwen3",
    "Qwen3Config",
    "build_model",
    "load_weights",
    "source_name",
]


def __getattr__(name: str):
    if name in ("build_model", "load_weights", "source_name"):
        from harness.trainer.models import build as module
    elif name == "GPT2":
        from harness.trainer.models.gpt2 import model as module
    elif name == "LLaMA3":
        from harness.trainer.models.llama3 import model as module
    elif name == "Qwen3":
        from harness.trainer.models.qwen3 import model as module
    elif name == "Mixtral":
        from harness.trainer.models.mixtral import model as module
    elif name == "ModelPart":
        from harness.trainer.models import common as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(module, name)
