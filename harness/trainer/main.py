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
from typing import Any, Sequence

from harness.layout import LayoutError, layout_from_flags
from harness.spec.llmc import LlmcFormatError, read_checkpoint_header, read_tokens
from harness.trainer.flags import FlagError, TrainerFlags, check_batch_arithmetic, parse_flags

EXIT_BAD_INPUT = 2


def _rank_and_world() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def environment(device_name: str, world_size: int, mesh: dict[str, int]) -> dict[str, Any]:
    """run.json's `environment` block (harness.spec.records): torch, device, world, mesh."""
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


def _build_optimizer(flags: TrainerFlags, parameters):
    import torch

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


def _train(flags, config, layout, tokens, microbatches: int, plan) -> int:
    """`microbatches`: per step over all data-parallel ranks; `plan`: the ParallelPlan, or None
    on one device."""
    import torch

    from harness.trainer.data import StepBatches
    from harness.trainer.engine import SingleDeviceEngine, compute_dtype
    from harness.trainer.gradient_dump import write_gradients, write_manifest
    from harness.trainer.host_memory import keep_freed_memory
    from harness.spec.llmc import read_checkpoint
    from harness.trainer.profiling import LayerProfiler, append_records, profile_path
    from harness.spec.records import RunRecorder, StepRecord, format_step_line

    if flags.device == "cpu":
        # Before the first large allocation: every step's large buffers are then reused in
        # place, as CUDA's caching allocator does, so a layer's time does not depend on its
        # neighbours (host_memory says why).
        keep_freed_memory()
    torch.manual_seed(flags.seed)
    # Memory-mapped: a pipeline rank copies in only the tensors of the chunks it builds.
    checkpoint = read_checkpoint(flags.llmc_filepath, mmap=True)
    rank, world_size = _rank_and_world()
    parallel = plan is not None
    schedule = plan.schedule if parallel else None
    if parallel:
        from harness.trainer.parallel.build import build_parallel_engine
        from harness.trainer.parallel.world import init_distributed

        world = init_distributed(flags)
        engine = build_parallel_engine(flags, plan, checkpoint, layout, world)
        device, mesh = world.device, world.mesh_sizes
    else:
        from harness.trainer.models import build_model, load_weights

        device = torch.device(flags.device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", 0)
        model = build_model(checkpoint.config)
        load_weights(model, checkpoint.tensors)
        dtype = compute_dtype(flags.dtype)
        if dtype == torch.float64:  # the oracle: the same float32 weights, widened exactly
            model = model.to(torch.float64)
        engine = SingleDeviceEngine(model.to(device), device, dtype)
        mesh = {"pp": 1, "dp": 1, "tp": 1}
    del checkpoint

    parameters = [p for part in engine.parts for p in part.parameters()]
    optimizer = _build_optimizer(flags, parameters)
    batches = StepBatches(tokens, flags.batch_size, flags.sequence_length, microbatches)
    profiler = LayerProfiler(engine.parts, device, rank, optimizer, schedule) if flags.profile_layers else None
    if profiler is not None:
        engine.loss_fn = profiler.timed_loss(engine.loss_fn)
        timings_file = profile_path(flags.profile_layers, rank, world_size)
        timings_file.parent.mkdir(parents=True, exist_ok=True)
        timings_file.write_text("")
    recorder = RunRecorder(flags.output_dir if engine.reports_loss else None)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    recorder.write_run(
        flags,
        environment(device_name, world_size, mesh),
        config,
        layout,
        {**mesh, "vpp": layout.vpp, "schedule": schedule, "microbatches": microbatches},
    )
    if rank == 0:
        print(layout, flush=True)
    if flags.dump_parameter_updates:  # the values before the first step, to subtract at the end
        from harness.spec.models import spec_for_config
        from harness.trainer.gradient_dump import parameter_tensors

        initial = [(name, p.detach().clone())
                   for name, p in parameter_tensors(engine.parts, spec_for_config(config))]

    for step in range(1, flags.num_iteration + 1):
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        inputs, targets = batches.next_step()
        loss = engine.forward_backward(torch.from_numpy(inputs), torch.from_numpy(targets))
        if step == 1 and flags.dump_gradients:
            _dump_gradients(flags.dump_gradients, engine, rank, write_gradients, write_manifest)
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - started
        if profiler is not None:
            append_records(timings_file, profiler.take_records(step))
        if engine.reports_loss:
            record = StepRecord(
                step=step,
                loss=float(loss),
                lr=flags.learning_rate,
                step_time_ms=elapsed * 1e3,
                tokens_per_s=flags.step_tokens / elapsed,
                peak_memory_mb=_peak_memory_mb(device),
            )
            recorder.write_step(record)
            print(format_step_line(record, flags.num_iteration, mesh["dp"], mesh["tp"], mesh["pp"]),
                  flush=True)
    if flags.dump_parameter_updates:
        _dump_updates(flags.dump_parameter_updates, engine, config, initial, rank,
                      flags.num_iteration, write_gradients, write_manifest)
    if parallel:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    if profiler is not None and rank == 0:  # every rank's file is complete after the barrier
        written = [str(profile_path(flags.profile_layers, r, world_size)) for r in range(world_size)]
        print(f"layer profile written: {' '.join(written)}"
              + (f" (one per rank; `python -m harness.layout.suggest --profile "
                 f"{flags.profile_layers}` reads them all)" if world_size > 1 else ""), flush=True)
    return 0


def _dump_gradients(directory, engine, rank, write_gradients, write_manifest) -> None:
    entries = write_gradients(directory, engine.gradients(), rank=rank)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, entries)
        entries = [entry for rank_entries in gathered for entry in rank_entries]
        if rank != 0:
            return
    write_manifest(directory, entries, step=1)


def _dump_updates(directory, engine, config, initial, rank, steps, write_gradients,
                  write_manifest) -> None:
    """`--dump_parameter_updates DIR`: every parameter's change over the run (final - initial),
    written as a gradient dump is (full tensors, single-device names, one manifest)."""
    from harness.spec.models import spec_for_config
    from harness.trainer.gradient_dump import parameter_tensors

    final = dict(parameter_tensors(engine.parts, spec_for_config(config)))
    changes = [(name, final[name].detach() - before) for name, before in initial]
    entries = write_gradients(directory, engine.full_tensors(changes), rank=rank)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, entries)
        entries = [entry for rank_entries in gathered for entry in rank_entries]
        if rank != 0:
            return
    write_manifest(directory, entries, step=steps)
