"""Pipeline, tensor and data parallelism for the reference trainer, applied from outside the models.

The loop (harness.trainer.main) calls, in this order::

    plan = plan_parallel(flags, config, layout, world_size)  # refuses before anything is built
    world = init_distributed(flags)                           # process group, device, mesh
    engine = build_parallel_engine(flags, plan, checkpoint, layout, world)

Mesh and rank order: world.py. Schedules and which layouts they fit: schedules.py. TP plans and
the fused c_attn: tensor_parallel.py. DP: data_parallel.py. The step: engine.py.
"""

from __future__ import annotations

from harness.trainer.engine import compute_dtype
from harness.trainer.parallel.schedules import ScheduleError, chunk_order_kind, select_schedule
from harness.trainer.parallel.validate import ParallelPlan, ParallelSetupError, plan_parallel
from harness.trainer.parallel.world import World, init_distributed, mesh_coordinates, mesh_rank

__all__ = [
    "ParallelPlan",
    "ParallelSetupError",
    "ScheduleError",
    "World",
    "build_parallel_engine",
    "chunk_order_kind",
    "init_distributed",
    "mesh_coordinates",
    "mesh_rank",
    "plan_parallel",
    "select_schedule",
    "validate_parallel",
]


def validate_parallel(flags, config, layout, world_size: int) -> int:
    """Refuse a parallel setup that cannot run (ParallelSetupError, a FlagError); else the
    data-parallel size. Pure: every rank reaches the same verdict."""
    return plan_parallel(flags, config, layout, world_size).dp


def build_parallel_engine(flags, plan: ParallelPlan, checkpoint, layout, world: World):
    """The ParallelEngine of this rank: its chunks built and loaded, TP applied, stages and the
    schedule made, as `plan` (from plan_parallel, before anything was built) says."""
    from harness.trainer.parallel.engine import ParallelEngine, tied_embedding
    from harness.trainer.parallel.pipeline import build_chunk, build_stages, chunk_specs
    from harness.trainer.parallel.schedules import build_schedule

    config = checkpoint.config
    dtype = compute_dtype(flags.dtype)
    specs = chunk_specs(layout)
    n_chunks = len(specs)

    if plan.pp == 1:
        # Everything on this rank: one whole model (any virtual chunks are just consecutive).
        from harness.trainer.parallel.pipeline import ChunkSpec

        whole = ChunkSpec(0, 0, 0, config.n_layer, True, True, True)
        local = [(whole, build_chunk(whole, config, checkpoint.tensors))]
        n_chunks = 1
    else:
        local = [
            (spec, build_chunk(spec, config, checkpoint.tensors))
            for spec in specs
            if spec.stage == world.pp_rank
        ]
    for _spec, module in local:
        module.to(world.device)
        if plan.tp > 1:
            from harness.trainer.parallel import tensor_parallel as tpmod

            apply = tpmod.apply_sequence_parallel if plan.sequence_parallel else tpmod.apply_tensor_parallel
            apply(module, config, world.mesh["tp"])

    tied_group = _tied_embedding_group(world, specs) if tied_embedding(config, plan) else None
    engine = ParallelEngine(world, plan, config, local, n_chunks, None, dtype, tied_group)
    if plan.pp > 1:
        stages = build_stages(local, n_chunks, world.device, world.group("pp"))
        engine.schedule = build_schedule(
            plan.schedule, plan.kind, stages, plan.chunk_stages, plan.pp, plan.microbatches,
            loss_fn=engine.loss,
        )
    return engine


def _tied_embedding_group(world: World, specs):
    """For GPT-2's tied embedding: the process group of the two ranks (per dp, tp coordinate)
    holding the first and the last chunk, when those are different pipeline stages. Every rank
    creates every group (new_group is collective over the world), in the same order."""
    import torch.distributed as dist

    first, last = specs[0].stage, specs[-1].stage
    if first == last:
        return None
    mine = None
    for d in range(world.dp):
        for t in range(world.tp):
            ranks = [world.global_rank(first, d, t), world.global_rank(last, d, t)]
            group = dist.new_group(ranks)
            if world.rank in ranks:
                mine = group
    return mine
