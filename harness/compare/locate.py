"""Which pipeline stage and transformer layer a parameter belongs to, from the run's recorded
layout (run.json `layout`: {"chunks": [[stage, start, end], ...], ...} in global order).

`h.{i}.…` is layer i, on the stage whose chunk holds i; `wte` / `wpe` (embedding) are on the
first chunk's stage; `ln_f` / `lm_head` on the last chunk's. GPT-2's `wte` is tied to the head,
so it lives on both ends when they differ.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.contracts.models import MODEL_SPECS
from harness.contracts.models import layer_of as _spec_layer_of


@dataclass(frozen=True)
class Locator:
    chunks: tuple[tuple[int, int, int], ...] = ()
    tied_embedding: bool = False  # GPT-2

    @classmethod
    def from_layout(cls, layout: dict | None, model: str | None = None) -> "Locator":
        chunks = ()
        if isinstance(layout, dict) and isinstance(layout.get("chunks"), list):
            try:
                chunks = tuple((int(s), int(a), int(b)) for s, a, b in layout["chunks"])
            except (TypeError, ValueError):
                chunks = ()
        spec = MODEL_SPECS.get(model)  # None for no model or one the registry lacks
        return cls(chunks, tied_embedding=bool(spec and spec.tied_parameters))

    def stages(self, name: str) -> tuple[int, ...]:
        """The pipeline stages holding the parameter; () where the layout does not say."""
        name = canonical_name(name)
        part = layer_of(name)
        if isinstance(part, int):
            return next(((stage,) for stage, start, end in self.chunks if start <= part < end), ())
        if not self.chunks or part == "other":
            return ()
        first, last = self.chunks[0][0], self.chunks[-1][0]
        if part == "embedding":
            tied = name in _TIED_KEPT and self.tied_embedding and first != last
            return (first, last) if tied else (first,)
        return (last,)  # final norm, lm head

    def locate(self, name: str) -> tuple[str, str]:
        """(stage, layer) as text; '?' where the layout is unknown, '-' for no layer."""
        part, stages = layer_of(name), self.stages(name)
        if isinstance(part, int):
            return (str(stages[0]) if stages else "?"), str(part)
        if not stages:
            return "?", "-"
        if len(stages) == 2:
            return f"{stages[0]}+{stages[1]} (tied embedding / lm head)", "-"
        what = {"embedding": "embedding", "final_norm": "final norm", "head": "lm head"}[part]
        return f"{stages[0]} ({what})", "-"


# Prefixes other trainers put before llm.c's names: InfiniTrain's `transformer.h.3.attn...`
# (its GPT-2 / LLaMA 3 modules), DDP's `module.`.
FOREIGN_PREFIXES = ("module.", "transformer.")


def canonical_name(name: str) -> str:
    """llm.c's name of a parameter another trainer names with a prefix."""
    while name.startswith(FOREIGN_PREFIXES):  # in any order: `module.transformer.h.0...`
        name = name.partition(".")[2]  # every prefix is one dotted segment
    return name


# the names that tied parameters are reported under (GPT-2: wte.weight), from the registry
_TIED_KEPT = frozenset(kept for s in MODEL_SPECS.values() for kept, _alias in s.tied_parameters)


def layer_of(name: str) -> int | str:
    """A parameter's place (llm.c naming): its transformer layer index, or "embedding",
    "final_norm", "head", "other"; the rule is the model registry's (ModelSpec.place), on
    the name without another trainer's prefix."""
    return _spec_layer_of(canonical_name(name))
