"""What a CaseRunner is given (Settings) and what it returns for a case (Outcome), and a
session's Settings from its options (runner_settings): the device kind (`auto` is CUDA when
present), the device slots (default: the CUDA devices, or the CPU cores) and where their leases
live."""

from __future__ import annotations

import glob
import os
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
    # --harness-calibrate K: each reference key is run K - 1 more times and this machine's
    # noise written beside the reference cache (harness.runner.calibrate); 0: no calibration.
    calibrate_repeats: int = 0


@dataclass
class Outcome:
    status: str  # passed | failed | skipped | error
    message: str  # the failure / skip text shown by pytest
    record: dict = field(default_factory=dict)


def runner_settings(session_dir: Path, reference_root: Path, worker: str, device: str,
                    gpus: int | None, timeout_s: float, launcher: str = "torchrun",
                    keep_dumps: str = "failed", golden_dir: Path | None = None,
                    golden_write_dir: Path | None = None,
                    golden_allow_mismatch: bool = False, nnodes: int = 1,
                    nproc_per_node: int | None = None, scheduler: str = "local",
                    slurm_args: tuple[str, ...] = (), calibrate_repeats: int = 0) -> Settings:
    device = resolve_device(device)
    if launcher == "auto":  # the zygote where it is measured and safe: CPU (docs/benchmarks.md)
        launcher = "zygote" if device == "cpu" else "torchrun"
    slots = gpus
    if slots is None:
        slots = cuda_count() if device == "cuda" else (os.cpu_count() or 1)
    # Leases are machine-wide for real GPUs, per session for virtual CPU slots.
    lease_dir = (Path("/tmp") / f"harness-device-leases-{os.getuid()}" if device == "cuda"
                 else session_dir / "leases")
    return Settings(
        session_id=session_dir.name, session_dir=session_dir, reference_root=reference_root,
        lease_dir=lease_dir, slots=slots, device=device, timeout_s=timeout_s, worker=worker,
        launcher=launcher, keep_dumps=keep_dumps, golden_dir=golden_dir,
        golden_write_dir=golden_write_dir, golden_allow_mismatch=golden_allow_mismatch,
        nnodes=max(1, nnodes or 1), nproc_per_node=nproc_per_node, scheduler=scheduler,
        slurm_args=tuple(slurm_args), calibrate_repeats=calibrate_repeats or 0,
    )


def resolve_device(device: str) -> str:
    """--harness-device: `auto` is CUDA where a device is present, else CPU."""
    if device == "auto":
        return "cuda" if cuda_count() else "cpu"
    return device


# Device nodes a GPU driver creates (NVIDIA; AMD's ROCm, whose torch also answers torch.cuda;
# WSL's GPU bridge). Without any of them no torch build can see a device.
_GPU_DEVICE_NODES = ("/dev/nvidia*", "/dev/kfd", "/dev/dxg")


def gpu_device_nodes_present() -> bool:
    return any(glob.glob(pattern) for pattern in _GPU_DEVICE_NODES)


def cuda_count() -> int:
    # Importing torch takes the controller (and every xdist worker) 1-1.5 s, ~5% of a small
    # session on CPU (benchmarks/harness_overhead.py): skip it where no GPU driver is present.
    if not gpu_device_nodes_present():
        return 0
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
