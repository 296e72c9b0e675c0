"""Where a run goes, picked in one place from the settings: a Slurm job
(harness.launch.slurm), several torchrun agents on this machine (harness.launch.multinode),
or the backend's own local launch (for the bundled trainer: the zygote or torchrun,
HarnessBackend.launch; for another trainer: its command).

Its own module so that multinode and slurm do not import each other: slurm builds on
multinode's per-node commands, and this module, above both, picks between them.
"""

from __future__ import annotations

from .multinode import placed, plan_nodes, run_local_agents
from .process import ProcessResult
from .slurm import SlurmScheduler


def launch_run(backend, spec, settings) -> ProcessResult:
    """Run `spec` where the settings place it; its log folder is made first."""
    spec.log_dir.mkdir(parents=True, exist_ok=True)
    if placed(settings):
        plan = plan_nodes(spec.world_size, settings)
        if isinstance(plan, str):  # skip_reason refuses these before a launch
            raise ValueError(f"{spec.case}: cannot place {spec.world_size} ranks: {plan}")
        if settings.scheduler == "slurm":
            return SlurmScheduler.from_settings(settings).run(backend, spec, plan)
        if plan.nodes > 1:
            return run_local_agents(backend, spec, plan, settings.timeout_s)
    return backend.launch(spec, settings)
