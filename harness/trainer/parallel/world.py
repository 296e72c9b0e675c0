"""The process world of a parallel run: process group, device and the (pp, dp, tp) mesh.

Rank order (Megatron's): tensor parallel fastest, then data parallel, then pipeline parallel::

    global_rank = pp_rank * (dp * tp) + dp_rank * tp + tp_rank

so the ranks of one TP group are neighbours (one node, fast links), a DP group strides by tp and
a pipeline group by dp * tp. The DeviceMesh has the dims MESH_DIMS = ("pp", "dp", "tp") in that
order; everything here (World, the rank arithmetic, the mesh) is written over that tuple.

gloo on CPU, NCCL on CUDA (the CUDA device is LOCAL_RANK).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from harness.trainer.engine import require_device
from harness.trainer.flags import FlagError, TrainerFlags


MESH_DIMS: tuple[str, ...] = ("pp", "dp", "tp")
"""The mesh's named dimensions, outermost first: the last is the fastest-varying in rank order.
A new parallelism adds its name here (its flag in DIM_FLAGS, its size / rank properties on
World); the rank arithmetic, the DeviceMesh and the process groups follow."""

DIM_FLAGS: dict[str, str] = {"tp": "tensor_parallel", "pp": "pipeline_parallel"}
"""The flag that sets each dimension's size; "dp" takes what the world size leaves."""

REMAINDER_DIM = "dp"


@dataclass
class World:
    rank: int
    sizes: dict  # dim -> size, in MESH_DIMS order
    coordinates: dict  # dim -> this rank's index along it
    device: torch.device
    mesh: object | None = field(default=None, repr=False)  # DeviceMesh over MESH_DIMS

    @property
    def world_size(self) -> int:
        return math.prod(self.sizes.values())

    # Each mesh dim's size and this rank's coordinate along it (a new dim in MESH_DIMS adds
    # its pair here).
    @property
    def pp(self) -> int:
        return self.sizes["pp"]

    @property
    def dp(self) -> int:
        return self.sizes["dp"]

    @property
    def tp(self) -> int:
        return self.sizes["tp"]

    @property
    def pp_rank(self) -> int:
        return self.coordinates["pp"]

    @property
    def dp_rank(self) -> int:
        return self.coordinates["dp"]

    @property
    def tp_rank(self) -> int:
        return self.coordinates["tp"]

    def group(self, dim: str):
        """The process group of one mesh dimension (MESH_DIMS); None without a mesh."""
        if self.mesh is None:
            return None
        return self.mesh[dim].get_group()

    def global_rank(self, pp_rank: int, dp_rank: int, tp_rank: int) -> int:
        return rank_of({"pp": pp_rank, "dp": dp_rank, "tp": tp_rank}, self.sizes)

    def rank_at(self, **coordinates: int) -> int:
        """The global rank at this rank's coordinates, with the given ones replaced."""
        return rank_of({**self.coordinates, **coordinates}, self.sizes)

    @property
    def mesh_sizes(self) -> dict:
        return dict(self.sizes)


def rank_of(coordinates: dict, sizes: dict) -> int:
    """The global rank of mesh coordinates (dims in MESH_DIMS order, the last fastest)."""
    rank = coordinates[MESH_DIMS[0]]
    for dim in MESH_DIMS[1:]:
        rank = rank * sizes[dim] + coordinates[dim]
    return rank


def coordinates_of(rank: int, sizes: dict) -> dict:
    """The mesh coordinates (dim -> index) of a global rank."""
    out = {}
    for dim in reversed(MESH_DIMS[1:]):
        rank, out[dim] = divmod(rank, sizes[dim])
    out[MESH_DIMS[0]] = rank  # the outermost dim takes what is left
    return {dim: out[dim] for dim in MESH_DIMS}


def mesh_rank(pp_rank: int, dp_rank: int, tp_rank: int, dp: int, tp: int) -> int:
    return rank_of({"pp": pp_rank, "dp": dp_rank, "tp": tp_rank}, {"dp": dp, "tp": tp})


def mesh_coordinates(rank: int, dp: int, tp: int) -> tuple[int, int, int]:
    """(pp_rank, dp_rank, tp_rank) of a global rank."""
    c = coordinates_of(rank, {"dp": dp, "tp": tp})
    return c["pp"], c["dp"], c["tp"]


def mesh_sizes(world_size: int, flags: TrainerFlags) -> dict:
    """dim -> size for a world size (MESH_DIMS order), or FlagError when the flag-set sizes
    do not divide it."""
    fixed = {dim: int(getattr(flags, flag)) for dim, flag in DIM_FLAGS.items()}
    product = math.prod(fixed.values())
    if world_size % product:
        names = " * ".join(f"--{DIM_FLAGS[d]}" for d in fixed)
        values = " * ".join(str(v) for v in fixed.values())
        raise FlagError(
            f"world size {world_size} is not divisible by {names} = {values} = {product}"
        )
    sizes = {**fixed, REMAINDER_DIM: world_size // product}
    return {dim: sizes[dim] for dim in MESH_DIMS}


def mesh_shape(world_size: int, flags: TrainerFlags) -> tuple[int, ...]:
    """The mesh sizes as a tuple in MESH_DIMS order: (pp, dp, tp)."""
    return tuple(mesh_sizes(world_size, flags).values())


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
    sizes = mesh_sizes(world_size, flags)
    device = _device(flags)
    if world_size == 1:
        return World(0, sizes, {dim: 0 for dim in MESH_DIMS}, device, None)
    if not dist.is_initialized():
        backend = "nccl" if flags.device == "cuda" else "gloo"
        kwargs = {"device_id": device} if flags.device == "cuda" else {}
        dist.init_process_group(backend=backend, **kwargs)
    rank = dist.get_rank()
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, tuple(sizes.values()), mesh_dim_names=MESH_DIMS)
    coordinates = coordinates_of(rank, sizes)
    assert tuple(mesh.get_coordinate()) == tuple(coordinates.values()), (
        mesh.get_coordinate(),
        coordinates,
    )
    return World(rank, sizes, coordinates, device, mesh)
