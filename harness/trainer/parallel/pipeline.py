"""Pipeline stages from the layout: each rank builds only its own chunks.

Chunk g of the layout (global order) is torch.distributed.pipelining's stage index g; the layout
stage holding it is the pp rank that runs it. Chunk 0 holds the embedding, the last chunk the
final norm and the lm head. A chunk with no layers (Megatron's `||`) is a model part with nothing
in it, whose forward returns a copy of its input: a PipelineStage without parameters, which torch
runs fine (its backward passes the output gradient through; there is nothing to scale).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ChunkSpec:
    index: int  # global chunk index = pipelining stage index
    stage: int  # layout stage = pp rank
    start: int
    end: int
    embedding: bool
    final_norm: bool
    lm_head: bool


def chunk_specs(layout) -> list[ChunkSpec]:
    chunks = list(layout.chunks)
    last = len(chunks) - 1
    specs = []
    for g, (stage, start, end) in enumerate(chunks):
        specs.append(
            ChunkSpec(
                index=g,
                stage=stage,
                start=start,
                end=end,
                embedding=g == 0,
                final_norm=g == last and layout.owns_final_norm(stage),
                lm_head=g == last,
            )
        )
    return specs


def build_chunk(spec: ChunkSpec, config, tensors) -> nn.Module:
    """The model part of one chunk, with its weights loaded from the checkpoint tensors."""
    from harness.trainer.models import build_model, load_weights

    part = build_model(
        config,
        layers=range(spec.start, spec.end),
        embedding=spec.embedding,
        final_norm=spec.final_norm,
        lm_head=spec.lm_head,
    )
    load_weights(part, tensors)
    return part


def build_stages(parts: list[tuple[ChunkSpec, nn.Module]], n_chunks: int, device: torch.device,
                 pp_group) -> list:
    """One PipelineStage per local chunk (shapes inferred from the first microbatch)."""
    from torch.distributed.pipelining import PipelineStage

    return [
        PipelineStage(module, spec.index, n_chunks, device, group=pp_group)
        for spec, module in parts
    ]
