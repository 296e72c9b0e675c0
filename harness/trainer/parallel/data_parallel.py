"""Data parallelism: one bucketed gradient all-reduce over the dp group after the step.

Equivalent to DDP with `no_sync()` on every microbatch but the last: gradients accumulate
locally over this rank's microbatches (the pipeline schedule, or the local loop, leaves their
mean), then one all-reduce (sum) and a division by dp gives the mean over every microbatch of the
step, which is the single-device gradient because every microbatch has the same token count and
the dp shards (data.data_parallel_shard) together are exactly the step's microbatches.

Done by hand rather than by wrapping each chunk in DDP because it composes with everything the
engine runs: pipeline chunks without parameters (DDP refuses those), several chunks per rank,
DTensor (TP) parameters (the local shard is reduced; all dp ranks hold the same shard).
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist

BUCKET_ELEMENTS = 1 << 24  # 64 MiB of fp32 per all-reduce


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t._local_tensor if isinstance(t, DTensor) else t


def all_reduce_mean(tensors: Iterable[torch.Tensor], group, size: int, average: bool = True) -> None:
    """In place: each tensor becomes its mean (or sum) over the group (bucketed per dtype)."""
    if size == 1:
        return
    locals_ = [local_tensor(t) for t in tensors]
    bucket: list[torch.Tensor] = []
    count = 0

    def flush() -> None:
        nonlocal bucket, count
        if not bucket:
            return
        flat = torch.cat([t.reshape(-1) for t in bucket])
        dist.all_reduce(flat, group=group)
        if average:
            flat.div_(size)
        offset = 0
        for t in bucket:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()
        bucket, count = [], 0

    for dtype in sorted({t.dtype for t in locals_}, key=str):
        for t in (t for t in locals_ if t.dtype == dtype):
            bucket.append(t)
            count += t.numel()
            if count >= BUCKET_ELEMENTS:
                flush()
        flush()
