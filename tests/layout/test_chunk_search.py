"""The chunk-layout search: exact where it enumerates, a measured gap where it does not, the
memory budget kept, and fast at the size the issue names."""

import random
import time

import pytest

from harness.layout import LayerCosts, LayoutError
from harness.layout.chunk_search import (BUDGET_GAP, STATED_GAP, canonical_orders, compositions, order_count,
                                         search_chunks)
from harness.layout.schedules import chunk_order_kind
from harness.layout.step_model import StepCosts, StepModel

MB = 2 ** 20


def _costs(rng, n, memory=True):
    forward = tuple(rng.uniform(0.5, 2.0) for _ in range(n))
    backward = tuple(2 * f * rng.uniform(0.8, 1.2) for f in forward)
    extra = {}
    if memory:
        extra = dict(activation=tuple(rng.uniform(1, 3) * MB for _ in range(n)),
                     parameters=tuple(rng.uniform(2, 4) * MB for _ in range(n)),
                     embedding_memory=(0.1 * MB, 8 * MB), lm_head_memory=(6 * MB, 8 * MB))
    return StepCosts(forward, backward, (0.2, 0.4), (rng.uniform(1, 6), rng.uniform(2, 12)), **extra)


def test_orders_are_canonical_and_complete():
    orders = list(canonical_orders(2, 2))
    assert orders == [(0, 1, 0, 1), (0, 1, 1, 0), (0, 0, 1, 1)]
    assert [chunk_order_kind(o, 2) for o in orders] == ["round-robin", "v-shape", "custom"]
    for pp, vpp in ((2, 3), (3, 2), (3, 3)):
        listed = list(canonical_orders(pp, vpp))
        assert len(listed) == len(set(listed)) == order_count(pp, vpp)
        for order in listed:
            assert all(order.count(s) == vpp for s in range(pp))
            assert [s for i, s in enumerate(order) if s not in order[:i]] == list(range(pp))
    assert list(canonical_orders(3, 1)) == [(0, 1, 2)]


def test_compositions():
    assert list(compositions(3, 2, 0)) == [(0, 3), (1, 2), (2, 1), (3, 0)]
    assert list(compositions(4, 3, 1)) == [(1, 1, 2), (1, 2, 1), (2, 1, 1)]


def test_exact_search_is_the_optimum_of_the_model():
    rng = random.Random(5)
    costs = _costs(rng, 6)
    model = StepModel(costs, 2, 4)
    result = search_chunks(model, 2)
    assert result.exhaustive
    # Every layout of every order, each under the trainer's schedule for it, evaluated here anew.
    for order in canonical_orders(2, 2):
        name = {"round-robin": "Interleaved1F1B", "v-shape": "ZBVZeroBubble", "custom": "GPipe"}[
            chunk_order_kind(order, 2)]
        for sizes in compositions(6, 4, 0):
            assert result.best.step_time <= model.evaluate(sizes, order, name).step_time + 1e-9


@pytest.mark.parametrize("seed", range(10))
def test_local_search_gap_to_the_exact_search(seed):
    """STATED_GAP and BUDGET_GAP are what this measures: the local search against the exact one
    on random small problems, without and with a budget (whose answer always fits it)."""
    rng = random.Random(seed)
    pp = rng.choice((2, 3))
    n = rng.randint(5, 8 if pp == 2 else 6)
    model = StepModel(_costs(rng, n), pp, rng.choice((4, 6, 8)), "adamw")
    exact = search_chunks(model, 2, exhaustive=True)
    local = search_chunks(model, 2, exhaustive=False)
    assert exact.exhaustive and not local.exhaustive
    assert exact.best.step_time <= local.best.step_time <= exact.best.step_time * STATED_GAP
    budget = (exact.best.max_peak + exact.tightest.max_peak) / 2
    bound = search_chunks(model, 2, budget=budget, exhaustive=False)
    exact_bound = search_chunks(model, 2, budget=budget, exhaustive=True)
    assert bound.best is not None and bound.best.max_peak <= budget
    assert exact_bound.best.step_time <= bound.best.step_time <= exact_bound.best.step_time * BUDGET_GAP


def test_budget_is_kept_and_a_tighter_one_refused():
    rng = random.Random(2)
    model = StepModel(_costs(rng, 8), 2, 8, "adamw")
    free = search_chunks(model, 2)
    budget = free.best.max_peak * 0.98
    bound = search_chunks(model, 2, budget=budget)
    assert bound.best is not None and bound.best.max_peak <= budget
    assert bound.best.step_time >= free.best.step_time
    assert search_chunks(model, 2, budget=bound.tightest.max_peak * 0.99).best is None


def test_front_is_pareto():
    model = StepModel(_costs(random.Random(4), 8), 2, 8, "adamw")
    front = search_chunks(model, 2).front()
    assert len(front) >= 2
    for a, b in zip(front, front[1:]):
        assert a.step_time <= b.step_time and a.max_peak > b.max_peak


def test_lm_head_heavy_case_moves_layers_off_the_heads_stage():
    costs = StepCosts.from_layer_costs(LayerCosts((1.0,) * 8, 0.3, 6.0))
    model = StepModel(costs, 2, 8)
    best = search_chunks(model, 2, schedule="Interleaved1F1B").best
    default = model.evaluate((2, 2, 2, 2), (0, 1, 0, 1), "Interleaved1F1B")
    assert best.schedule == "Interleaved1F1B" and best.stages == (0, 1, 0, 1)
    assert best.sizes[3] < 2 and best.step_time < default.step_time / 1.1


def test_schedule_that_cannot_run_is_refused():
    model = StepModel(StepCosts.from_layer_costs(LayerCosts((1.0,) * 8)), 2, 5)  # 5 % (5 // 2) != 0
    with pytest.raises(LayoutError, match=r"Interleaved1F1B needs a microbatch count that is a multiple"):
        search_chunks(model, 2, schedule="Interleaved1F1B")
    with pytest.raises(LayoutError, match="needs one per stage; expected at least 4 layers"):
        search_chunks(StepModel(StepCosts.from_layer_costs(LayerCosts((1.0,) * 3)), 4, 4), 1)


def test_64_layers_pp8_vpp4_in_well_under_a_few_seconds():
    # The bound is 1 s (measured in benchmarks/solver_speed.py); a loaded CI core gets 5.
    rng = random.Random(0)
    costs = StepCosts.from_layer_costs(LayerCosts(tuple(rng.uniform(1, 2) for _ in range(64)), 3, 20))
    model = StepModel(costs, 8, 16)
    start = time.perf_counter()
    result = search_chunks(model, 4)
    assert time.perf_counter() - start < 5
    default = model.evaluate([2] * 32, [g % 8 for g in range(32)], "Interleaved1F1B")
    assert result.best.step_time < default.step_time
