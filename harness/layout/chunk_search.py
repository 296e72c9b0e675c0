"""Choose a chunk layout: the sizes of the pp x vpp chunks, their order and their owners, for the
least simulated step time (step_model), every stage's modelled peak within a memory budget.

Orders. A chunk order is the stage of each chunk in data-flow order; every stage owns vpp chunks.
Renaming stages changes nothing the model sees, so only orders whose stages first appear as
0, 1, 2, ... are searched. Each order runs the schedule the trainer picks for it (schedules.py:
Interleaved1F1B for round-robin, ZBVZeroBubble for V-shaped, GPipe for any other order), or the
one asked for where it fits.

Exact search. When the orders times the compositions of the layers into chunks (zero-layer
chunks allowed beyond vpp = 1) are at most EXHAUSTIVE_LIMIT layouts, every one is simulated: the
answer is the optimum of the model.

Local search, beyond that. Orders: round-robin and V-shaped (and every order while there are at
most HEURISTIC_ORDERS). Starts: the uniform sizes and the sizes that minimize the costliest chunk
(solver.balance_stages over the chunks). Moves: one layer from a chunk to another (the chunks
between keep their sizes and shift by one), taken as soon as one improves (overflow of the
budget, then step time); the moves from the costliest chunks and the most loaded stages are
tried first, and at most MOVE_LIMIT moves are tried per layout. It stops at a layout none of its
moves improves, or after EVALUATION_LIMIT simulations (deterministic: no clock is read).
tests/layout/test_chunk_search.py measures its gap to the exact search on random small cases:
STATED_GAP bounds it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from math import comb, factorial
from typing import Iterator

from .errors import PP_FLAG, VPP_FLAG, LayoutError
from .schedules import (SCHEDULES_FOR_KIND, SIMULATED, V_SHAPE, chunk_order_kind)
from .solver import balance_stages
from .step_model import Evaluation, StepModel

EXHAUSTIVE_LIMIT = 6000
HEURISTIC_ORDERS = 15
EVALUATION_LIMIT = 450
MOVE_LIMIT = 160
# The largest step-time ratio local search / exact search measured by the tests; they fail above it.
STATED_GAP = 1.05


@dataclass(frozen=True)
class SearchResult:
    best: Evaluation | None  # None: no layout fits the budget
    tightest: Evaluation  # the layout with the lowest modelled peak found (what a refusal names)
    evaluated: tuple[Evaluation, ...]
    exhaustive: bool

    def front(self) -> list[Evaluation]:
        """Step time / peak memory Pareto front of everything evaluated, fastest first."""
        front: list[Evaluation] = []
        for e in sorted(self.evaluated, key=lambda e: (e.step_time, e.max_peak)):
            if not front or e.max_peak < front[-1].max_peak:
                front.append(e)
        return front


def search_chunks(model: StepModel, vpp: int, schedule: str | None = None,
                  budget: float | None = None, exhaustive: bool | None = None) -> SearchResult:
    """`budget`: bytes per stage, or None; `exhaustive`: None decides by EXHAUSTIVE_LIMIT."""
    pp, n = model.pp, model.costs.num_layers
    k = pp * vpp
    minimum = 1 if vpp == 1 else 0
    if n < minimum * k:
        raise LayoutError(f"the model has {n} layers, but {PP_FLAG} {pp} needs one per stage; "
                          f"expected at least {k} layers")
    orders = list(canonical_orders(pp, vpp))
    count = len(orders) * comb(n - minimum * k + k - 1, k - 1)
    if exhaustive is None:
        exhaustive = count <= EXHAUSTIVE_LIMIT
    if not exhaustive and len(orders) > HEURISTIC_ORDERS:
        orders = [o for o in orders if chunk_order_kind(o, pp) != "custom"] or orders[:1]
    plans = _plans(model, orders, vpp, schedule)
    seen: dict[tuple, Evaluation] = {}

    def key(e: Evaluation) -> tuple:
        overflow = max(0.0, e.max_peak - budget) if budget is not None and e.peaks else 0.0
        return (overflow, e.step_time, e.max_peak)

    def evaluate(sizes: tuple[int, ...], stages: tuple[int, ...], name: str) -> Evaluation:
        found = seen.get((sizes, stages, name))
        if found is None:
            found = seen[(sizes, stages, name)] = model.evaluate(sizes, stages, name)
        return found

    if exhaustive:
        for stages, name in plans:
            for sizes in compositions(n, k, minimum):
                evaluate(sizes, stages, name)
    else:
        for stages, name in plans:
            for start in _starts(model, k, minimum):
                _descend(model, start, stages, name, evaluate, key, minimum,
                         lambda: len(seen) >= EVALUATION_LIMIT)
    evaluated = tuple(seen.values())
    best = min(evaluated, key=key)
    fits = budget is None or not best.peaks or best.max_peak <= budget
    tightest = min(evaluated, key=lambda e: (e.max_peak, e.step_time))
    return SearchResult(best if fits else None, tightest, evaluated, exhaustive)


def canonical_orders(pp: int, vpp: int) -> Iterator[tuple[int, ...]]:
    """Chunk orders with every stage owning vpp chunks, stages first appearing as 0, 1, ...;
    round-robin first, then V-shaped, then the rest in lexicographic order."""
    k = pp * vpp
    if vpp == 1:
        yield tuple(range(pp))
        return
    firsts = [tuple(g % pp for g in range(k))]
    if vpp == 2:
        firsts.append(tuple(range(pp)) + tuple(range(pp - 1, -1, -1)))
    yield from firsts
    if order_count(pp, vpp) > 10 ** 5:  # far too many to list: only the regular orders
        return
    for order in _sequences([vpp] * pp, []):
        if order not in firsts:
            yield order


def order_count(pp: int, vpp: int) -> int:
    """How many canonical orders there are: (pp vpp)! / (vpp!^pp pp!)."""
    return factorial(pp * vpp) // (factorial(vpp) ** pp * factorial(pp))


def _sequences(left: list[int], prefix: list[int]) -> Iterator[tuple[int, ...]]:
    if not any(left):
        yield tuple(prefix)
        return
    opened = max(prefix, default=-1)
    for s in range(min(opened + 2, len(left))):
        if left[s]:
            left[s] -= 1
            prefix.append(s)
            yield from _sequences(left, prefix)
            prefix.pop()
            left[s] += 1


def compositions(n: int, k: int, minimum: int) -> Iterator[tuple[int, ...]]:
    """Every way to write n as k ordered parts, each >= minimum."""
    spare = n - minimum * k
    for cuts in itertools.combinations(range(spare + k - 1), k - 1):
        bounds = (-1, *cuts, spare + k - 1)
        yield tuple(b - a - 1 + minimum for a, b in zip(bounds, bounds[1:]))


def _plans(model: StepModel, orders, vpp: int, schedule: str | None) -> list[tuple[tuple[int, ...], str]]:
    plans, refused = [], []
    for stages in orders:
        fitting = SCHEDULES_FOR_KIND[chunk_order_kind(stages, model.pp)]
        if schedule is None:
            name = fitting[0]
        else:
            matches = [s for s in fitting if s.lower() == schedule.lower()]
            if not matches:
                continue
            name = matches[0]
        if name not in SIMULATED:
            refused.append(f"{name} (not simulated)")
            continue
        why = model.runs(name, len(stages))
        if why:
            refused.append(f"{name} needs {why}")
            continue
        plans.append((stages, name))
    if not plans:
        asked = f"--schedule {schedule}" if schedule else "the default schedules"
        detail = "; ".join(dict.fromkeys(refused)) or "it fits no chunk order of this shape"
        raise LayoutError(f"{asked} cannot run {PP_FLAG} {model.pp} x {VPP_FLAG} {vpp} with "
                          f"{model.microbatches} microbatches: {detail}; expected a schedule that "
                          f"fits (round-robin: {', '.join(SCHEDULES_FOR_KIND['round-robin'])}; "
                          f"V-shaped: {', '.join(SCHEDULES_FOR_KIND[V_SHAPE])})")
    return plans


def _starts(model: StepModel, k: int, minimum: int) -> list[tuple[int, ...]]:
    n = model.costs.num_layers
    base, extra = divmod(n, k)
    starts = [tuple(base + (g < extra) for g in range(k))]
    if n >= k:
        totals = model.costs.totals()
        balanced = balance_stages(totals.layers, k, totals.embedding, totals.lm_head)
        if balanced not in starts:
            starts.append(tuple(balanced))
    return [s for s in starts if min(s) >= minimum]


def _descend(model, sizes, stages, name, evaluate, key, minimum, exhausted) -> None:
    current = evaluate(sizes, stages, name)
    while not exhausted():
        for moved in _moves(current, model.chunk_costs(current.sizes), minimum):
            if exhausted():
                return
            candidate = evaluate(moved, stages, name)
            if key(candidate) < key(current):
                current = candidate
                break
        else:
            return


def _moves(current: Evaluation, chunk_cost: list[float], minimum: int) -> Iterator[tuple[int, ...]]:
    """One layer from chunk i to chunk j: from the most loaded stages' costliest chunks to the
    least loaded stages' cheapest ones first, at most MOVE_LIMIT."""
    sizes = list(current.sizes)
    k = len(sizes)
    load = [0.0] * (max(current.stages) + 1)
    for s, c in zip(current.stages, chunk_cost):
        load[s] += c
    sources = sorted(range(k), key=lambda g: (-load[current.stages[g]], -chunk_cost[g], g))
    targets = sorted(range(k), key=lambda g: (load[current.stages[g]], chunk_cost[g], g))
    tried = 0
    for i in sources:
        if sizes[i] <= minimum:
            continue
        for j in targets:
            if j == i:
                continue
            moved = sizes.copy()
            moved[i] -= 1
            moved[j] += 1
            yield tuple(moved)
            tried += 1
            if tried >= MOVE_LIMIT:
                return
