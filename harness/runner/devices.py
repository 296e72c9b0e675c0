"""A session's runner Settings from its options: the device kind (`auto` is CUDA when present),
the device slots (default: the CUDA devices, or the CPU cores) and where their leases live."""

from __future__ import annotations

import os
from pathlib import Path

from .settings import Settings


def runner_settings(session_dir: Path, reference_root: Path, worker: str, device: str,
                    gpus: int | None, timeout_s: float) -> Settings:
    if device == "auto":
        device = "cuda" if cuda_count() else "cpu"
    slots = gpus
    if slots is None:
        slots = cuda_count() if device == "cuda" else (os.cpu_count() or 1)
    # Leases are machine-wide for real GPUs, per session for virtual CPU slots.
    lease_dir = (Path("/tmp") / f"harness-device-leases-{os.getuid()}" if device == "cuda"
                 else session_dir / "leases")
    return Settings(
        session_id=session_dir.name, session_dir=session_dir, reference_root=reference_root,
        lease_dir=lease_dir, slots=slots, device=device, timeout_s=timeout_s, worker=worker,
    )


def cuda_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
