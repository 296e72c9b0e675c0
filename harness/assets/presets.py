"""Sizes of the synthetic assets. Token ids are bytes of English text (< 128), so any
vocabulary of at least 256 holds them; larger vocabularies only make the head heavier.

Each model family's config per preset is its ModelSpec's ``asset_configs``
(harness.contracts.models); a preset here adds its purpose and token counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from harness.contracts.models import MODEL_SPECS, UnknownModelError


@dataclass(frozen=True)
class Preset:
    name: str
    purpose: str
    train_tokens: int
    val_tokens: int
    configs: Mapping[str, object] = field(default_factory=dict, hash=False)  # model -> config

    def config(self, model: str):
        """The model's config at this size: ``PRESETS["tiny"].config("gpt2")``."""
        try:
            return self.configs[model]
        except KeyError:
            raise UnknownModelError(f"preset {self.name!r} has no model {model!r}; known models: "
                                    f"{', '.join(self.configs)}") from None


def _preset(name: str, purpose: str, train_tokens: int, val_tokens: int) -> Preset:
    configs = {spec.name: spec.asset_configs[name] for spec in MODEL_SPECS.values()}
    return Preset(name, purpose, train_tokens, val_tokens, configs)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        _preset("tiny", "CPU tests", train_tokens=64 * 1024, val_tokens=8 * 1024),
        _preset("small", "quick GPU runs, deeper pipelines",
                train_tokens=256 * 1024, val_tokens=16 * 1024),
        # A heavy head (vocab 8K against width 256) as real LMs have, for throughput and
        # pipeline-balancing benchmarks.
        _preset("bench", "throughput benchmarks", train_tokens=1024 * 1024, val_tokens=64 * 1024),
        # Chosen by default for the infinitrain backend: what InfiniTrain master's loaders accept
        # (GPT-2 with 12 heads, LLaMA 3 with a 128256-token vocabulary), small for a CPU build.
        _preset("infinitrain", "InfiniTrain's binaries (what master's loaders accept)",
                train_tokens=64 * 1024, val_tokens=8 * 1024),
    ]
}
