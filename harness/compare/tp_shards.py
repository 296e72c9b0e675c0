"""Which part of the single-device reference an un-gathered tensor-parallel gradient file holds.

Under tensor parallelism (TP) InfiniTrain's TP ranks all write into one dump folder without
gathering: a parameter TP does not shard (layer norms, row-parallel biases, wpe) is whole on
every rank and its file compares with the reference as it is; a sharded parameter's file holds
the slice of ONE TP rank, and which rank won the race to write it varies from run to run. So
`match_shard` tries every slice the file's shape allows and keeps the one closest to the
reference:

- "slice": TP rank r's contiguous part r*R/tp:(r+1)*R/tp of the reference along the one dim d
  whose size differs (column-parallel rows, row-parallel weight columns);
- "grouped": part r of each row group, stacked (the fused attn.c_attn [q_r | k_r | v_r]; the
  groups are given, e.g. LLaMA 3 GQA's (C, kv*hd, kv*hd), or three equal ones);
- "padded": rows r*Vp/tp:(r+1)*Vp/tp of the padded vocabulary Vp = tp * rows, of which only
  those below the reference's V exist there (the rest are counted, not compared).

Plain numpy, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

KINDS = ("slice", "grouped", "padded")


@dataclass(frozen=True, eq=False)  # eq=False: the fields hold arrays
class ShardMatch:
    kind: str  # "slice" / "grouped" / "padded"
    dim: int  # the dim TP cuts
    rank: int  # the TP rank whose slice the file holds
    parts: int  # tp
    groups: tuple[int, ...] | None  # "grouped": the reference's group sizes along dim
    padding: int  # rows of the file not compared (past the reference's vocabulary)
    total: int  # reference.shape[dim]
    start: int  # "slice" / "padded": the first index along dim (padded coordinates)
    stop: int  # ... and one past the last (padded coordinates: may pass total)
    reference: np.ndarray  # the reference's view, the shape of `compared`
    compared: np.ndarray  # the part of the file compared: all of it, or the non-padding rows
    error: float  # ||compared - reference|| / ||reference|| (what chose this candidate)

    def describe(self) -> str:
        what = _axis(self.dim)
        who = f"(TP rank {self.rank} of {self.parts})"
        if self.kind == "grouped":
            names = "q/k/v" if len(self.groups) == 3 else "groups " + "/".join(
                str(g) for g in self.groups)
            return f"{names} {what} part {self.rank} of {self.parts} {who}"
        text = f"{what} {self.start}:{self.stop} of {self.total}"
        if self.padding:
            text += f" + {self.padding} padding {what}"
        return f"{text} {who}"


def _axis(dim: int) -> str:
    return {0: "rows", 1: "columns"}.get(dim, f"dim-{dim} indices")


def _relative(compared: np.ndarray, reference: np.ndarray) -> float:
    """||compared - reference|| / ||reference|| in float64; 0 / 0 is 0, x / 0 is inf, and a
    non-finite file is inf (never chosen over a finite candidate)."""
    got = np.asarray(compared, np.float64).ravel()
    ref = np.asarray(reference, np.float64).ravel()
    with np.errstate(over="ignore", invalid="ignore"):
        diff = float(np.linalg.norm(got - ref))
        norm = float(np.linalg.norm(ref))
    if not math.isfinite(diff):
        return math.inf
    if norm == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / norm


def _take(array: np.ndarray, dim: int, start: int, stop: int) -> np.ndarray:
    index = [slice(None)] * array.ndim
    index[dim] = slice(start, stop)
    return array[tuple(index)]


def _group_sizes(total: int, tp: int, groups: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """The groups along a dim of `total`: the given ones when they fit (sum to total, each a
    multiple of tp), else three equal ones when those fit; None when none do."""
    if groups is not None:
        groups = tuple(int(g) for g in groups)
        fits = sum(groups) == total and all(g > 0 and g % tp == 0 for g in groups)
        return groups if fits else None
    if total % 3 == 0 and (total // 3) % tp == 0:  # total > 0: match_shard's n * tp, n >= 1
        return (total // 3,) * 3
    return None


def match_shard(dumped: np.ndarray, reference: np.ndarray, tp: int,
                groups: tuple[int, ...] | None = None) -> ShardMatch | None:
    """The TP slice of `reference` that `dumped` holds, or None when no candidate fits the
    shapes (a different number of dims, more than one dim differing, equal shapes, sizes no
    slicing of tp parts explains).

    Every candidate the shapes allow is scored by ||dumped - ref_slice|| / ||ref_slice|| and the
    smallest wins (ties: the lowest rank, then slice before grouped before padded). Why the
    best candidate is a sound verdict, and where it is blind:
    - a correct shard matches its own slice to rounding, so a correct run always passes;
    - a bug that affects every rank (a wrong scale, a missing all-reduce, another parameter's
      values) moves every candidate away from the file, so the best one still fails;
    - a bug on ONE rank whose shard was not the one written to the file cannot be seen: the
      file is another rank's correct slice and passes. Only gathering the shards (or a dump
      per rank) would close that gap; it is the known limit of an un-gathered dump.
    - for the same reason a bug that hands rank r another rank's correct slice (shards
      permuted across ranks) passes: the file is some rank's correct slice.
    Choosing the best of several candidates hides nothing else: a file that is no rank's
    correct slice is off for every candidate, the best included.
    """
    if tp < 1:
        raise ValueError(f"tp must be >= 1, not {tp}")
    dumped, reference = np.asarray(dumped), np.asarray(reference)
    if dumped.ndim != reference.ndim:
        return None
    differ = [d for d in range(dumped.ndim) if dumped.shape[d] != reference.shape[d]]
    if len(differ) != 1:
        return None
    dim = differ[0]
    n, total = dumped.shape[dim], reference.shape[dim]
    candidates: list[ShardMatch] = []

    def add(kind, rank, ref_view, compared, start=0, stop=0, padding=0, sizes=None):
        candidates.append(ShardMatch(
            kind=kind, dim=dim, rank=rank, parts=tp, groups=sizes, padding=padding, total=total,
            start=start, stop=stop, reference=ref_view, compared=compared,
            error=_relative(compared, ref_view)))

    if n * tp == total:
        for r in range(tp):
            add("slice", r, _take(reference, dim, r * n, (r + 1) * n), dumped, r * n, (r + 1) * n)
        sizes = _group_sizes(total, tp, groups)
        if sizes is not None:
            for r in range(tp):
                pieces, offset = [], 0
                for g in sizes:
                    part = g // tp
                    pieces.append(_take(reference, dim, offset + r * part, offset + (r + 1) * part))
                    offset += g
                add("grouped", r, np.concatenate(pieces, axis=dim), dumped, sizes=sizes)
    elif n * tp > total > n * tp - n:  # the padded vocabulary Vp = n * tp > V = total
        for r in range(tp):
            start, stop = r * n, (r + 1) * n
            keep = min(stop, total) - start  # > 0: only the last rank reaches past total
            add("padded", r, _take(reference, dim, start, start + keep),
                _take(dumped, dim, 0, keep), start, stop, padding=n - keep)
    if not candidates:
        return None
    return min(candidates, key=lambda c: (c.error, c.rank, KINDS.index(c.kind)))


def fused_qkv_groups(weight_shape: tuple[int, ...]) -> tuple[int, int, int] | None:
    """The [q; k; v] row groups of a fused attn.c_attn weight of (rows, C): q has C = n_head *
    head_dim rows, k and v (rows - C) / 2 each (GPT-2: C, C, C; LLaMA 3 GQA: C, kv*hd, kv*hd).
    None when the shape cannot be one."""
    if len(weight_shape) != 2:
        return None
    rows, width = weight_shape
    if rows <= width or (rows - width) % 2:
        return None
    return (width, (rows - width) // 2, (rows - width) // 2)
