"""Smoke test of benchmarks/solver_speed.py's baselines (not a timing test): on small random
problems the InfiniTrain-style DP and our solver reach the brute-force optimum, and max-min
returns a valid partition."""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import solver_speed as bench  # noqa: E402

from harness.layout import balance_stages  # noqa: E402


def test_baselines_against_brute_force():
    rng = random.Random(3)
    for _ in range(60):
        n = rng.randint(2, 9)
        pp = rng.randint(1, min(n, 4))
        costs = bench.make_costs(rng.choice(bench.KINDS), n, rng)
        e, l = rng.uniform(0, 3) * max(costs), rng.uniform(0, 6) * max(costs)
        opt = bench.exact_slowest(bench.brute_force(costs, pp, e, l), costs, e, l)
        for solver in (balance_stages, bench.infinitrain_dp):
            assert bench.exact_slowest(solver(costs, pp, e, l), costs, e, l) == opt
        counts = bench.max_minus_min(costs, pp, e, l)
        assert len(counts) == pp and sum(counts) == n and min(counts) >= 1


def test_chunk_tables_run_on_tiny_sizes(monkeypatch, capsys):
    monkeypatch.setattr(bench, "CHUNK_SIZES", [(8, 2, 2, 4)])
    bench.chunk_speed_table(1)
    bench.chunk_gap_table(2)
    out = capsys.readouterr().out
    assert "predicted speed-up vs round-robin" in out and "fit missed by local" in out
