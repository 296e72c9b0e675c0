"""The pipeline schedules the trainer runs, torch-free: which fit which chunk order, and the order
of compute actions each pp rank executes.

The trainer (harness/trainer/parallel/schedules.py) imports the table and the classification
from here, so the suggestion tool and the trainer cannot disagree about which schedule a chunk
order gets. The per-rank orders are those of torch.distributed.pipelining 2.13 (its
`_calculate_single_rank_operations` and Schedule1F1B's loop), written again here because
importing torch costs more than a whole layout search; tests/layout/test_schedules.py checks
them against torch's own lists action for action.

An action is (chunk, kind, microbatch): kind F (forward), B (full backward), or, for the
zero-bubble schedules, I (backward for the input) and W (backward for the weights).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

SEQUENTIAL = "sequential"
ROUND_ROBIN = "round-robin"
V_SHAPE = "v-shape"
CUSTOM = "custom"

SCHEDULES_FOR_KIND: dict[str, tuple[str, ...]] = {
    SEQUENTIAL: ("1F1B", "GPipe"),
    ROUND_ROBIN: ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "GPipe"),
    V_SHAPE: ("ZBVZeroBubble", "DualPipeV", "GPipe"),
    CUSTOM: ("GPipe",),
}

# The schedules whose per-rank order is written below (the others are refused by name).
SIMULATED = ("1F1B", "GPipe", "Interleaved1F1B", "LoopedBFS", "ZBVZeroBubble")
# The zero-bubble schedules: each backward is split into an input pass (I) and a weight pass (W).
SPLIT_BACKWARD = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")


class Action(NamedTuple):
    chunk: int
    kind: str  # "F" | "B" | "I" | "W"
    microbatch: int


def chunk_order_kind(chunk_stages: Sequence[int], pp: int) -> str:
    """Classify the stage of each chunk, in global chunk order."""
    stages = list(chunk_stages)
    n = len(stages)
    if n == pp and stages == list(range(pp)):
        return SEQUENTIAL
    if n > pp and n % pp == 0 and stages == [g % pp for g in range(n)]:
        return ROUND_ROBIN
    if n == 2 * pp and stages == list(range(pp)) + list(range(pp - 1, -1, -1)):
        return V_SHAPE
    return CUSTOM


def microbatch_rule(name: str, pp: int, n_chunks: int, microbatches: int) -> str | None:
    """The microbatch-count rule torch enforces for the schedule that `microbatches` breaks, or
    None when it runs."""
    if name == "1F1B" and microbatches < pp:
        return f"at least --pipeline_parallel = {pp} microbatches"
    if name == "DualPipeV" and microbatches < n_chunks:
        return f"at least as many microbatches as chunks ({n_chunks})"
    if name in ("Interleaved1F1B", "InterleavedZeroBubble"):
        rounds = max(1, microbatches // pp)
        if microbatches % rounds:
            return f"a microbatch count that is a multiple of max(1, microbatches // pp) = {rounds}"
    return None


def rank_orders(name: str, chunk_stages: Sequence[int], pp: int, microbatches: int) -> list[list[Action]]:
    """Each pp rank's compute actions, in the order it runs them."""
    stages = list(chunk_stages)
    n = len(stages)
    if name == "GPipe":
        return _gpipe(stages, pp, microbatches)
    kind = chunk_order_kind(stages, pp)
    if name not in SCHEDULES_FOR_KIND[kind]:
        raise ValueError(f"schedule {name} does not run a {kind} chunk order {stages}")
    if name == "1F1B":
        return [_one_f_one_b(r, pp, microbatches) for r in range(pp)]
    vpp = n // pp
    if name == "Interleaved1F1B":
        return [_interleaved(r, pp, vpp, microbatches) for r in range(pp)]
    if name == "LoopedBFS":
        return [_looped_bfs(r, pp, vpp, microbatches) for r in range(pp)]
    if name == "ZBVZeroBubble":
        return [_zbv(r, pp, microbatches) for r in range(pp)]
    raise ValueError(f"schedule {name} is not simulated; simulated: {', '.join(SIMULATED)}")


def _gpipe(stages: list[int], pp: int, m: int) -> list[list[Action]]:
    # Every forward in (microbatch, chunk) order, then every backward in (microbatch, reverse
    # chunk) order, each rank keeping its own chunks' actions (schedules.gpipe_actions). With one
    # chunk per stage that is torch's ScheduleGPipe.
    orders: list[list[Action]] = [[] for _ in range(pp)]
    n = len(stages)
    for mb in range(m):
        for g in range(n):
            orders[stages[g]].append(Action(g, "F", mb))
    for mb in range(m):
        for g in reversed(range(n)):
            orders[stages[g]].append(Action(g, "B", mb))
    return orders


def _one_f_one_b(rank: int, pp: int, m: int) -> list[Action]:
    # Schedule1F1B: pp - rank warm-up forwards, then backward / forward pairs, then backwards.
    warmup = min(m, pp - rank)
    ops = [Action(rank, "F", mb) for mb in range(warmup)]
    forward, backward = warmup, 0
    while backward < m:
        ops.append(Action(rank, "B", backward))
        backward += 1
        if forward < m:
            ops.append(Action(rank, "F", forward))
            forward += 1
    return ops


def _interleaved(rank: int, pp: int, vpp: int, m: int) -> list[Action]:
    rounds = max(1, m // pp)
    per_round = m // rounds
    warmup = min((vpp - 1) * per_round + 2 * (pp - 1 - rank), m * vpp)
    total = m * vpp
    forward_next = [0] * (pp * vpp)
    backward_next = [0] * (pp * vpp)
    ops: list[Action] = []

    def forward(step: int) -> None:
        g = ((step // per_round) % vpp) * pp + rank
        ops.append(Action(g, "F", forward_next[g]))
        forward_next[g] += 1

    def backward(step: int) -> None:
        g = (vpp - 1 - ((step - warmup) // per_round) % vpp) * pp + rank
        ops.append(Action(g, "B", backward_next[g]))
        backward_next[g] += 1

    for op in range(total + warmup):
        if op < warmup:
            forward(op)
        elif op < total:
            forward(op)
            backward(op)
        else:
            backward(op)
    return ops


def _looped_bfs(rank: int, pp: int, vpp: int, m: int) -> list[Action]:
    local = range(rank, pp * vpp, pp)
    ops = [Action(g, "F", mb) for g in local for mb in range(m)]
    ops += [Action(g, "B", mb) for g in reversed(local) for mb in reversed(range(m))]
    return ops


def _zbv(rank: int, pp: int, m: int) -> list[Action]:
    n_micro = max(2 * pp - 1, m)
    first, second = rank, 2 * pp - 1 - rank
    count = {"f0": 0, "f1": 0, "b0": 0, "b1": 0}
    ops: list[Action] = []

    def add(g: int, kind: str, key: str, mb: int | None = None) -> None:
        ops.append(Action(g, kind, count[key] if mb is None else mb))
        if mb is None:
            count[key] += 1

    for _ in range(2 * (pp - rank) - 1):
        add(first, "F", "f0")
    for _ in range(rank):
        add(second, "F", "f1")
        add(first, "F", "f0")
    for _ in range(pp - rank):
        add(second, "F", "f1")
        add(second, "I", "b1", count["b1"])
        add(second, "W", "b1")
    while count["f1"] < count["f0"] or count["f0"] < n_micro:
        if count["f0"] < n_micro:
            add(first, "F", "f0")
        add(first, "I", "b0", count["b0"])
        add(first, "W", "b0")
        add(second, "F", "f1")
        add(second, "I", "b1", count["b1"])
        add(second, "W", "b1")
    w0, w1 = count["b0"], count["b1"]
    for _ in range(rank):
        add(first, "I", "b0")
        add(second, "I", "b1")
    for _ in range(pp - rank):
        add(first, "I", "b0")
        ops.append(Action(first, "W", w0))
        w0 += 1
    while w1 < count["b1"]:
        ops.append(Action(second, "W", w1))
        w1 += 1
    while w0 < count["b0"]:
        ops.append(Action(first, "W", w0))
        w0 += 1
    # Like torch: the order is built for max(2 pp - 1, m) microbatches, the extra ones dropped.
    return [a for a in ops if a.microbatch < m]
