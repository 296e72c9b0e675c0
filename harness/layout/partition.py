"""Parsers for the two integer-list flags: --pipeline_layer_partition and --pipeline_chunk_layout."""

from __future__ import annotations

from typing import Sequence

from .errors import (CHUNK_LAYOUT_FLAG, PARTITION_FLAG, PP_FLAG, LayoutError, check_count,
                     flag_value, parse_int, split_entries)

PARTITION_EXPECTED = "one positive layer count per stage, e.g. '4,8,6,6'"
CHUNK_EXPECTED = "comma-separated STAGE:LAYERS chunks in data-flow order, e.g. '0:3,1:3,1:3,0:3'"


def parse_partition(num_layers: int, partition: str | Sequence[int], pp: int | None = None) -> list[int]:
    """Layer count per stage; `pp`, when given, must match the number of entries."""
    check_count("num_layers", num_layers)
    if isinstance(partition, str):
        text = partition
        entries = split_entries(PARTITION_FLAG, text, PARTITION_EXPECTED)
        counts = [parse_int(PARTITION_FLAG, text, e, PARTITION_EXPECTED, minimum=1) for e in entries]
    else:
        counts = list(partition)
        text = ",".join(map(str, counts))
        if not counts:
            raise LayoutError(f"{flag_value(PARTITION_FLAG, text)} is empty; expected {PARTITION_EXPECTED}")
        for c in counts:
            if isinstance(c, bool) or not isinstance(c, int) or c < 1:
                raise LayoutError(f"{flag_value(PARTITION_FLAG, text)}: entry {c!r} is not a positive "
                                  f"integer; expected {PARTITION_EXPECTED}")
    if pp is not None:
        check_count(PP_FLAG, pp)
        if len(counts) != pp:
            raise LayoutError(f"{flag_value(PARTITION_FLAG, text)}: pipeline layer partition has {len(counts)} entries, "
                              f"but {PP_FLAG} is {pp}; expected one layer count per stage")
    if sum(counts) != num_layers:
        raise LayoutError(f"{flag_value(PARTITION_FLAG, text)}: pipeline layer partition sums to {sum(counts)} "
                          f"layers, but the model has {num_layers} layers; expected entries summing to {num_layers}")
    return counts


def parse_chunk_layout(num_layers: int, pp: int, text: str) -> list[tuple[int, int]]:
    """(stage, layer count) per chunk in global order; every stage owns the same number of chunks."""
    check_count("num_layers", num_layers)
    check_count(PP_FLAG, pp)
    chunks = [_parse_chunk(text, entry, pp) for entry in split_entries(CHUNK_LAYOUT_FLAG, text, CHUNK_EXPECTED)]
    per_stage = [0] * pp
    for stage, _ in chunks:
        per_stage[stage] += 1
    missing = [s for s, n in enumerate(per_stage) if n == 0]
    if missing:
        raise LayoutError(f"{flag_value(CHUNK_LAYOUT_FLAG, text)} has no chunk on stage "
                          f"{', '.join(map(str, missing))}; with {PP_FLAG} {pp} every stage 0..{pp - 1} "
                          f"must own chunks")
    if len(set(per_stage)) != 1:
        owned = ", ".join(f"stage {s}: {n}" for s, n in enumerate(per_stage))
        raise LayoutError(f"{flag_value(CHUNK_LAYOUT_FLAG, text)} gives stages unequal chunk counts "
                          f"({owned}); every stage must own the same number of chunks (that number is vpp)")
    total = sum(n for _, n in chunks)
    if total != num_layers:
        raise LayoutError(f"{flag_value(CHUNK_LAYOUT_FLAG, text)} holds {total} layers, "
                          f"but the model has {num_layers} layers; expected layer counts summing to {num_layers}")
    return chunks


def _parse_chunk(text: str, entry: str, pp: int) -> tuple[int, int]:
    parts = entry.split(":")
    if len(parts) != 2 or not all(p.strip() for p in parts):
        raise LayoutError(f"{flag_value(CHUNK_LAYOUT_FLAG, text)}: chunk {entry!r} is malformed; "
                          f"expected {CHUNK_EXPECTED}")
    stage = parse_int(CHUNK_LAYOUT_FLAG, text, parts[0].strip(), f"a stage number, {CHUNK_EXPECTED}", minimum=0)
    layers = parse_int(CHUNK_LAYOUT_FLAG, text, parts[1].strip(), f"a layer count >= 0, {CHUNK_EXPECTED}", minimum=0)
    if stage >= pp:
        raise LayoutError(f"{flag_value(CHUNK_LAYOUT_FLAG, text)}: chunk {entry!r} names stage {stage}, "
                          f"but {PP_FLAG} is {pp} (stages 0..{pp - 1})")
    return stage, layers
