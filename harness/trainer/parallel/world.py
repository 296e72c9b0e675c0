"""The process world of a parallel run: process group, device and the (pp, dp, tp) mesh.

Rank order (Megatron's): tensor parallel fastest, then data parallel, then pipeline parallel::

    global_rank = pp_rank * (dp * tp) + dp_rank * tp + tp_rank

so the ranks of one TP group are neighbours (one node, fast links), a DP group strides by tp and
a pipeline group by dp * tp. The DeviceMesh has dims ("pp", "dp", "tp") in that order.

gloo on CPU, NCCL on CUDA (the CUDA device is LOCAL_RANK).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from harness.trainer.engine import require_device
from harness.trainer.flags import FlagError, TrainerFlags


@dataclass
class World:
    rank: int
    world_size: int
    pp: int
    dp: int
    tp: int
    pp_rank: int
    dp_rank: int
    tp_rank: int
    device: torch.device
    mesh: object | None = field(default=None, repr=False)  # DeviceMesh over ("pp", "dp", "tp")

    def group(self, dim: str):
        """The process group of one mesh dimension ("pp", "dp" or "tp"); None without a mesh."""
        if self.mesh is None:
            return None
        return self.mesh[dim].get_group()

    def global_rank(self, pp_rank: int, dp_rank: int, tp_rank: int) -> int:
        return mesh_rank(pp_rank, dp_rank, tp_rank, self.dp, self.tp)

    @property
    def mesh_sizes(self) -> dict:
        return {"pp": self.pp, "dp": self.dp, "tp": self.tp}


def mesh_rank(pp_rank: int, dp_rank: int, tp_rank: int, dp: int, tp: int) -> int:
    return (pp_rank * dp + dp_rank) * tp + tp_rank


def mesh_coordinates(rank: int, dp: int, tp: int) -> tuple[int, int, int]:
    """(pp_rank, dp_rank, tp_rank) of a global rank."""
    return rank // (dp * tp), (rank // tp) % dp, rank % tp


def mesh_shape(world_size: int, flags: TrainerFlags) -> tuple[int, int, int]:
    """(pp, dp, tp) for a world size, or FlagError when tp * pp does not divide it."""
    tp, pp = flags.tensor_parallel, flags.pipeline_parallel
    if world_size % (tp * pp):
        raise FlagError(
            f"world size {world_size} is not divisible by --tensor_parallel * "
            f"--pipeline_parallel = {tp} * {pp} = {tp * pp}"
        )
    return pp, world_size // (tp * pp), tp


def environment_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def _device(flags: TrainerFlags) -> torch.device:
    require_device(flags.device)
    if flags.device == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_distributed(flags: TrainerFlags) -> World:
    """Join the torchrun world (when WORLD_SIZE > 1), set the device, build the mesh.

    The mesh arithmetic (world % (tp * pp)) is checked before any collective, so every rank
    refuses the same way and none waits for another. With one process no process group is made.
    """
    world_size = environment_world_size()
    pp, dp, tp = mesh_shape(world_size, flags)
    device = _device(flags)
    if world_size == 1:
        return World(0, 1, pp, dp, tp, 0, 0, 0, device, None)
    if not dist.is_initialized():
        backend = "nccl" if flags.device == "cuda" else "gloo"
        kwargs = {"device_id": device} if flags.device == "cuda" else {}
        dist.init_process_group(backend=backend, **kwargs)
    rank = dist.get_rank()
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
    pp_rank, dp_rank, tp_rank = mesh_coordinates(rank, dp, tp)
    assert tuple(mesh.get_coordinate()) == (pp_rank, dp_rank, tp_rank), (
        mesh.get_coordinate(),
        (pp_rank, dp_rank, tp_rank),
    )
    return World(rank, world_size, pp, dp, tp, pp_rank, dp_rank, tp_rank, device, mesh)
