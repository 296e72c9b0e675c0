"""The exact layer-balancing solver against two published baselines, and brute force.

    python benchmarks/solver_speed.py [--quick]

Problem: split n layers (costs c_i) into pp contiguous, non-empty stages; stage cost = its layers'
sum, + E on the first stage, + L on the last; minimize the slowest stage (it paces the pipeline).

Solvers compared, each on the same seeded random costs:

- ours: `harness.layout.balance_stages` (exact integer arithmetic, binary search on the
  bottleneck with O(pp log n) greedy probes);
- DP: the O(pp * n^2) dynamic program InfiniTrain describes,
  best[s][end] = min over start of max(best[s-1][start], cost(start..end) + E if first + L if last),
  in float64, written here from that description; the loop over `start` is vectorized with numpy
  (a pure-Python inner loop would be ~50x slower still);
- max-min: the balancing DeepSpeed's `partition_balanced` describes since its 2023 rewrite (the
  "linear partition problem" DP over (items, parts) whose state keeps the running max and min part
  sum of its path and minimizes max - min), written here from that description, numpy-vectorized
  the same way. E and L are folded into the first and last layer's weight (those layers always
  sit on the first / last stage, so this is exact);
- brute force: every composition of n into pp parts, exact integers, where there are at most
  200,000 of them.

"slowest / opt" is each answer's slowest stage divided by the true optimum, computed exactly
(Fractions): 1 means optimal. The optimum is brute force where it ran, else ours (exact by
construction and by the property tests; brute force agrees wherever both ran).

Then the chunk-layout search for vpp > 1 (`harness.layout.chunk_search`): seconds per search at
sizes up to 64 layers on pp 8 x vpp 4 (the issue's bound: under 1 s) and beyond, and the local
search's gap to the exact one on random small problems, with and without a memory budget.
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import time
from fractions import Fraction
from math import comb

import numpy as np
from tabulate import tabulate

from bench_common import header, median
from harness.layout import LayerCosts, balance_stages
from harness.layout.chunk_search import search_chunks
from harness.layout.step_model import StepCosts, StepModel

SIZES = [(8, 2), (12, 4), (16, 4), (24, 6), (64, 8), (128, 16), (256, 32), (512, 8), (512, 64),
         (1024, 16), (1024, 64)]
KINDS = ("integers", "decimals", "spread")
BRUTE_LIMIT = 200_000


def make_costs(kind: str, n: int, rng: random.Random) -> list[float]:
    if kind == "integers":
        return [float(rng.randint(1, 9)) for _ in range(n)]
    if kind == "decimals":
        return [round(rng.uniform(0.5, 3.0), 3) for _ in range(n)]
    return [10 ** rng.uniform(-6, 6) for _ in range(n)]


# -- exact evaluation ------------------------------------------------------------------------
def exact_slowest(counts, costs, e, l) -> Fraction:
    stages, start = [], 0
    for s, count in enumerate(counts):
        total = sum((Fraction(c) for c in costs[start:start + count]), Fraction(0))
        total += Fraction(e) * (s == 0) + Fraction(l) * (s == len(counts) - 1)
        stages.append(total)
        start += count
    return max(stages)


def brute_force(costs, pp, e, l) -> tuple[int, ...]:
    fr = [Fraction(c) for c in [*costs, e, l]]
    scale = max(f.denominator for f in fr)
    *ints, ie, il = [int(f * scale) for f in fr]
    prefix = list(itertools.accumulate(ints, initial=0))
    n = len(costs)
    best, best_bounds = None, None
    for cut in itertools.combinations(range(1, n), pp - 1):
        bounds = (0, *cut, n)
        slowest = max(prefix[b] - prefix[a] for a, b in zip(bounds, bounds[1:]))
        slowest = max(slowest, prefix[bounds[1]] + ie, prefix[n] - prefix[bounds[-2]] + il)
        if best is None or slowest < best:
            best, best_bounds = slowest, bounds
    return tuple(b - a for a, b in zip(best_bounds, best_bounds[1:]))


# -- baselines, from their published descriptions --------------------------------------------
def infinitrain_dp(costs, pp, e, l) -> tuple[int, ...]:
    """best[s][end] = min over start of max(best[s-1][start], cost(start..end) + E/L)."""
    n = len(costs)
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(costs, dtype=np.float64))])
    inf = math.inf
    best = np.full(n + 1, inf)
    best[1:] = prefix[1:] + e + (l if pp == 1 else 0.0)  # stage 0 ends at `end`
    choice = [None]
    for s in range(1, pp):
        last = s == pp - 1
        new = np.full(n + 1, inf)
        arg = np.zeros(n + 1, dtype=np.int64)
        ends = [n] if last else range(s + 1, n - (pp - 1 - s) + 1)
        for end in ends:
            starts = slice(s, end)  # the previous s stages hold >= s layers
            cand = np.maximum(best[starts], prefix[end] - prefix[starts] + (l if last else 0.0))
            k = int(np.argmin(cand))
            new[end], arg[end] = cand[k], s + k
        best = new
        choice.append(arg)
    bounds = [n]
    for s in range(pp - 1, 0, -1):
        bounds.append(int(choice[s][bounds[-1]]))
    bounds.append(0)
    bounds.reverse()
    return tuple(b - a for a, b in zip(bounds, bounds[1:]))


def max_minus_min(costs, pp, e, l) -> tuple[int, ...]:
    """DP over (i items, j parts) keeping its path's max and min part sum; minimizes max - min."""
    weights = np.asarray(costs, dtype=np.float64).copy()
    weights[0] += e
    weights[-1] += l
    n, m = len(weights), pp
    prefix = np.concatenate([[0.0], np.cumsum(weights)])
    cost = np.full((n + 1, m + 1), np.inf)
    hi = np.full((n + 1, m + 1), -np.inf)
    lo = np.full((n + 1, m + 1), np.inf)
    pos = np.zeros((n + 1, m + 1), dtype=np.int64)
    cost[0, 0] = 0.0
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            k = np.arange(j - 1, i)
            part = prefix[i] - prefix[k]
            mx = np.maximum(hi[k, j - 1], part)
            mn = np.minimum(lo[k, j - 1], part)
            c = np.where(np.isfinite(cost[k, j - 1]), mx - mn, np.inf)
            t = int(np.argmin(c))
            cost[i, j], hi[i, j], lo[i, j], pos[i, j] = c[t], mx[t], mn[t], k[t]
    bounds, i = [n], n
    for j in range(m, 0, -1):
        i = int(pos[i, j])
        bounds.append(i)
    bounds.reverse()
    return tuple(b - a for a, b in zip(bounds, bounds[1:]))


def timed(fn, args, repeats: int):
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn(*args)
        times.append(time.perf_counter() - start)
    return result, median(times)


# -- the two tables --------------------------------------------------------------------------
def size_table(sizes, repeats: int) -> None:
    rng = random.Random(2024)
    rows = []
    for n, pp in sizes:
        for kind in KINDS:
            costs = make_costs(kind, n, rng)
            e, l = 0.5 * max(costs), 4.0 * max(costs)
            args = (costs, pp, e, l)
            ours, t_ours = timed(balance_stages, args, repeats)
            slow = max(1, repeats // 3)
            dp, t_dp = timed(infinitrain_dp, args, slow if n >= 256 else repeats)
            mm, t_mm = timed(max_minus_min, args, slow if n >= 256 else repeats)
            brute, t_brute = None, None
            if comb(n - 1, pp - 1) <= BRUTE_LIMIT:
                brute, t_brute = timed(brute_force, args, 1)
            opt = exact_slowest(brute or ours, costs, e, l)

            def rel(counts):
                ratio = exact_slowest(counts, costs, e, l) / opt
                return "1 (opt)" if ratio == 1 else f"{float(ratio):.6f}"

            rows.append([n, pp, kind, f"{t_ours * 1e3:.3f}", f"{t_dp * 1e3:.2f}",
                         f"{t_mm * 1e3:.2f}", "-" if t_brute is None else f"{t_brute * 1e3:.2f}",
                         rel(ours), rel(dp), rel(mm)])
            print(f"  done {n} x {pp} {kind}", flush=True)
    print(tabulate(rows, headers=["layers", "stages", "costs", "ours ms", "DP ms", "max-min ms",
                                  "brute ms", "ours slowest/opt", "DP slowest/opt",
                                  "max-min slowest/opt"],
                   colalign=("right", "right", "left") + ("right",) * 7, disable_numparse=True))


FAMILIES = {
    "random layer costs, E/L random or 0": "random",
    "equal layers, heavy E and/or L (an LLM)": "llm",
}


def random_small_cases(count: int) -> None:
    """How often each method misses the optimum on small random problems (brute force truth)."""
    rows = []
    for family, kind in FAMILIES.items():
        rows += _family_rows(family, kind, count)
    print(tabulate(rows, headers=["cases", "method", "n", "slowest stage worse than optimum",
                                  "share", "median excess (when worse)", "max excess"],
                   colalign=("left", "left", "right", "right", "right", "right", "right"),
                   disable_numparse=True))


def _family_rows(family: str, kind: str, count: int) -> list:
    rng = random.Random(7)
    stats = {name: {"worse": 0, "excess": []} for name in ("ours", "DP", "max-min")}
    for _ in range(count):
        n = rng.randint(3, 12)
        pp = rng.randint(2, min(n, 5))
        if kind == "llm":
            costs = [1.0] * n
            e = rng.choice([0.0, round(rng.uniform(0, 3), 2)])
            l = round(rng.uniform(0.5, 8), 2)
        else:
            costs = make_costs(rng.choice(KINDS[:2]), n, rng)
            e = rng.choice([0.0, rng.uniform(0, 3) * max(costs)])
            l = rng.choice([0.0, rng.uniform(0, 6) * max(costs)])
        opt = exact_slowest(brute_force(costs, pp, e, l), costs, e, l)
        for name, fn in (("ours", balance_stages), ("DP", infinitrain_dp),
                         ("max-min", max_minus_min)):
            got = exact_slowest(fn(costs, pp, e, l), costs, e, l)
            if got > opt:
                stats[name]["worse"] += 1
                stats[name]["excess"].append(float(got / opt) - 1)
    rows = []
    for name, s in stats.items():
        ex = s["excess"]
        rows.append([family, name, count, s["worse"], f"{100 * s['worse'] / count:.1f}%",
                     f"{100 * median(ex):.1f}%" if ex else "-",
                     f"{100 * max(ex):.1f}%" if ex else "-"])
    return rows


CHUNK_SIZES = [(8, 2, 2, 8), (16, 4, 2, 8), (32, 4, 4, 8), (64, 8, 4, 16), (128, 8, 8, 16)]


def chunk_costs(n: int, rng: random.Random, memory: bool) -> StepCosts:
    """Layer times around 1 with a head of 2-8 layers; with memory, MB-sized figures."""
    mb = 2 ** 20
    forward = tuple(rng.uniform(0.5, 2.0) for _ in range(n))
    extra = {}
    if memory:
        extra = dict(activation=tuple(rng.uniform(1, 3) * mb for _ in range(n)),
                     parameters=tuple(rng.uniform(2, 4) * mb for _ in range(n)),
                     embedding_memory=(0.1 * mb, 8 * mb), lm_head_memory=(6 * mb, 8 * mb))
    return StepCosts(forward, tuple(2 * f * rng.uniform(0.8, 1.2) for f in forward), (0.2, 0.4),
                     (rng.uniform(1, 6), rng.uniform(2, 12)), **extra)


def chunk_speed_table(repeats: int) -> None:
    rng = random.Random(11)
    rows = []
    for n, pp, vpp, m in CHUNK_SIZES:
        costs = StepCosts.from_layer_costs(LayerCosts(tuple(rng.uniform(1, 2) for _ in range(n)), 3, 2 * n / pp))
        model = StepModel(costs, pp, m)
        result, t = timed(lambda: search_chunks(model, vpp), (), repeats)
        default = model.evaluate([n // (pp * vpp)] * (pp * vpp), [g % pp for g in range(pp * vpp)],
                                 "Interleaved1F1B")
        rows.append([n, pp, vpp, m, "exact" if result.exhaustive else "local", len(result.evaluated),
                     f"{t:.3f}", result.best.schedule, f"{default.step_time / result.best.step_time:.3f}"])
        print(f"  done {n} x {pp} x {vpp}", flush=True)
    print(tabulate(rows, headers=["layers", "pp", "vpp", "microbatches", "search", "layouts simulated",
                                  "seconds", "schedule", "predicted speed-up vs round-robin"],
                   disable_numparse=True))


def chunk_gap_table(count: int) -> None:
    """Local search / exact search on random small problems (pp 2 and 3, vpp 2)."""
    rng = random.Random(3)
    free, bound, misses = [], [], 0
    for _ in range(count):
        pp = rng.choice((2, 3))
        n = rng.randint(5, 9 if pp == 2 else 7)
        model = StepModel(chunk_costs(n, rng, True), pp, rng.choice((4, 6, 8)), "adamw")
        exact, local = (search_chunks(model, 2, exhaustive=e) for e in (True, False))
        free.append(local.best.step_time / exact.best.step_time)
        budget = (exact.best.max_peak + exact.tightest.max_peak) / 2
        exact_b, local_b = (search_chunks(model, 2, budget=budget, exhaustive=e) for e in (True, False))
        if exact_b.best is not None:
            if local_b.best is None:
                misses += 1
            else:
                bound.append(local_b.best.step_time / exact_b.best.step_time)
    rows = [["no budget", count, sum(r > 1 + 1e-12 for r in free), f"{median(free):.4f}", f"{max(free):.4f}", "-"],
            ["budget between fastest and leanest", count, sum(r > 1 + 1e-12 for r in bound),
             f"{median(bound):.4f}", f"{max(bound):.4f}", misses]]
    print(tabulate(rows, headers=["problems", "n", "local worse than exact", "median local/exact",
                                  "max local/exact", "fit missed by local"], disable_numparse=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="sizes up to 128 layers, 1000 cases")
    parser.add_argument("--cases", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--chunks-only", action="store_true", help="only the chunk-layout search tables")
    parser.add_argument("--gap-cases", type=int, default=40)
    args = parser.parse_args()
    if args.chunks_only:
        header("chunk-layout search (vpp > 1): speed, and the local search's gap to the exact one")
        print("\n## seconds per search\n", flush=True)
        chunk_speed_table(max(1, args.repeats // 2))
        print("\n## local search / exact search, random small problems\n", flush=True)
        chunk_gap_table(args.gap_cases)
        return
    header("solver: ours vs InfiniTrain-style DP vs DeepSpeed-style max-min vs brute force")
    sizes = [s for s in SIZES if s[0] <= 128] if args.quick else SIZES
    print("\n## time (median ms per solve) and slowest stage / optimum\n", flush=True)
    size_table(sizes, args.repeats)
    print("\n## small random cases (3-12 layers, 2-5 stages, random E and L; "
          "truth = brute force)\n")
    random_small_cases(1000 if args.quick else args.cases)
    print("\n## chunk-layout search: seconds per search\n", flush=True)
    chunk_speed_table(max(1, args.repeats // 2))
    print("\n## chunk-layout search: local / exact on random small problems\n", flush=True)
    chunk_gap_table(args.gap_cases)


if __name__ == "__main__":
    main()
