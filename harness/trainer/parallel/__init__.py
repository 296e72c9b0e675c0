"""Pipeline, tensor and data parallelism for the reference trainer, applied from outside the models.

The loop (harness.trainer.main) calls, in this order::

    plan = plan_parallel(flags, config, layout, world_size)  # refuses before anything is built
    world = init_distributed(flags)                           # process group, device, mesh
    engine = build_parallel_engine(flags, plan, checkpoint, layout, world)

Mesh dims and rank order: world.py. Schedules and which layouts they fit: schedules.py. The TP /
SP plan (from the model's ModelSpec) and the fused c_attn: tensor_parallel.py. DP:
data_parallel.py. The post-backward reductions: reductions.py. The step: engine.py. Building a
rank's engine: build.py.
"""

from __future__ import annotations

from harness.trainer.parallel.build import build_parallel_engine
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
