"""What a CaseRunner is given (Settings) and what it returns for a case (Outcome)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Settings:
    session_id: str
    session_dir: Path
    reference_root: Path
    lease_dir: Path
    slots: int  # devices the run may use (--gpus)
    device: str  # cpu | cuda
    timeout_s: float
    worker: str = "main"
    launcher: str = "torchrun"  # the bundled trainer's: torchrun | zygote (harness.launch.zygote)
    keep_dumps: str = "failed"  # gradient dumps kept after the diff: failed | all | none
    golden_dir: Path | None = None  # compare against golden records here (harness.reference.golden)
    golden_write_dir: Path | None = None  # record the references used as golden records here
    golden_allow_mismatch: bool = False  # use a golden from another environment (recorded)
    # Placement (harness.launch.multinode, harness.launch.slurm): the most nodes a case may
    # span, processes per node (None: the slots over the nodes), where runs go (local | slurm)
    # and the Slurm job's extra sbatch arguments.
    nnodes: int = 1
    nproc_per_node: int | None = None
    scheduler: str = "local"
    slurm_args: tuple[str, ...] = ()


@dataclass
class Outcome:
    status: str  # passed | failed | skipped | error
    message: str  # the failure / skip text shown by pytest
    record: dict = field(default_factory=dict)
