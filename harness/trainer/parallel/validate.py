"""Every check that must refuse a parallel run before any model is built.

Each is a pure function of the flags, the model config, the layout and the world size, so every
rank reaches the same verdict and raises the same one-line error: every rank exits non-zero and
none waits on a collective another rank never joins. (The caller prints it once, from rank 0.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.trainer.flags import FlagError, TrainerFlags, check_batch_arithmetic
from harness.trainer.parallel.schedules import ScheduleError, select_schedule
from harness.trainer.parallel.world import MESH_DIMS, mesh_sizes

if TYPE_CHECKING:
    from harness.trainer.models.configs import ModelConfig


class ParallelSetupError(FlagError):
    """A parallel configuration the trainer refuses before building anything."""


@dataclass(frozen=True)
class ParallelPlan:
    pp: int
    dp: int
    tp: int
    microbatches: int  # per data-parallel rank per step (what each pipeline runs)
    chunk_stages: tuple[int, ...]  # layout stage of each chunk, in global chunk order
    kind: str | None  # chunk-order kind (schedules.py) when pp > 1
    schedule: str | None  # pipeline schedule name when pp > 1
    sequence_parallel: bool

    @property
    def sizes(self) -> dict:
        """The mesh sizes by dim name, in MESH_DIMS order."""
        sizes = {"pp": self.pp, "dp": self.dp, "tp": self.tp}
        return {dim: sizes[dim] for dim in MESH_DIMS}


def check_tensor_parallel(config: ModelConfig, tp: int, sequence_parallel: bool, sequence_length: int) -> None:
    if tp == 1:
        return
    if config.n_head % tp:
        raise ParallelSetupError(
            f"the model's n_head={config.n_head} is not divisible by --tensor_parallel={tp}"
        )
    if config.n_kv_head % tp:
        raise ParallelSetupError(
            f"the model's n_kv_head={config.n_kv_head} is not divisible by --tensor_parallel={tp} "
            f"(GQA: each TP rank needs whole key/value heads)"
        )
    if config.ffn_dim % tp:
        raise ParallelSetupError(
            f"the model's MLP width {config.ffn_dim} is not divisible by --tensor_parallel={tp}"
        )
    if sequence_parallel and sequence_length % tp:
        raise ParallelSetupError(
            f"--sequence_parallel needs --sequence_length={sequence_length} divisible by "
            f"--tensor_parallel={tp}"
        )


def plan_parallel(flags: TrainerFlags, config, layout, world_size: int) -> ParallelPlan:
    """The plan of a run, or ParallelSetupError / FlagError with one clear line."""
    sizes = mesh_sizes(world_size, flags)
    pp, dp, tp = sizes["pp"], sizes["dp"], sizes["tp"]
    if layout.pp != pp:
        raise ParallelSetupError(
            f"the layout has {layout.pp} stages but --pipeline_parallel is {pp}"
        )
    if layout.num_layers != config.n_layer:
        raise ParallelSetupError(
            f"the layout places {layout.num_layers} layers but the model has {config.n_layer}"
        )
    microbatches = check_batch_arithmetic(flags, data_parallel=dp)
    check_tensor_parallel(config, tp, flags.sequence_parallel, flags.sequence_length)
    if flags.sequence_length > config.block_size:
        raise ParallelSetupError(
            f"--sequence_length={flags.sequence_length} exceeds the model's block_size "
            f"{config.block_size}"
        )
    chunk_stages = tuple(stage for stage, _start, _end in layout.chunks)
    kind = schedule = None
    if pp > 1:
        try:
            kind, schedule = select_schedule(
                chunk_stages, pp, flags.pipeline_schedule, microbatches
            )
        except ScheduleError as error:
            raise ParallelSetupError(str(error)) from None
    return ParallelPlan(
        pp, dp, tp, microbatches, chunk_stages, kind, schedule,
        bool(flags.sequence_parallel) and tp > 1,
    )
