"""How long the exact layer-balancing solver takes, at the sizes people ask about.

    python benchmarks/solver_speed.py

Costs are random (seeded) in three shapes: small integers, non-dyadic decimals (the hard case
for exactness: every sum is scaled to big integers) and a wide spread of magnitudes. The
embedding and lm head costs are included. Times are wall clock per solve, best and median of
several repeats, on whatever machine runs this; it is a benchmark, not a test.
"""

from __future__ import annotations

import random
import statistics
import time

from tabulate import tabulate

from harness.layout import PipelineLayout, balance_stages, stage_costs

SIZES = [(8, 2), (64, 8), (128, 16), (512, 8), (512, 64), (1024, 64), (4096, 256)]
REPEATS = 7


def make_costs(kind: str, n: int, rng: random.Random) -> list[float]:
    if kind == "integers":
        return [float(rng.randint(1, 9)) for _ in range(n)]
    if kind == "decimals":
        return [round(rng.uniform(0.5, 3.0), 3) for _ in range(n)]
    return [10 ** rng.uniform(-6, 6) for _ in range(n)]


def main() -> None:
    rng = random.Random(2024)
    rows = []
    for n, pp in SIZES:
        for kind in ("integers", "decimals", "spread"):
            costs = make_costs(kind, n, rng)
            e, l = 0.5 * max(costs), 4.0 * max(costs)
            times = []
            for _ in range(REPEATS):
                start = time.perf_counter()
                counts = balance_stages(costs, pp, e, l)
                times.append(time.perf_counter() - start)
            slowest = max(stage_costs(counts, costs, e, l))
            uniform = max(stage_costs(PipelineLayout.uniform(n, pp).stage_layer_counts(), costs, e, l))
            rows.append([n, pp, kind, f"{min(times) * 1e3:.2f}", f"{statistics.median(times) * 1e3:.2f}",
                         f"{uniform / slowest:.3f}x"])
    print(tabulate(rows, headers=["layers", "stages", "costs", "best ms", "median ms", "vs uniform"],
                   colalign=("right", "right", "left", "right", "right", "right")))


if __name__ == "__main__":
    main()
