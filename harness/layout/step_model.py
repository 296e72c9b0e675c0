"""The modelled step of one layout: its simulated step time and each stage's peak memory.

Inputs are per microbatch: each layer's forward and backward time, and (when known) the bytes its
forward keeps for the backward (activations) and the bytes of its parameters; the embedding (E)
and the final norm + lm head + loss (L) have the same figures and go with the first / last chunk.

A stage's modelled peak memory is

    parameters x (1 + 1 + optimizer_states)      weights, their gradients, optimizer state
  + the most activation bytes it holds at once    under its rank's order of the schedule

with `optimizer_states` 2 for AdamW (exp_avg, exp_avg_sq) and 0 for plain SGD. Gradients are
counted whole: at the end of the backward every one of them exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate
from typing import Sequence

from .costs import LayerCosts
from .schedules import Action, microbatch_rule, rank_orders
from .simulate import peak_in_flight, simulate

OPTIMIZER_STATES = {"adamw": 2, "sgd": 0}
# Without a profiled split, a layer's backward costs about twice its forward (two matmuls per one).
BACKWARD_SHARE = 2.0 / 3.0


def split_total(cost: float) -> tuple[float, float]:
    """(forward, backward) of a forward + backward total."""
    return cost * (1 - BACKWARD_SHARE), cost * BACKWARD_SHARE


@dataclass(frozen=True)
class StepCosts:
    forward: tuple[float, ...]
    backward: tuple[float, ...]
    embedding: tuple[float, float] = (0.0, 0.0)  # (forward, backward)
    lm_head: tuple[float, float] = (0.0, 0.0)
    activation: tuple[float, ...] | None = None  # bytes per microbatch; None: not recorded
    parameters: tuple[float, ...] | None = None  # bytes
    embedding_memory: tuple[float, float] = (0.0, 0.0)  # (activation, parameters)
    lm_head_memory: tuple[float, float] = (0.0, 0.0)

    def __post_init__(self) -> None:
        n = len(self.forward)
        for name in ("backward", "activation", "parameters"):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise ValueError(f"StepCosts.{name} has {len(value)} entries for {n} layers")

    @property
    def num_layers(self) -> int:
        return len(self.forward)

    @property
    def has_memory(self) -> bool:
        return self.activation is not None and self.parameters is not None

    @classmethod
    def from_layer_costs(cls, costs: LayerCosts) -> StepCosts:
        """Forward + backward totals (a --costs spec) split 1:2; no memory figures."""
        return cls(tuple(split_total(c)[0] for c in costs.layers), tuple(split_total(c)[1] for c in costs.layers),
                   split_total(costs.embedding), split_total(costs.lm_head))

    def totals(self) -> LayerCosts:
        return LayerCosts(tuple(f + b for f, b in zip(self.forward, self.backward)),
                          sum(self.embedding), sum(self.lm_head))


@dataclass(frozen=True)
class Evaluation:
    sizes: tuple[int, ...]  # layers per chunk, global order
    stages: tuple[int, ...]  # stage of each chunk
    schedule: str
    step_time: float
    peaks: tuple[float, ...] | None  # modelled peak bytes per stage; None: no memory figures
    rank_busy: tuple[float, ...] = ()  # compute time per stage

    @property
    def chunk_layout(self) -> str:
        return ",".join(f"{s}:{n}" for s, n in zip(self.stages, self.sizes))

    @property
    def max_peak(self) -> float:
        return max(self.peaks) if self.peaks else 0.0


class StepModel:
    """Evaluates layouts of one model on pp stages for a microbatch count (chunk sums in O(1))."""

    def __init__(self, costs: StepCosts, pp: int, microbatches: int, optimizer: str = "adamw",
                 comm: float = 0.0) -> None:
        self.costs, self.pp, self.microbatches, self.comm = costs, pp, microbatches, comm
        self.state_factor = 2 + OPTIMIZER_STATES[optimizer]
        self._f = [0.0, *accumulate(costs.forward)]
        self._b = [0.0, *accumulate(costs.backward)]
        self._a = [0.0, *accumulate(costs.activation)] if costs.has_memory else None
        self._p = [0.0, *accumulate(costs.parameters)] if costs.has_memory else None

    def runs(self, schedule: str, n_chunks: int) -> str | None:
        """Why the schedule refuses this step's microbatch count, or None."""
        return microbatch_rule(schedule, self.pp, n_chunks, self.microbatches)

    def chunk_costs(self, sizes: Sequence[int]) -> list[float]:
        """Forward + backward time of each chunk, one microbatch."""
        forward, backward = self._chunk_sums(sizes, self._f, self._b, self.costs.embedding, self.costs.lm_head)
        return [f + b for f, b in zip(forward, backward)]

    def evaluate(self, sizes: Sequence[int], stages: Sequence[int], schedule: str) -> Evaluation:
        sizes, stages = tuple(sizes), tuple(stages)
        orders = _orders(schedule, stages, self.pp, self.microbatches)
        forward, backward = self._chunk_sums(sizes, self._f, self._b, self.costs.embedding, self.costs.lm_head)
        sim = simulate(orders, stages, forward, backward, self.comm)
        peaks = None
        if self._a is not None:
            act, par = self._chunk_sums(sizes, self._a, self._p, self.costs.embedding_memory,
                                        self.costs.lm_head_memory)
            peaks = tuple(sum(par[g] for g in range(len(sizes)) if stages[g] == s) * self.state_factor
                          + peak_in_flight(orders[s], act) for s in range(self.pp))
        return Evaluation(sizes, stages, schedule, sim.step_time, peaks, sim.rank_busy)

    @staticmethod
    def _chunk_sums(sizes, first: list[float], second: list[float], head: tuple[float, float],
                    tail: tuple[float, float]) -> tuple[list[float], list[float]]:
        a, b, start = [], [], 0
        for count in sizes:
            a.append(first[start + count] - first[start])
            b.append(second[start + count] - second[start])
            start += count
        a[0] += head[0]
        b[0] += head[1]
        a[-1] += tail[0]
        b[-1] += tail[1]
        return a, b


@lru_cache(maxsize=256)
def _orders(schedule: str, stages: tuple[int, ...], pp: int, microbatches: int) -> list[list[Action]]:
    return rank_orders(schedule, stages, pp, microbatches)
