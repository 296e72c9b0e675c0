"""ParallelEngine: the Engine contract (harness.trainer.engine) over a (pp, dp, tp) mesh.

One step on every rank:

1. the rank's data-parallel shard of the step's microbatches (data.data_parallel_shard);
2. with pp > 1, the pipeline schedule runs them through this rank's chunks. The loss_fn is the
   per-microbatch mean cross-entropy and the schedule is built with scale_grads=True, so torch
   divides the summed gradients by the microbatch count after the last backward: the mean over
   this rank's microbatches, as SingleDeviceEngine's `loss / microbatches` accumulation gives.
   With pp = 1 the single-device accumulation (engine.accumulate_microbatches) does it;
3. the post-backward reductions registered per parallelism (reductions.py), in order: the
   sequence-parallel norms' gradients summed over tp; GPT-2's tied embedding (the first chunk's
   `wte.weight` and the last chunk's `lm_head.weight`, separate Parameters on different
   pipeline stages) summed over the two ranks holding them; the mean over the dp group;
5. the loss: the mean over microbatches, averaged over dp, on the ranks of the last chunk; the
   reporting rank is (stage of the last chunk, dp 0, tp 0).
"""

from __future__ import annotations

from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn

from harness.trainer.data import data_parallel_shard
from harness.trainer.engine import accumulate_microbatches, autocast, cross_entropy
from harness.contracts.models import spec_for_config
from harness.trainer.models.registry import train_spec_for_config
from harness.trainer.parallel.pipeline import ChunkSpec
from harness.trainer.parallel.reductions import post_backward_reductions
from harness.trainer.parallel.tensor_parallel import full_gradient
from harness.trainer.parallel.validate import ParallelPlan
from harness.trainer.parallel.world import World


class ParallelEngine:
    def __init__(
        self,
        world: World,
        plan: ParallelPlan,
        config,
        chunks: list[tuple[ChunkSpec, nn.Module]],
        n_chunks: int,
        schedule,
        dtype: torch.dtype,
        tied_group=None,
    ) -> None:
        self.world = world
        self.plan = plan
        self.config = config
        self.chunks = chunks
        self.n_chunks = n_chunks
        self.schedule = schedule
        self.stages: list = []  # this rank's PipelineStages (build.py; empty without pp)
        self.dtype = dtype
        self.device = world.device
        self.parts = [module for _spec, module in chunks]
        self.holds_first = any(spec.index == 0 for spec, _ in chunks)
        self.holds_last = any(spec.index == n_chunks - 1 for spec, _ in chunks)
        self.reports_loss = self.holds_last and world.dp_rank == 0 and world.tp_rank == 0
        self.spec = spec_for_config(config)
        self.train_spec = train_spec_for_config(config)
        self.tied = tied_embedding(config, plan)
        self.tied_group = tied_group
        self.loss_fn = cross_entropy
        self.reductions = post_backward_reductions(self)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The schedule's loss_fn: calls `self.loss_fn` at each call, so wrapping it later
        (the layer profiler does) takes effect."""
        return self.loss_fn(output, target)

    # -- the step ------------------------------------------------------------------------------
    def forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor) -> float | None:
        w = self.world
        x = data_parallel_shard(inputs, w.dp_rank, w.dp)
        y = data_parallel_shard(targets, w.dp_rank, w.dp)
        if self.schedule is None:
            (model,) = self.parts
            loss = accumulate_microbatches(model, x, y, self.device, self.dtype, self.loss_fn)
        else:
            loss = self._pipeline_step(x, y)
        for reduction in self.reductions:  # reductions.py: SP norms, tied parameters, DP
            reduction.run()
        if not self.holds_last:
            return None
        if w.dp > 1:
            dist.all_reduce(loss, group=w.group("dp"))
            loss = loss / w.dp
        return float(loss) if self.reports_loss else None

    def _pipeline_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        m, B, T = x.shape
        args = (x.reshape(m * B, T).to(self.device),) if self.holds_first else ()
        kwargs = {}
        losses: list[torch.Tensor] = []
        if self.holds_last:
            kwargs = {"target": y.reshape(m * B, T).to(self.device), "losses": losses}
        with autocast(self.device, self.dtype):
            self.schedule.step(*args, **kwargs)
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for loss in losses:
            total += loss.detach().to(torch.float64)
        return total / m  # the mean of the microbatch means

    # -- the dump ------------------------------------------------------------------------------
    def gradients(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Gathers every TP-sharded gradient now (collectives over the TP group: call this on
        every rank), then yields on dp rank 0 / tp rank 0 only. GPT-2's `lm_head.weight` on a
        part without the embedding is the tied wte, reported once as `wte.weight` by the first
        chunk's rank, its gradient already the sum of both uses."""
        w = self.world
        writes = w.dp_rank == 0 and w.tp_rank == 0
        aliases = self.spec.tied_aliases() if self.tied else ()
        out = []
        for _spec, module in self.chunks:
            for name, p in module.named_parameters():
                if p.grad is None:
                    continue
                if name in aliases:
                    continue
                g = full_gradient(p.grad, self.config, w.tp, self.train_spec.fused_qkv(name))
                if writes:
                    out.append((name, g))
        return iter(out)

    def full_tensors(self, named: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
        """Per-parameter tensors (e.g. a parameter's change over the run) gathered like
        gradients: collectives over the TP group, kept on dp rank 0 / tp rank 0 only."""
        w = self.world
        out = []
        for name, tensor in named:
            full = full_gradient(tensor, self.config, w.tp, self.train_spec.fused_qkv(name))
            if w.dp_rank == 0 and w.tp_rank == 0:
                out.append((name, full))
        return out


def tied_embedding(config, plan) -> bool:
    """Whether the model's tied parameters (ModelSpec.tied_parameters: GPT-2's wte and lm
    head) are split over pipeline stages, so their gradients must be summed."""
    return bool(spec_for_config(config).tied_parameters) and plan.pp > 1
