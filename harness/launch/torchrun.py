"""torchrun's command line for the bundled trainer, built in one place: one agent on this
machine (HarnessBackend.command) or one agent per node (harness.launch.multinode)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence


def torchrun_command(trainer_args: Sequence[str], nproc_per_node: int, endpoint: str,
                     log_dir: Path, nnodes: int | None = None,
                     rdzv_id: str | None = None) -> list[str]:
    """`python -m torch.distributed.run ... -m harness.trainer ARGS`: a c10d rendezvous at
    `endpoint` (HOST:PORT), no restarts, each rank's output under log_dir (torchrun's
    `attempt_0/<rank>/` layout, shown live too)."""
    nodes = ["--nnodes", str(nnodes)] if nnodes is not None else []
    run_id = ["--rdzv-id", rdzv_id] if rdzv_id is not None else []
    return [
        sys.executable, "-m", "torch.distributed.run", *nodes,
        "--nproc-per-node", str(nproc_per_node),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, *run_id,
        "--max-restarts", "0",
        "--log-dir", str(log_dir), "--redirects", "3", "--tee", "3",
        "-m", "harness.trainer", *map(str, trainer_args),
    ]
