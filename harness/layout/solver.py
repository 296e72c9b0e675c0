"""Exact balancing of layers over pipeline stages: minimize the slowest stage.

Stage s holds a contiguous run of layers, every stage at least one, in order. Its cost is the sum
of its layer costs, plus `embedding_cost` on the first stage and `lm_head_cost` on the last.

Exactness. Every float is a dyadic rational, so scaling all costs by one power of two turns them
into Python integers with no rounding at all; every sum and comparison below is then exact, and
the result is the true optimum of the real-number problem (not of some rounded variant).

Search. Whether a bottleneck T is achievable is decided in O(pp log n) with two greedy sweeps
(see `_plan`). The optimum T* is an integer in [0, total], so a binary search finds it; after
each feasible probe the upper bound drops straight to the slowest stage actually achieved, which
is itself an achievable value, so in practice a few dozen probes suffice. 512 layers on 64
stages take a few milliseconds.

Tie-break. Many partitions can share the optimal slowest stage. We return the one closest to the
uniform split: boundaries are fixed from the first stage on, each one the uniform split's boundary
clamped into the interval of positions that still allow an optimal completion. So equal costs
give exactly the uniform split, an already optimal uniform split is kept, and the answer is
deterministic.
"""

from __future__ import annotations

import math
import numbers
from bisect import bisect_left, bisect_right
from fractions import Fraction
from typing import Sequence

from .errors import COSTS_FLAG, PP_FLAG, LayoutError, check_count


def balance_stages(layer_costs: Sequence[float], pp: int, embedding_cost: float = 0.0,
                   lm_head_cost: float = 0.0) -> tuple[int, ...]:
    """Layer count per stage of the partition minimizing the slowest stage (tie-break: module doc)."""
    check_count(PP_FLAG, pp)
    n = len(layer_costs)
    if n < pp:
        raise LayoutError(f"{COSTS_FLAG} gives {n} layer costs, but {PP_FLAG} is {pp}; "
                          f"every stage needs at least one layer")
    *scaled, e, l = _to_integers([*layer_costs, embedding_cost, lm_head_cost])
    prefix = [0]
    for c in scaled:
        prefix.append(prefix[-1] + c)
    if pp == 1:
        return (n,)
    lo, hi = 0, _slowest(prefix, _plan(prefix, pp, e, l, prefix[-1] + e + l), e, l)
    while lo < hi:
        mid = (lo + hi) // 2
        bounds = _plan(prefix, pp, e, l, mid)
        if bounds is None:
            lo = mid + 1
        else:
            hi = _slowest(prefix, bounds, e, l)
    bounds = _plan(prefix, pp, e, l, hi)
    return tuple(b - a for a, b in zip(bounds, bounds[1:]))


def stage_costs(counts: Sequence[int], layer_costs: Sequence[float], embedding_cost: float = 0.0,
                lm_head_cost: float = 0.0) -> tuple[float, ...]:
    """Each stage's cost, as a correctly rounded exact sum (so comparisons agree with the solver)."""
    costs, start = [], 0
    for s, count in enumerate(counts):
        extras = [embedding_cost] * (s == 0) + [lm_head_cost] * (s == len(counts) - 1)
        costs.append(math.fsum([*layer_costs[start:start + count], *extras]))
        start += count
    return tuple(costs)


def _to_integers(values: Sequence[float]) -> list[int]:
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0:
            # Non-negative costs are what makes the greedy sweeps exact; refuse anything else.
            raise LayoutError(f"cost {v!r} is invalid; expected a finite number >= 0 ({COSTS_FLAG})")
    fractions = [Fraction(v) if isinstance(v, int) else Fraction(float(v)) for v in values]
    scale = max(f.denominator for f in fractions)  # all powers of two, so this is their lcm
    return [int(f * scale) for f in fractions]


def _slowest(prefix: list[int], bounds: list[int], e: int, l: int) -> int:
    costs = [prefix[b] - prefix[a] for a, b in zip(bounds, bounds[1:])]
    costs[0] += e
    costs[-1] += l
    return max(costs)


def _plan(prefix: list[int], pp: int, e: int, l: int, limit: int) -> list[int] | None:
    """Stage boundaries with every stage <= limit, placed by the tie-break; None if impossible (pp >= 2).

    `earliest[m]` is the smallest position from which the layers up to the end can form m stages
    within the limit (the last one paying `l`), found by a greedy sweep from the back. A suffix
    that fits in m stages also fits in exactly m as long as it has m layers, because splitting a
    stage never makes a part dearer (costs are non-negative). So, given the previous boundary b,
    the next one may be any q with: the stage [b, q) within the limit, q >= earliest[stages left],
    and q <= n - stages left. That set is an interval; we clamp the uniform boundary into it.
    """
    n = len(prefix) - 1
    earliest = [n]
    for m in range(1, pp):
        budget = limit - (l if m == 1 else 0)
        pos = earliest[-1]
        if pos > 0:
            pos = bisect_left(prefix, prefix[pos] - budget, 0, pos) if budget >= 0 else pos
            if pos == earliest[-1]:
                return None  # not even one layer fits: no stage can end here
        earliest.append(pos)
    bounds = [0]
    base, extra = divmod(n, pp)
    for i in range(pp - 1):
        left = pp - 1 - i
        budget = limit - (e if i == 0 else 0)
        if budget < 0:
            return None
        furthest = bisect_right(prefix, prefix[bounds[-1]] + budget) - 1
        low, high = max(bounds[-1] + 1, earliest[left]), min(furthest, n - left)
        if low > high:
            return None
        target = (i + 1) * base + min(i + 1, extra)
        bounds.append(min(max(target, low), high))
    bounds.append(n)
    return bounds
