"""World-size and batch arithmetic of a case: the processes it launches (from `data_parallel`,
or InfiniTrain's `nthread_per_process`, and the model-parallel sizes), and a total batch that
the data-parallel passes divide."""

from __future__ import annotations

from typing import Any

from harness.spec.flags import FlagError, microbatches


def world_size(flags: dict[str, Any], data_parallel: tuple | None, nthreads: tuple | None,
               failer) -> int:
    """dp x tp x pp, or InfiniTrain's process count checked against tp x pp (and against dp
    when both are given). `data_parallel` and `nthreads` are (value, location) or None."""
    model_parallel = flags["tensor_parallel"] * flags["pipeline_parallel"]
    if nthreads is not None:
        world = nthreads[0]
        if world % model_parallel:
            failer(nthreads[1])(
                f"{world} processes is not a multiple of tensor_parallel * pipeline_parallel = "
                f"{flags['tensor_parallel']} * {flags['pipeline_parallel']} = {model_parallel}")
        if data_parallel is not None and data_parallel[0] * model_parallel != world:
            failer(data_parallel[1])(
                f"data_parallel {data_parallel[0]} * tensor_parallel * pipeline_parallel "
                f"{model_parallel} != nthread_per_process {world}")
    else:
        world = (data_parallel[0] if data_parallel else 1) * model_parallel
    return world


def resolve_total_batch_size(flags: dict[str, Any], world: int, location: list, failer) -> None:
    """Default `total_batch_size` to one pass of every data-parallel rank, or refuse (at
    `location`) one that the passes do not divide."""
    dp = world // (flags["tensor_parallel"] * flags["pipeline_parallel"])
    batch, sequence = flags["batch_size"], flags["sequence_length"]
    if "total_batch_size" not in flags:
        flags["total_batch_size"] = batch * sequence * dp  # one microbatch per rank
        return
    try:  # the arithmetic is the spec's, as the trainer checks it (trainer.flags)
        microbatches(flags["total_batch_size"], batch, sequence, dp)
    except FlagError:
        pass
    else:
        return
    # The config's wording: the field is named by `location`, not as a --flag.
    failer(location)(
        f"{flags['total_batch_size']} is not a multiple of batch_size * sequence_length * "
        f"data-parallel size = {batch} * {sequence} * {dp} = {batch * sequence * dp}")
