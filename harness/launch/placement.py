"""Where a placed run goes: one ordinary local launch (the backend's own), several torchrun
agents on this machine (harness.launch.multinode), or a Slurm job (harness.launch.slurm).

Its own module so that multinode and slurm do not import each other: slurm builds on
multinode's per-node commands, and this module, above both, picks between them.
"""

from __future__ import annotations

from .multinode import placed, plan_nodes, run_local_agents
from .process import ProcessResult
from .slurm import SlurmScheduler


def launch_placed(backend, spec, settings) -> ProcessResult | None:
    """Run `spec` as its placement says: None when it is one ordinary local launch (the
    caller launches it), else the result of its local agents or of its Slurm job."""
    if not placed(settings):
        return None
    plan = plan_nodes(spec.world_size, settings)
    if isinstance(plan, str):  # skip_reason refuses these before a launch
        raise ValueError(f"{spec.case}: cannot place {spec.world_size} ranks: {plan}")
    if settings.scheduler == "slurm":
        return SlurmScheduler.from_settings(settings).run(backend, spec, plan)
    if plan.nodes == 1:
        return None
    return run_local_agents(backend, spec, plan, settings.timeout_s)
