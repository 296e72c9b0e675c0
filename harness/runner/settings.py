"""What a CaseRunner is given (Settings) and what it returns for a case (Outcome).

A session's Settings are built from its pytest options in one place, `Settings.from_options`:
each field that comes from an option names it (`option=` in the field's metadata), so the
options are listed once here (and declared, with their help, in harness/plugin.py), never
again by hand. What is derived rather than given: the device kind (`auto` is CUDA when
present), the device slots (default: the CUDA devices, or the CPU cores), the launcher
(`auto`: the zygote on CPU) and where the leases live.
"""

from __future__ import annotations

import glob
import os
import shlex
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable


def _option(name: str, default: Any = None, **more):
    return field(default=default, metadata={"option": name}, **more)


@dataclass(frozen=True)
class Settings:
    session_id: str
    session_dir: Path
    reference_root: Path
    lease_dir: Path
    slots: int | None = _option("--gpus")  # devices the run may use (derived when None)
    device: str = _option("--harness-device", "cpu")  # cpu | cuda (auto resolved)
    timeout_s: float = _option("--harness-timeout", 900.0)
    worker: str = "main"
    # the bundled trainer's: torchrun | zygote (harness.launch.zygote)
    launcher: str = _option("--harness-launcher", "torchrun")
    # gradient dumps kept after the diff: failed | all | none
    keep_dumps: str = _option("--harness-keep-dumps", "failed")
    # compare against golden records here (harness.reference.golden)
    golden_dir: Path | None = _option("--harness-golden")
    # record the references used as golden records here
    golden_write_dir: Path | None = _option("--harness-golden-write")
    # use a golden from another environment (recorded)
    golden_allow_mismatch: bool = _option("--harness-golden-allow-mismatch", False)
    # Placement (harness.launch.multinode, harness.launch.slurm): the most nodes a case may
    # span, processes per node (None: the slots over the nodes), where runs go (local | slurm)
    # and the Slurm job's extra sbatch arguments.
    nnodes: int = _option("--harness-nnodes", 1)
    nproc_per_node: int | None = _option("--harness-nproc-per-node")
    scheduler: str = _option("--harness-scheduler", "local")
    slurm_args: tuple[str, ...] = _option("--harness-slurm-args", ())
    # --harness-calibrate K: each reference key is run K - 1 more times and this machine's
    # noise written beside the reference cache (harness.runner.calibrate); 0: no calibration.
    calibrate_repeats: int = _option("--harness-calibrate", 0)
    # --harness-baseline: `pytorch` (the bundled trainer with the subject's semantics, live,
    # harness.baseline.live) or a folder of recorded logs (harness.logs); None: no baseline
    # check, which the summary says.
    baseline: str | None = _option("--harness-baseline")

    @classmethod
    def options(cls) -> dict[str, str]:
        """option -> field, for every field an option sets."""
        return {f.metadata["option"]: f.name for f in fields(cls) if "option" in f.metadata}

    @classmethod
    def from_options(cls, getoption: Callable[[str], Any], session_dir: Path,
                     reference_root: Path, worker: str = "main") -> "Settings":
        """A session's settings from its options (`getoption`: pytest's config.getoption)."""
        given = {name: getoption(option) for option, name in cls.options().items()}
        return cls.derive(session_dir, reference_root, worker, **given)

    @classmethod
    def derive(cls, session_dir: Path, reference_root: Path, worker: str = "main",
               **given) -> "Settings":
        """Settings from option values as given (None: the option's default), with what is
        derived from them resolved."""
        defaults = {f.name: f.default for f in fields(cls) if "option" in f.metadata}
        unknown = set(given) - set(defaults)
        if unknown:
            raise TypeError(f"Settings.derive: unknown setting(s) {sorted(unknown)}; "
                            f"expected some of {sorted(defaults)}")
        values = {**defaults, **{k: v for k, v in given.items() if v is not None}}
        device = resolve_device(values["device"])
        launcher = values["launcher"]
        if launcher == "auto":  # the zygote where it is measured and safe: CPU (docs/benchmarks.md)
            launcher = "zygote" if device == "cpu" else "torchrun"
        slots = values["slots"]
        if slots is None:
            slots = cuda_count() if device == "cuda" else (os.cpu_count() or 1)
        slurm_args = values["slurm_args"]
        if isinstance(slurm_args, str):
            slurm_args = shlex.split(slurm_args)
        # Leases are machine-wide for real GPUs, per session for virtual CPU slots.
        lease_dir = (Path("/tmp") / f"harness-device-leases-{os.getuid()}" if device == "cuda"
                     else session_dir / "leases")
        paths = {k: Path(values[k]).resolve() if values[k] else None
                 for k in ("golden_dir", "golden_write_dir")}
        return cls(session_id=session_dir.name, session_dir=session_dir,
                   reference_root=reference_root, lease_dir=lease_dir, worker=worker,
                   **{**values, **paths, "device": device, "launcher": launcher, "slots": slots,
                      "slurm_args": tuple(slurm_args), "nnodes": max(1, values["nnodes"] or 1),
                      "calibrate_repeats": values["calibrate_repeats"] or 0})


@dataclass
class Outcome:
    status: str  # passed | failed | skipped | error
    message: str  # the failure / skip text shown by pytest
    record: dict = field(default_factory=dict)


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
