"""PipelineLayout: which layers, and the embedding / final norm / lm head, live where.

A layout is an immutable value. Chunks have a global order (the order data flows through the
model); chunk g is `(stage, start, end)` and holds layers `start..end-1`. The embedding lives in
the first chunk, the final norm and the lm head in the last. A stage's chunks, in global order,
are its local (virtual) chunks 0..vpp-1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

from .costs import LayerCosts, parse_costs
from .errors import (COSTS_FLAG, PP_FLAG, VPP_FLAG, LayoutError, check_chunk_count, check_count,
                     flag_value)
from .megatron import parse_megatron, render_megatron
from .partition import parse_chunk_layout, parse_partition
from .render import describe as render_layout
from .solver import balance_stages

JSON_FORMAT = "harness.pipeline_layout/1"

Chunk = tuple[int, int, int]


@dataclass(frozen=True)
class PipelineLayout:
    num_layers: int
    pp: int
    vpp: int
    chunks: tuple[Chunk, ...]

    def __post_init__(self) -> None:
        check_count("num_layers", self.num_layers)
        check_count("pp", self.pp)
        check_count("vpp", self.vpp)
        check_chunk_count(self.pp, self.vpp)
        try:
            chunks = tuple((int(s), int(a), int(b)) for s, a, b in self.chunks)
        except (TypeError, ValueError):
            raise LayoutError(f"chunks must be (stage, start, end) triples, got {self.chunks!r}") from None
        # Normalize so a layout read from JSON (lists) equals one built in code (tuples).
        object.__setattr__(self, "chunks", chunks)
        _check_chunks(self.num_layers, self.pp, self.vpp, chunks)

    # --- constructors

    @classmethod
    def uniform(cls, num_layers: int, pp: int, vpp: int = 1) -> PipelineLayout:
        """Even split over pp*vpp chunks, remainder layers to the earliest chunks; chunk g on stage g % pp."""
        check_count("num_layers", num_layers)
        check_count(PP_FLAG, pp)
        check_count(VPP_FLAG, vpp)
        check_chunk_count(pp, vpp)
        n_chunks = pp * vpp
        base, extra = divmod(num_layers, n_chunks)
        return cls.from_chunk_sizes(num_layers, pp, [(g % pp, base + (g < extra)) for g in range(n_chunks)])

    @classmethod
    def from_chunk_sizes(cls, num_layers: int, pp: int, sizes: Sequence[tuple[int, int]]) -> PipelineLayout:
        """From an ordered list of (stage, layer count); vpp is the number of chunks per stage."""
        chunks, start = [], 0
        for stage, count in sizes:
            chunks.append((stage, start, start + count))
            start += count
        return cls(num_layers, pp, max(1, len(chunks) // pp), tuple(chunks))

    @classmethod
    def from_partition(cls, num_layers: int, partition: str | Sequence[int], pp: int | None = None) -> PipelineLayout:
        """One positive layer count per stage (e.g. "4,8,6,6"), summing to num_layers; vpp is 1."""
        counts = parse_partition(num_layers, partition, pp)
        return cls.from_chunk_sizes(num_layers, len(counts), list(enumerate(counts)))

    @classmethod
    def from_costs(cls, num_layers: int, pp: int, costs) -> PipelineLayout:
        """The partition minimizing the slowest stage for per-layer costs ("1x8,L:4.5"); vpp is 1."""
        check_count(PP_FLAG, pp)
        spec = costs if isinstance(costs, LayerCosts) else parse_costs(costs, num_layers)
        text = costs if isinstance(costs, str) else spec.to_spec()
        spec.check_layers(num_layers, text)
        if num_layers < pp:
            raise LayoutError(f"{flag_value(COSTS_FLAG, text)} gives {num_layers} layer costs, but {PP_FLAG} "
                              f"is {pp}; expected at least one layer per stage")
        counts = balance_stages(spec.layers, pp, spec.embedding, spec.lm_head)
        return cls.from_chunk_sizes(num_layers, pp, list(enumerate(counts)))

    @classmethod
    def from_chunk_layout(cls, num_layers: int, pp: int, text: str) -> PipelineLayout:
        """Ordered `STAGE:LAYERS` chunk list ("0:3,1:3,1:3,0:3"); every stage owns vpp chunks."""
        return cls.from_chunk_sizes(num_layers, pp, parse_chunk_layout(num_layers, pp, text))

    @classmethod
    def from_megatron(cls, num_layers: int, pp: int, text: str) -> PipelineLayout:
        """Megatron-style string ("Et*3||t*3|t*6NL"): segment i on stage i % pp, chunk i // pp."""
        counts = parse_megatron(num_layers, pp, text)
        return cls.from_chunk_sizes(num_layers, pp, [(g % pp, c) for g, c in enumerate(counts)])

    # --- queries

    def stage_chunks(self, stage: int) -> list[int]:
        """Global indices of the stage's chunks, in local order."""
        self._check_stage(stage)
        return [g for g, (s, _, _) in enumerate(self.chunks) if s == stage]

    def layer_ranges(self, stage: int) -> list[tuple[int, int]]:
        """`(start, end)` of each of the stage's chunks, in local order (end exclusive)."""
        return [self.chunks[g][1:] for g in self.stage_chunks(stage)]

    def chunk_for_layer(self, layer: int) -> int:
        """Global index of the chunk holding the layer."""
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.num_layers:
            raise LayoutError(f"layer {layer!r} is out of range; the model has {self.num_layers} layers")
        return next(g for g, (_, a, b) in enumerate(self.chunks) if a <= layer < b)

    def stage_for_layer(self, layer: int) -> int:
        return self.chunks[self.chunk_for_layer(layer)][0]

    def owns_embedding(self, stage: int) -> bool:
        self._check_stage(stage)
        return self.chunks[0][0] == stage

    def owns_final_norm(self, stage: int) -> bool:
        # The final norm always sits with the head: they are one part in every model we run.
        return self.owns_lm_head(stage)

    def owns_lm_head(self, stage: int) -> bool:
        self._check_stage(stage)
        return self.chunks[-1][0] == stage

    def stage_layer_counts(self) -> tuple[int, ...]:
        counts = [0] * self.pp
        for stage, start, end in self.chunks:
            counts[stage] += end - start
        return tuple(counts)

    def is_round_robin(self) -> bool:
        """True when chunk g is on stage g % pp (Megatron's and the interleaved schedules' order)."""
        return all(s == g % self.pp for g, (s, _, _) in enumerate(self.chunks))

    # --- renderings

    def to_chunk_layout(self) -> str:
        """The `--pipeline_chunk_layout` string; every layout has one."""
        return ",".join(f"{s}:{b - a}" for s, a, b in self.chunks)

    def to_megatron(self) -> str:
        """The canonical `--pipeline_model_parallel_layout` string (only for round-robin layouts)."""
        if not self.is_round_robin():
            raise LayoutError(
                f"layout {self.to_chunk_layout()!r} does not place chunk g on stage g % {self.pp}, "
                f"so it has no --pipeline_model_parallel_layout form; use --pipeline_chunk_layout")
        return render_megatron([b - a for _, a, b in self.chunks])

    def to_dict(self) -> dict:
        return {"format": JSON_FORMAT, "num_layers": self.num_layers, "pp": self.pp, "vpp": self.vpp,
                "chunks": [list(c) for c in self.chunks]}

    @classmethod
    def from_dict(cls, data: dict) -> PipelineLayout:
        if not isinstance(data, dict) or data.get("format") != JSON_FORMAT:
            raise LayoutError(f"not a pipeline layout (expected an object with format {JSON_FORMAT!r}): {data!r:.200}")
        try:
            return cls(data["num_layers"], data["pp"], data["vpp"], data["chunks"])
        except KeyError as missing:
            raise LayoutError(f"pipeline layout JSON lacks the field {missing}") from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> PipelineLayout:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise LayoutError(f"pipeline layout JSON is malformed: {err}") from None
        return cls.from_dict(data)

    def describe(self) -> str:
        """One line per stage: its chunks in local order, their layers, and E / N / L markers."""
        return render_layout(self)

    __str__ = describe

    def _check_stage(self, stage: int) -> None:
        if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < self.pp:
            raise LayoutError(f"stage {stage!r} is out of range; --pipeline_parallel is {self.pp}")


def _check_chunks(num_layers: int, pp: int, vpp: int, chunks: tuple[Chunk, ...]) -> None:
    """The invariants every layout holds, however it was built."""
    if len(chunks) != pp * vpp:
        raise LayoutError(f"layout has {len(chunks)} chunks, but pp * vpp is {pp} * {vpp} = {pp * vpp}")
    per_stage = [0] * pp
    expected_start = 0
    for g, (stage, start, end) in enumerate(chunks):
        if not 0 <= stage < pp:
            raise LayoutError(f"chunk {g} is on stage {stage}, but pp is {pp}")
        if start != expected_start or end < start:
            raise LayoutError(
                f"chunk {g} holds layers [{start}, {end}), but layers must be contiguous and in order: "
                f"expected it to start at {expected_start}")
        per_stage[stage] += 1
        expected_start = end
    if expected_start != num_layers:
        raise LayoutError(f"chunks hold {expected_start} layers, but the model has {num_layers}")
    if any(n != vpp for n in per_stage):
        raise LayoutError(f"chunks per stage are {per_stage}, but every stage must own vpp = {vpp}")
