"""The reference trainer's entry point: `python -m harness.trainer` or `torchrun -m harness.trainer`.

Everything that can be refused is refused before any model is built: flags, checkpoint header,
token file, layout and (with more than one process) the parallel configuration. Every rank
reaches the same verdict from the same flags, so every rank exits non-zero and none waits on
another. Every rank prints the message: torchrun stops the remaining workers as soon as one
exits, so a message printed by rank 0 alone can be lost when another rank exits first.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import resource
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from harness.layout import LayoutError, layout_from_flags
from harness.contracts.llmc import LlmcFormatError, read_checkpoint_header, read_tokens
from harness.trainer.flags import FlagError, TrainerFlags, check_batch_arithmetic, parse_flags

if TYPE_CHECKING:
    import torch

    from harness.contracts.records import RunRecorder, StepRecord
    from harness.trainer.data import StepBatches
    from harness.trainer.engine import Engine
    from harness.trainer.parallel.validate import ParallelPlan
    from harness.trainer.precision_check import PrecisionChecker
    from harness.trainer.profiling import LayerProfiler

EXIT_BAD_INPUT = 2


def _rank_and_world() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def environment(device_name: str, world_size: int, mesh: dict[str, int]) -> dict[str, Any]:
    """run.json's `environment` block (harness.contracts.records): torch, device, world, mesh."""
    import torch

    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "device_name": device_name,
        "world_size": world_size,
        "mesh": mesh,
    }


def _check_inputs(flags: TrainerFlags):
    """Read headers and resolve the layout; raises the project's errors on bad input."""
    if not flags.llmc_filepath:
        raise FlagError("--llmc_filepath is required: the llm.c checkpoint to train")
    if not flags.input_bin:
        raise FlagError("--input_bin is required: the llm.c token file to train on")
    model_kind, config = read_checkpoint_header(flags.llmc_filepath)
    if flags.model is not None and flags.model != model_kind:
        raise FlagError(
            f"--model={flags.model}, but --llmc_filepath={flags.llmc_filepath} holds a "
            f"{model_kind} checkpoint"
        )
    if flags.sequence_length > config.block_size:
        raise FlagError(
            f"--sequence_length={flags.sequence_length} exceeds the model's block_size "
            f"{config.block_size} ({flags.llmc_filepath})"
        )
    if flags.pipeline_schedule and flags.pipeline_parallel == 1:
        raise FlagError(
            f"--pipeline_schedule={flags.pipeline_schedule} needs --pipeline_parallel > 1; "
            "with one stage there is no pipeline to schedule"
        )
    layout = layout_from_flags(config.n_layer, dataclasses.asdict(flags))
    flags.lr_schedule()  # refused here, before a model is built, as the branch's CHECKs would
    from harness.trainer.precision_check import parse_precision_check

    parse_precision_check(flags.precision_check)  # a bad option string: exit 2, no model built
    return model_kind, config, layout


def _check_token_count(flags: TrainerFlags, num_tokens: int) -> None:
    """A microbatch reads batch_size * sequence_length + 1 consecutive tokens of the file."""
    needed = flags.batch_size * flags.sequence_length + 1
    if num_tokens < needed:
        raise FlagError(
            f"--batch_size={flags.batch_size} * --sequence_length={flags.sequence_length} + 1 = "
            f"{needed} tokens per microbatch, but --input_bin={flags.input_bin} holds "
            f"{num_tokens} tokens"
        )


def _peak_memory_mb(device) -> float:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    # ru_maxrss is in KiB on Linux: the process's peak resident memory.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: Sequence[str] | None = None) -> int:
    rank, world_size = _rank_and_world()
    flags = parse_flags(argv)
    try:
        model_kind, config, layout = _check_inputs(flags)
        from harness.trainer.engine import require_device

        require_device(flags.device)
        parallel = world_size > 1 or flags.pipeline_parallel > 1 or flags.tensor_parallel > 1
        if parallel and flags.dtype == "float64":
            raise FlagError(
                "--dtype=float64 runs on one device only (one process, no --pipeline_parallel "
                "or --tensor_parallel): it is the float64 oracle a calibration session runs "
                "beside each single-device reference"
            )
        if parallel:
            from harness.trainer.parallel.validate import plan_parallel

            plan = plan_parallel(flags, config, layout, world_size)
            microbatches = plan.microbatches * plan.dp
        else:
            plan = None
            microbatches = check_batch_arithmetic(flags, data_parallel=1)
        tokens = read_tokens(flags.input_bin, vocab_size=config.vocab_size)
        _check_token_count(flags, len(tokens))
    except (FlagError, LayoutError, LlmcFormatError, FileNotFoundError) as error:
        where = f" (rank {rank} of {world_size})" if world_size > 1 else ""
        print(f"error{where}: {error}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    return _train(flags, config, layout, tokens, microbatches, plan)


# --------------------------------------------------------------------------- the build steps
# The trainer is built in steps, as torchtitan's Trainer is: the model (one device) or its
# parallel build, the optimizer, the profiler, the records, the loop and the dumps. Each step
# is one function with a typed result; `_train` calls them in order.


@dataclass(frozen=True)
class Built:
    """The model step's result: this rank's engine and where it runs."""

    engine: Engine
    device: torch.device
    mesh: dict[str, int]  # MESH_DIMS -> size (1 each on one device)
    schedule: str | None  # the pipeline schedule run; None without a pipeline
    parallel: bool  # a process group was made (to end after the run)
    rank: int
    world_size: int


@dataclass(frozen=True)
class Profiling:
    """The profiler step's result (--profile_layers): the profiler and this rank's file."""

    profiler: LayerProfiler
    timings_file: Path


@dataclass(frozen=True)
class UpdateBaseline:
    """--dump_parameter_updates DIR: every parameter's value before the first step."""

    directory: str
    initial: list[tuple[str, torch.Tensor]]  # (single-device name, a copy of its value)


def _prepare_process(flags: TrainerFlags) -> None:
    """Before the first large allocation and before any model is built."""
    import torch

    from harness.trainer.host_memory import keep_freed_memory

    if flags.device == "cpu":
        # Before the first large allocation: every step's large buffers are then reused in
        # place, as CUDA's caching allocator does, so a layer's time does not depend on its
        # neighbours (host_memory says why).
        keep_freed_memory()
    torch.manual_seed(flags.seed)


def build_single_device(flags: TrainerFlags) -> Built:
    """The model step on one device: the whole model, its weights, the compute dtype."""
    import torch

    from harness.contracts.llmc import read_checkpoint
    from harness.trainer.engine import SingleDeviceEngine, compute_dtype
    from harness.trainer.models import build_model, load_weights
    from harness.trainer.parallel.world import MESH_DIMS

    checkpoint = read_checkpoint(flags.llmc_filepath, mmap=True)  # its tensors are copied in
    device = torch.device(flags.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    model = build_model(checkpoint.config)
    load_weights(model, checkpoint.tensors)
    dtype = compute_dtype(flags.dtype)
    if dtype == torch.float64:  # the oracle: the same float32 weights, widened exactly
        model = model.to(torch.float64)
    engine = SingleDeviceEngine(model.to(device), device, dtype)
    rank, world_size = _rank_and_world()
    return Built(engine, device, {dim: 1 for dim in MESH_DIMS}, None, False, rank, world_size)


def build_parallel(flags: TrainerFlags, plan: ParallelPlan, layout) -> Built:
    """The parallelize step: the process group and mesh, then this rank's chunks built, loaded
    and parallelized as the ParallelPlan says (harness.trainer.parallel)."""
    from harness.contracts.llmc import read_checkpoint
    from harness.trainer.parallel.build import build_parallel_engine
    from harness.trainer.parallel.world import init_distributed

    # Memory-mapped: a pipeline rank copies in only the tensors of the chunks it builds.
    checkpoint = read_checkpoint(flags.llmc_filepath, mmap=True)
    world = init_distributed(flags)
    engine = build_parallel_engine(flags, plan, checkpoint, layout, world)
    rank, world_size = _rank_and_world()
    return Built(engine, world.device, world.mesh_sizes, plan.schedule, True, rank, world_size)


def build_optimizer(flags: TrainerFlags, engine: Engine) -> torch.optim.Optimizer:
    """The optimizer step: over every parameter of this rank's parts."""
    import torch

    parameters = [p for part in engine.parts for p in part.parameters()]
    if flags.optimizer == "sgd":
        return torch.optim.SGD(parameters, lr=flags.learning_rate)
    # llm.c's AdamW settings (beta2 0.95 unless --adam_beta2 says otherwise).
    return torch.optim.AdamW(
        parameters,
        lr=flags.learning_rate,
        betas=(0.9, flags.adam_beta2),
        eps=1e-8,
        weight_decay=flags.weight_decay,
    )


def build_profiler(flags: TrainerFlags, built: Built,
                   optimizer: torch.optim.Optimizer) -> Profiling | None:
    """The profiler step (--profile_layers): hooks on the parts, the loss timed, this rank's
    timings file emptied."""
    if not flags.profile_layers:
        return None
    from harness.trainer.profiling import LayerProfiler, profile_path

    engine = built.engine
    profiler = LayerProfiler(engine.parts, built.device, built.rank, optimizer, built.schedule)
    engine.loss_fn = profiler.timed_loss(engine.loss_fn)
    timings_file = profile_path(flags.profile_layers, built.rank, built.world_size)
    timings_file.parent.mkdir(parents=True, exist_ok=True)
    timings_file.write_text("")
    return Profiling(profiler, timings_file)


def start_records(flags: TrainerFlags, built: Built, config, layout,
                  microbatches: int) -> RunRecorder:
    """The recorder step: run.json and layout.txt on the reporting rank; the layout printed by
    rank 0."""
    import torch

    from harness.contracts.records import RunRecorder

    device, mesh = built.device, built.mesh
    recorder = RunRecorder(flags.output_dir if built.engine.reports_loss else None)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    recorder.write_run(
        flags,
        environment(device_name, built.world_size, mesh),
        config,
        layout,
        {**mesh, "vpp": layout.vpp, "schedule": built.schedule, "microbatches": microbatches},
    )
    if built.rank == 0:
        print(layout, flush=True)
    return recorder


def start_update_dump(flags: TrainerFlags, engine: Engine, config) -> UpdateBaseline | None:
    """The values before the first step, to subtract at the end (--dump_parameter_updates)."""
    if not flags.dump_parameter_updates:
        return None
    from harness.contracts.models import spec_for_config
    from harness.trainer.gradient_dump import parameter_tensors

    initial = [(name, p.detach().clone())
               for name, p in parameter_tensors(engine.parts, spec_for_config(config))]
    return UpdateBaseline(flags.dump_parameter_updates, initial)


def start_trace(flags: TrainerFlags, built: Built,
                plan: ParallelPlan | None) -> PrecisionChecker | None:
    """--precision_check: hooks on this rank's parts, one timestamp folder for all ranks
    (harness.trainer.precision_check). Under torch's pipelining (scale_grads=True) the recorded
    output gradients are divided by the microbatch count: the gradient of the step's loss."""
    if not flags.precision_check:
        return None
    from harness.trainer.precision_check import start_precision_check

    scale = 1.0 / plan.microbatches if plan is not None and built.schedule is not None else 1.0
    stages = built.engine.stages if built.schedule is not None else ()
    return start_precision_check(flags.precision_check, built.engine.parts, built.rank, scale,
                                 stages)


def train_loop(flags: TrainerFlags, built: Built, optimizer: torch.optim.Optimizer,
               batches: StepBatches, profiling: Profiling | None,
               recorder: RunRecorder, trace: PrecisionChecker | None = None) -> list[StepRecord]:
    """The loop step: every optimizer step, the first one's gradients dumped when asked, the
    trace's counters restarted (the last step's files remain); returns the StepRecords this
    rank reported (none off the reporting rank)."""
    import torch

    from harness.contracts.records import format_step_line
    from harness.trainer.profiling import append_records

    engine, device, mesh = built.engine, built.device, built.mesh
    schedule = flags.lr_schedule()
    reported = []
    for step in range(1, flags.num_iteration + 1):
        started = time.perf_counter()
        lr = schedule.printed(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        if trace is not None:
            trace.reset()
        inputs, targets = batches.next_step()
        loss = engine.forward_backward(torch.from_numpy(inputs), torch.from_numpy(targets))
        if step == 1 and flags.dump_gradients:
            _dump_gradients(flags.dump_gradients, engine, built.rank)
        if flags.optimizer == "adamw":
            _one_adam_step_count(optimizer, step)
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - started
        if profiling is not None:
            append_records(profiling.timings_file, profiling.profiler.take_records(step))
        if engine.reports_loss:
            record = _step_record(flags, step, loss, lr, elapsed, device)
            recorder.write_step(record)
            print(format_step_line(record, flags.num_iteration, mesh["dp"], mesh["tp"], mesh["pp"]),
                  flush=True)
            reported.append(record)
    return reported


def _one_adam_step_count(optimizer: torch.optim.Optimizer, step: int) -> None:
    """Adam's bias correction at the run's step for every parameter, as InfiniTrain's Adam
    counts it: one step count for all, advanced every step, a parameter without a gradient
    skipped (feat/support_moe@b7e0760:infini_train/src/optimizer.cc:53-62; a MoE expert no
    token chose). torch.optim counts per parameter, from its first gradient: each parameter
    about to be updated is given the count before this step (torch adds one)."""
    import torch

    for group in optimizer.param_groups:
        for parameter in group["params"]:
            if parameter.grad is None:
                continue
            state = optimizer.state[parameter]
            if not state:  # first update at a later step: zero moments, as InfiniTrain's
                state["exp_avg"] = torch.zeros_like(parameter, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(parameter,
                                                       memory_format=torch.preserve_format)
            dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
            state["step"] = torch.tensor(float(step - 1), dtype=dtype)


def _step_record(flags: TrainerFlags, step: int, loss: float, lr: float, elapsed: float,
                 device: torch.device) -> StepRecord:
    from harness.contracts.records import StepRecord

    return StepRecord(
        step=step,
        loss=float(loss),
        lr=lr,
        step_time_ms=elapsed * 1e3,
        tokens_per_s=flags.step_tokens / elapsed,
        peak_memory_mb=_peak_memory_mb(device),
    )


def finish(flags: TrainerFlags, built: Built, profiling: Profiling | None) -> int:
    """The last step: the process group ended, the profile files named."""
    if built.parallel:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    world_size = built.world_size
    # every rank's profile is complete after the barrier
    if profiling is not None and built.rank == 0:
        from harness.trainer.profiling import profile_path

        written = [str(profile_path(flags.profile_layers, r, world_size)) for r in range(world_size)]
        print(f"layer profile written: {' '.join(written)}"
              + (f" (one per rank; `python -m harness.layout.suggest --profile "
                 f"{flags.profile_layers}` reads them all)" if world_size > 1 else ""), flush=True)
    return 0


def _train(flags: TrainerFlags, config, layout, tokens, microbatches: int,
           plan: ParallelPlan | None) -> int:
    """`microbatches`: per step over all data-parallel ranks; `plan`: the ParallelPlan, or None
    on one device. The build steps, in order."""
    from harness.trainer.data import StepBatches

    _prepare_process(flags)
    built = build_single_device(flags) if plan is None else build_parallel(flags, plan, layout)
    optimizer = build_optimizer(flags, built.engine)
    batches = StepBatches(tokens, flags.batch_size, flags.sequence_length, microbatches)
    profiling = build_profiler(flags, built, optimizer)
    recorder = start_records(flags, built, config, layout, microbatches)
    updates = start_update_dump(flags, built.engine, config)
    trace = start_trace(flags, built, plan)
    train_loop(flags, built, optimizer, batches, profiling, recorder, trace)
    if trace is not None:
        trace.close()
    if updates is not None:
        _dump_updates(updates, built.engine, config, built.rank, flags.num_iteration)
    return finish(flags, built, profiling)


# --------------------------------------------------------------------------- the dumps


def _dump_gradients(directory: str, engine: Engine, rank: int) -> list[dict]:
    """--dump_gradients DIR: every parameter's gradient after the first step's backward."""
    return _write_dump(directory, engine.gradients(), rank, step=1)


def _dump_updates(updates: UpdateBaseline, engine: Engine, config, rank: int,
                  steps: int) -> list[dict]:
    """`--dump_parameter_updates DIR`: every parameter's change over the run (final - initial),
    written as a gradient dump is (full tensors, single-device names, one manifest)."""
    from harness.contracts.models import spec_for_config
    from harness.trainer.gradient_dump import parameter_tensors

    final = dict(parameter_tensors(engine.parts, spec_for_config(config)))
    changes = [(name, final[name].detach() - before) for name, before in updates.initial]
    return _write_dump(updates.directory, engine.full_tensors(changes), rank, step=steps)


def _write_dump(directory: str, tensors, rank: int, step: int) -> list[dict]:
    """This rank's files, then one manifest of every rank's, written by rank 0; returns the
    manifest entries this rank knows of."""
    from harness.trainer.gradient_dump import write_gradients, write_manifest

    entries = write_gradients(directory, tensors, rank=rank)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, entries)
        entries = [entry for rank_entries in gathered for entry in rank_entries]
        if rank != 0:
            return entries
    write_manifest(directory, entries, step=step)
    return entries
