"""The gradient reductions that run after the backward, one per parallelism that needs one.

Each entry of REDUCTIONS is (name, factory): the factory looks at the engine (its world, plan,
model spec and chunks) and returns the reduction to run after every backward, or None when that
parallelism is not in use. ParallelEngine runs the list in order:

1. ``sequence_parallel``: the norms (the family's ``TrainSpec.sequence_norm``) ran on this rank's
   tokens only; their gradients are summed over the TP group (as Megatron does);
2. ``head_parallel``: the per-head norms (the family's ``TrainSpec.head_norm``: qwen3's q / k
   norms) ran on this rank's heads only under TP; their gradients are summed over the TP group;
3. ``tied_parameters``: a tied pair split over pipeline stages (GPT-2's first-stage wte.weight
   and last-stage lm_head.weight) has its gradients summed over the two ranks holding them, or
   locally when one rank holds both (V-shaped layouts), so both take the same optimizer step;
4. ``data_parallel``: the mean over the dp group (data_parallel.py), a parameter with a
   gradient on some dp ranks only (an MoE expert no token of a rank chose) given a zero one
   on the others first.

A new parallelism that needs its own post-backward step adds one factory here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from harness.trainer.parallel.data_parallel import all_reduce_mean


@dataclass(frozen=True)
class Reduction:
    name: str
    run: Callable[[], None]


def _sequence_parallel(engine):
    if not engine.plan.sequence_parallel:
        return None
    return _summed_over_tp(engine, engine.train_spec.sequence_norm)


def _head_parallel(engine):
    if engine.world.tp == 1:
        return None
    return _summed_over_tp(engine, engine.train_spec.head_norm)


def _summed_over_tp(engine, wanted_name: Callable[[str], bool]):
    """The reduction that sums, over the TP group, the gradients of the parameters whose name
    `wanted_name` picks (None when no part holds one)."""
    names = [{name for name, _ in module.named_parameters() if wanted_name(name)}
             for module in engine.parts]
    if not any(names):
        return None
    w = engine.world

    def run() -> None:
        grads = []
        for module, wanted in zip(engine.parts, names):
            grads += [p.grad for name, p in module.named_parameters()
                      if name in wanted and p.grad is not None]
        all_reduce_mean(grads, w.group("tp"), w.tp, average=False)

    return run


def _tied_parameters(engine):
    if not engine.tied:
        return None

    def run() -> None:
        for kept, alias in engine.spec.tied_parameters:
            first = second = None
            for _spec, module in engine.chunks:
                params = dict(module.named_parameters())
                first = params.get(kept, first)
                second = params.get(alias, second)
            if first is not None and second is not None:  # one rank holds both ends
                total = first.grad + second.grad
                first.grad.copy_(total)
                second.grad.copy_(total)
                continue
            param = first if first is not None else second
            if param is not None:
                dist.all_reduce(param.grad, group=engine.tied_group)

    return run


def _data_parallel(engine):
    w = engine.world
    if w.dp == 1:
        return None

    def run() -> None:
        params = [p for m in engine.parts for p in m.parameters()]
        # A parameter can have a gradient on some dp ranks only (an MoE expert that no token of
        # this rank's share chose is not run): the ranks agree on which parameters have one and
        # reduce a zero for a missing one, so all reduce the same tensors in the same order.
        have = torch.tensor([p.grad is not None for p in params], dtype=torch.int32,
                            device=w.device)
        dist.all_reduce(have, group=w.group("dp"))
        for p, count in zip(params, have.tolist()):
            if count and p.grad is None:
                p.grad = torch.zeros_like(p)
        all_reduce_mean([p.grad for p in params if p.grad is not None], w.group("dp"), w.dp)

    return run


REDUCTIONS: list[tuple[str, Callable]] = [
    ("sequence_parallel", _sequence_parallel),
    ("head_parallel", _head_parallel),
    ("tied_parameters", _tied_parameters),
    ("data_parallel", _data_parallel),
]


def post_backward_reductions(engine) -> list[Reduction]:
    """The reductions this engine runs after each backward, in REDUCTIONS order."""
    out = []
    for name, factory in REDUCTIONS:
        run = factory(engine)
        if run is not None:
            out.append(Reduction(name, run))
    return out
