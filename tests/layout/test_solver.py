import itertools
import random
from fractions import Fraction

import pytest
from hypothesis import given, settings

from harness.layout import LayoutError, PipelineLayout, balance_stages, parse_costs, stage_costs

from .strategies import cost_problems


def exact_slowest(counts, costs, e, l):
    """The slowest stage in exact rational arithmetic: the ground truth."""
    stages, start = [], 0
    for s, k in enumerate(counts):
        total = sum(Fraction(c) for c in costs[start:start + k])
        total += Fraction(e) * (s == 0) + Fraction(l) * (s == len(counts) - 1)
        stages.append(total)
        start += k
    return max(stages)


def all_partitions(n, pp):
    for cuts in itertools.combinations(range(1, n), pp - 1):
        bounds = (0, *cuts, n)
        yield tuple(b - a for a, b in zip(bounds, bounds[1:]))


@pytest.mark.parametrize("costs, pp, expected", [
    ("10,1,1,1,1,1", 2, (1, 5)),
    ("1x8,L:4.5", 2, (6, 2)),
    ("1x8,L:10.9", 2, (7, 1)),
    ("1x8,E:10.9", 2, (1, 7)),
    ("1x5", 1, (5,)),
    ("1x4", 4, (1, 1, 1, 1)),
])
def test_seed_examples(costs, pp, expected):
    layout = PipelineLayout.from_costs(_layers(costs), pp, costs)
    assert layout.stage_layer_counts() == expected


def _layers(spec):
    return len(parse_costs(spec).layers)


@settings(max_examples=300, deadline=None)
@given(cost_problems())
def test_solver_matches_brute_force(problem):
    costs, pp, e, l = problem
    counts = balance_stages(costs, pp, e, l)
    assert len(counts) == pp and min(counts) >= 1 and sum(counts) == len(costs)
    best = min(exact_slowest(p, costs, e, l) for p in all_partitions(len(costs), pp))
    assert exact_slowest(counts, costs, e, l) == best
    uniform = PipelineLayout.uniform(len(costs), pp).stage_layer_counts()
    if exact_slowest(uniform, costs, e, l) == best:
        assert counts == uniform


@settings(max_examples=100, deadline=None)
@given(cost_problems())
def test_solver_is_deterministic_and_scale_invariant(problem):
    costs, pp, e, l = problem
    counts = balance_stages(costs, pp, e, l)
    assert balance_stages(costs, pp, e, l) == counts
    assert balance_stages([c * 4 for c in costs], pp, e * 4, l * 4) == counts  # exact: powers of two


@pytest.mark.parametrize("n, pp", [(10, 4), (7, 3), (12, 5), (512, 64), (513, 64), (3, 3)])
def test_equal_costs_give_exactly_the_uniform_split(n, pp):
    assert PipelineLayout.from_costs(n, pp, f"1x{n}") == PipelineLayout.uniform(n, pp)


def test_tie_break_prefers_the_boundary_nearest_uniform():
    # Slowest stage is 6 ([6] alone); the cheap layers can be split many ways. Uniform is 2,2,1:
    # the first cut cannot move past 1, the second stays at uniform's 4.
    assert balance_stages([6, 1, 1, 1, 1], 3) == (1, 3, 1)
    assert balance_stages([1, 1, 1, 1, 6], 3) == (2, 2, 1)  # uniform is optimal, so it is kept


def test_float_rounding_does_not_hide_the_optimum():
    # 0.1 + 0.2 > 0.3 in floats; exact arithmetic must still see both stages as 0.3 vs 0.3.
    costs = [0.1, 0.2, 0.3]
    counts = balance_stages(costs, 2)
    assert exact_slowest(counts, costs, 0, 0) == min(
        exact_slowest(p, costs, 0, 0) for p in all_partitions(3, 2))


def test_large_problem_is_optimal_against_a_reference_dp():
    rng = random.Random(7)
    costs = [rng.choice([0.5, 1.0, 1.25, 3.0]) for _ in range(60)]
    counts = balance_stages(costs, 7, 2.5, 9.0)
    assert exact_slowest(counts, costs, 2.5, 9.0) == _dp_optimum(costs, 7, 2.5, 9.0)


def _dp_optimum(costs, pp, e, l):
    """InfiniTrain's O(pp n^2) DP, in exact arithmetic."""
    n = len(costs)
    prefix = [Fraction(0)]
    for c in costs:
        prefix.append(prefix[-1] + Fraction(c))
    inf = Fraction(10**18)
    best = [[inf] * (n + 1) for _ in range(pp + 1)]
    best[0][0] = Fraction(0)
    for s in range(1, pp + 1):
        for end in range(s, n + 1):
            extra = Fraction(e) * (s == 1) + Fraction(l) * (s == pp)
            best[s][end] = min(max(best[s - 1][start], prefix[end] - prefix[start] + extra)
                                for start in range(s - 1, end))
    return best[pp][n]


def test_stage_costs_adds_embedding_and_head():
    assert stage_costs((6, 2), [1.0] * 8, 0.5, 4.5) == (6.5, 6.5)
    assert stage_costs((3,), [1.0] * 3, 0.5, 4.5) == (8.0,)


@pytest.mark.parametrize("costs, message", [
    ([1, -1], "cost -1 is invalid"),
    ([1, float("nan")], "cost nan is invalid"),
    ([1, "2"], "cost '2' is invalid"),
])
def test_solver_refuses_bad_costs(costs, message):
    with pytest.raises(LayoutError, match=message):
        balance_stages(costs, 1)


def test_solver_refuses_more_stages_than_layers():
    with pytest.raises(LayoutError, match="gives 2 layer costs, but --pipeline_parallel is 3"):
        balance_stages([1, 1], 3)
