"""Which pipeline schedules fit which chunk layouts, and building them.

A layout's chunks have a global order (the order data flows through the model); chunk g is
torch.distributed.pipelining's *stage index* g, and the layout stage that holds it is the pp rank
that runs it. torch's schedules assume a fixed chunk-to-rank mapping, so the mapping decides:

| chunk order (`kind`) | mapping | schedules (first = default) |
| --- | --- | --- |
| `sequential` | one chunk per stage, chunk g on stage g | 1F1B, GPipe |
| `round-robin` | vpp > 1, chunk g on stage g % pp | Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, GPipe |
| `v-shape` | vpp = 2, stages 0..pp-1 then pp-1..0 | ZBVZeroBubble, DualPipeV, GPipe |
| `custom` | any other order of a chunk layout | GPipe |

`GPipe` on a multi-chunk layout is not torch's single-stage ScheduleGPipe but an explicit
action list run by torch's `_PipelineScheduleRuntime` (the same runtime as Interleaved1F1B):
every forward in (microbatch, chunk) order, then every backward in (microbatch, reverse chunk)
order, each rank keeping its own chunks' actions in that global order. Any per-rank restriction of
one global topological order cannot deadlock, so this runs every chunk order the layout engine
accepts. It holds all microbatches' activations, like GPipe.

Microbatch-count rules torch enforces (checked here, before any model is built): 1F1B needs at
least pp microbatches, DualPipeV at least 2 * pp; Interleaved1F1B and InterleavedZeroBubble need
the microbatches to be a multiple of max(1, microbatches // pp).
"""

from __future__ import annotations

from typing import Sequence

# The table and the classification live in the layout package (torch-free), where the layout
# search reads them too: one source for which schedule a chunk order gets.
from harness.layout.schedules import (CUSTOM, ROUND_ROBIN, SCHEDULES_FOR_KIND, SEQUENTIAL, V_SHAPE,
                                      chunk_order_kind, microbatch_rule, rank_orders)

_KIND_TEXT = {
    SEQUENTIAL: "one chunk per stage",
    ROUND_ROBIN: "round-robin chunks (chunk g on stage g % pp)",
    V_SHAPE: "V-shaped chunks (stages 0..pp-1 then pp-1..0, two per stage)",
    CUSTOM: "a custom chunk order",
}


class ScheduleError(ValueError):
    """A pipeline schedule that cannot run the layout (refused before any model is built)."""


def describe_fits() -> str:
    return "; ".join(
        f"{_KIND_TEXT[kind]}: {', '.join(names)}" for kind, names in SCHEDULES_FOR_KIND.items()
    )


def select_schedule(
    chunk_stages: Sequence[int], pp: int, requested: str | None, microbatches: int
) -> tuple[str, str]:
    """(kind, schedule name) for a layout, or ScheduleError naming what fits.

    `microbatches` is the number of microbatches each pipeline runs per step (per DP rank).
    """
    kind = chunk_order_kind(chunk_stages, pp)
    fitting = SCHEDULES_FOR_KIND[kind]
    if requested is None:
        name = fitting[0]
    else:
        matches = [s for s in fitting if s.lower() == requested.lower()]
        if not matches:
            raise ScheduleError(
                f"--pipeline_schedule={requested} cannot run this layout ({_KIND_TEXT[kind]}, "
                f"chunk stages {list(chunk_stages)}); it fits: {', '.join(fitting)}. "
                f"Layouts and schedules that fit: {describe_fits()}"
            )
        name = matches[0]
    check_microbatches(name, kind, pp, len(chunk_stages), microbatches)
    return kind, name


def check_microbatches(name: str, kind: str, pp: int, n_chunks: int, microbatches: int) -> None:
    rule = microbatch_rule(name, pp, n_chunks, microbatches)
    if rule is not None:
        raise ScheduleError(
            f"pipeline schedule {name} needs {rule}, but each pipeline runs {microbatches} "
            f"microbatches per step (--total_batch_size / (--batch_size * --sequence_length * "
            f"data-parallel size)); raise --total_batch_size or pick another schedule"
        )


def gpipe_actions(chunk_stages: Sequence[int], pp: int, microbatches: int):
    """Compute-only action lists per pp rank: GPipe order over any chunk-to-stage mapping."""
    from torch.distributed.pipelining.schedules import _Action, _ComputationType

    kinds = {"F": _ComputationType.FORWARD, "B": _ComputationType.FULL_BACKWARD}
    return {rank: [_Action(a.chunk, kinds[a.kind], a.microbatch) for a in order]
            for rank, order in enumerate(rank_orders("GPipe", chunk_stages, pp, microbatches))}


def build_schedule(name: str, kind: str, stages: list, chunk_stages: Sequence[int], pp: int,
                   microbatches: int, loss_fn):
    """The torch schedule object for this rank's PipelineStages (scale_grads=True: the loss_fn
    is a per-microbatch mean, torch divides the summed gradients by the microbatch count)."""
    from torch.distributed.pipelining import schedules as S

    if kind == SEQUENTIAL:
        cls = S.get_schedule_class(name)
        assert len(stages) == 1
        return cls(stages[0], n_microbatches=microbatches, loss_fn=loss_fn, scale_grads=True)
    if name == "GPipe":
        schedule = S._PipelineScheduleRuntime(
            stages, n_microbatches=microbatches, loss_fn=loss_fn, scale_grads=True
        )
        schedule._prepare_schedule_with_comms(gpipe_actions(chunk_stages, pp, microbatches))
        return schedule
    cls = S.get_schedule_class(name)
    return cls(stages, n_microbatches=microbatches, loss_fn=loss_fn, scale_grads=True)
