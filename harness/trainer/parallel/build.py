"""build_parallel_engine: this rank's chunks built and loaded, TP applied, stages and schedule
made, as the ParallelPlan (from plan_parallel, before anything was built) says."""

from __future__ import annotations

import itertools

from harness.trainer.engine import compute_dtype
from harness.trainer.models.registry import train_spec_for_config
from harness.trainer.parallel.engine import ParallelEngine, tied_embedding
from harness.trainer.parallel.pipeline import ChunkSpec, build_chunk, build_stages, chunk_specs
from harness.trainer.parallel.schedules import build_schedule
from harness.trainer.parallel.validate import ParallelPlan
from harness.trainer.parallel.world import MESH_DIMS, World


def build_parallel_engine(flags, plan: ParallelPlan, checkpoint, layout, world: World):
    """The ParallelEngine of this rank."""
    config = checkpoint.config
    dtype = compute_dtype(flags.dtype)
    specs = chunk_specs(layout)
    n_chunks = len(specs)

    if plan.pp == 1:
        # Everything on this rank: one whole model (any virtual chunks are just consecutive).
        whole = ChunkSpec(0, 0, 0, config.n_layer, True, True, True)
        local = [(whole, build_chunk(whole, config, checkpoint.tensors))]
        n_chunks = 1
    else:
        local = [
            (spec, build_chunk(spec, config, checkpoint.tensors))
            for spec in specs
            if spec.stage == world.pp_rank
        ]
    parallelize = train_spec_for_config(config).parallelize  # the family's TP / SP plan
    for _spec, module in local:
        module.to(world.device)
        if plan.tp > 1:
            parallelize(module, world.mesh["tp"], plan.sequence_parallel)

    tied_group = _tied_group(world, specs) if tied_embedding(config, plan) else None
    engine = ParallelEngine(world, plan, config, local, n_chunks, None, dtype, tied_group)
    if plan.pp > 1:
        stages = build_stages(local, n_chunks, world.device, world.group("pp"))
        engine.stages = stages  # the module-level trace skips torch's metadata inference
        engine.schedule = build_schedule(
            plan.schedule, plan.kind, stages, plan.chunk_stages, plan.pp, plan.microbatches,
            loss_fn=engine.loss,
        )
    return engine


def _tied_group(world: World, specs):
    """For tied parameters (GPT-2's embedding and head): the process group of the two ranks
    holding the first and the last chunk, per coordinate of the other mesh dims, when those
    chunks are on different pipeline stages. Every rank creates every group (new_group is
    collective over the world), in the same order."""
    import torch.distributed as dist

    first, last = specs[0].stage, specs[-1].stage
    if first == last:
        return None
    others = [dim for dim in MESH_DIMS if dim != "pp"]
    mine = None
    for coordinates in itertools.product(*(range(world.sizes[d]) for d in others)):
        at = dict(zip(others, coordinates))
        ranks = [world.rank_at(**at, pp=first), world.rank_at(**at, pp=last)]
        group = dist.new_group(ranks)
        if world.rank in ranks:
            mine = group
    return mine
