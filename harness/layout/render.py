"""The normalized text rendering of a layout, printed by the trainer's main rank at start-up.

    pipeline layout: 8 layers, pp=2, vpp=1 (megatron: Et*5|t*3NL)
      stage 0: chunk 0 [E, layers 0-4 (5)]
      stage 1: chunk 1 [layers 5-7 (3), N, L]

Layer ranges are inclusive here because people read them; the API's ranges are half-open.
"""

from __future__ import annotations


def describe(layout) -> str:
    form = (f"megatron: {layout.to_megatron()}" if layout.is_round_robin()
            else f"chunks: {layout.to_chunk_layout()}")
    lines = [f"pipeline layout: {layout.num_layers} layers, pp={layout.pp}, vpp={layout.vpp} ({form})"]
    last = len(layout.chunks) - 1
    for stage in range(layout.pp):
        parts = [_chunk(g, *layout.chunks[g][1:], first=g == 0, last=g == last)
                 for g in layout.stage_chunks(stage)]
        lines.append(f"  stage {stage}: " + " ".join(parts))
    return "\n".join(lines)


def _chunk(g: int, start: int, end: int, first: bool, last: bool) -> str:
    if end == start:
        items = ["no layers"]
    elif end - start == 1:
        items = [f"layer {start} (1)"]
    else:
        items = [f"layers {start}-{end - 1} ({end - start})"]
    items = ["E"] * first + items + ["N", "L"] * last
    return f"chunk {g} [{', '.join(items)}]"
