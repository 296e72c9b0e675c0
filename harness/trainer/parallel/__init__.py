"""Pipeline, tensor and data parallelism for the reference trainer, applied from outside the models.

The loop (harness.trainer.main) calls, in this order::

    plan = plan_parallel(flags, config, layout, world_size)  # validate.py: refuses before anything is built
    world = init_distributed(flags)                           # world.py: process group, device, mesh
    engine = build_parallel_engine(flags, plan, checkpoint, layout, world)  # build.py

Mesh dims and rank order: world.py. Schedules and which layouts they fit: schedules.py. The TP /
SP pieces the families' plans (harness/trainer/models/<family>/parallelize.py) are written with,
and the fused c_attn: tensor_parallel.py. DP: data_parallel.py. The post-backward reductions:
reductions.py. The step: engine.py. Building a rank's engine: build.py.

This package's __init__ imports nothing: the families' plans import tensor_parallel.py, and
build.py imports the families, so an eager import here would be an import cycle.
"""
