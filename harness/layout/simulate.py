"""Step time and in-flight activations of one pipeline step, by simulating the schedule.

Each pp rank runs its compute actions (schedules.rank_orders) one after another, in order; an
action starts when the rank is free and its inputs have arrived:

- F(g, m) needs F(g-1, m) (the activation from the previous chunk);
- B(g, m) and I(g, m) need the gradient from chunk g+1, i.e. B or I (g+1, m), and F(g, m);
- W(g, m) needs I(g, m).

An input from a chunk on another rank arrives `comm` after it was produced (0 by default: on one
host the activations are small next to the layers' compute). Sends never block the sender. The
step time is when the last action ends. This is the model the runtime follows (torch's
`_PipelineScheduleRuntime` posts the receive an action needs right before it and waits on it);
what it leaves out (gloo's send rendezvous, the optimizer step, which is the same for every
layout) is why docs/benchmarks.md checks its ranking against measured step times.

Activations: chunk g's forward on a microbatch keeps act[g] bytes until that microbatch's
backward on g frees them (W for the zero-bubble split). A rank's order fixes its peak in-flight
bytes whatever the timing, so the peak is a walk over the order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .schedules import Action


class ScheduleDeadlock(RuntimeError):
    """The orders wait on each other: a schedule this model cannot run."""


@dataclass(frozen=True)
class Simulation:
    step_time: float
    rank_busy: tuple[float, ...]  # compute time per rank
    rank_end: tuple[float, ...]  # when each rank's last action ends


def simulate(orders: Sequence[Sequence[Action]], chunk_stages: Sequence[int], forward: Sequence[float],
             backward: Sequence[float], comm: float = 0.0, weight_fraction: float = 0.5) -> Simulation:
    """`forward[g]` / `backward[g]`: one microbatch's cost on chunk g; a split backward is I =
    (1 - weight_fraction) x B and W = weight_fraction x B, except on chunk 0: its input is the
    token ids, which take no gradient, so torch's stage skips I there and W runs the whole
    backward (`_PipelineStageBase.backward_one_chunk`, `if not self.is_first`)."""
    last = len(chunk_stages) - 1
    done: dict[tuple, float] = {}  # (chunk, kind, microbatch) -> end time
    pointer = [0] * len(orders)
    clock = [0.0] * len(orders)
    busy = [0.0] * len(orders)
    remaining = sum(len(o) for o in orders)
    split = 1.0 - weight_fraction
    while remaining:
        progressed = False
        for rank, order in enumerate(orders):
            i, t = pointer[rank], clock[rank]
            while i < len(order):
                g, kind, m = order[i]
                if kind == "F":
                    ready = 0.0 if g == 0 else _arrival(done, (g - 1, "F", m), chunk_stages, g - 1, g, comm)
                    cost = forward[g]
                elif kind == "W":
                    ready = done.get((g, "I", m))
                    cost = backward[g] if g == 0 else backward[g] * weight_fraction
                else:
                    own = done.get((g, "F", m))
                    if g == last:
                        ready = own
                    else:
                        grad = _arrival(done, (g + 1, "B", m), chunk_stages, g + 1, g, comm)
                        if grad is None:
                            grad = _arrival(done, (g + 1, "I", m), chunk_stages, g + 1, g, comm)
                        ready = None if own is None or grad is None else max(own, grad)
                    cost = backward[g] if kind == "B" else 0.0 if g == 0 else backward[g] * split
                if ready is None:
                    break
                t = max(t, ready) + cost
                busy[rank] += cost
                done[(g, kind, m)] = t
                i += 1
                remaining -= 1
                progressed = True
            pointer[rank], clock[rank] = i, t
        if not progressed:
            stuck = {r: orders[r][pointer[r]] for r in range(len(orders)) if pointer[r] < len(orders[r])}
            raise ScheduleDeadlock(f"the rank orders wait on each other at {stuck}")
    return Simulation(max(clock) if clock else 0.0, tuple(busy), tuple(clock))


def _arrival(done: dict, key: tuple, chunk_stages: Sequence[int], src: int, dst: int, comm: float):
    end = done.get(key)
    if end is None or chunk_stages[src] == chunk_stages[dst]:
        return end
    return end + comm


def peak_in_flight(order: Sequence[Action], activation: Sequence[float]) -> float:
    """The most activation bytes one rank holds at once under its order."""
    held = peak = 0.0
    for g, kind, _ in order:
        if kind == "F":
            held += activation[g]
            peak = max(peak, held)
        elif kind in ("B", "W"):
            held -= activation[g]
    return peak
