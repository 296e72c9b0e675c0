"""Tensor parallelism with DTensor plans, applied from outside the model by module name.

Per transformer block (`h.{i}`), over the mesh's "tp" dimension:

| module | style | why |
| --- | --- | --- |
| `attn.c_attn` | ColwiseParallel (rows re-arranged first, see below) | each rank holds whole heads |
| `attn.c_proj` | RowwiseParallel | partial sums all-reduced to a replicated output |
| `mlp.c_fc`, `mlp.c_fc2` (LLaMA's gate) | ColwiseParallel | |
| `mlp.c_proj` | RowwiseParallel | |

The embedding (wte, wpe), the norms and the lm head stay replicated plain tensors: every TP rank
computes them on the same replicated activations, so their gradients are already full and
identical on every TP rank (ColwiseParallel's backward all-reduces the input gradient). This keeps
the tied GPT-2 embedding and the dump simple at the cost of a replicated head matmul.

The fused c_attn trap: its output rows are [q (n_head*hd); k (n_kv*hd); v (n_kv*hd)]. A plain
contiguous row shard would give rank 0 all of q and nothing of v. So before sharding, the loaded
full weight (and bias) rows are permuted to [q_0; k_0; v_0; q_1; k_1; v_1; ...], where q_r holds
heads r*n_head/tp .. (r+1)*n_head/tp - 1 and k_r, v_r the matching KV heads (GQA-aware: n_kv_head
must be divisible by tp). A contiguous shard then gives rank r exactly [q_r; k_r; v_r], which is
what the model's attention derives its local head count from. The gradient dump undoes the
permutation after gathering the shards, so it has the single-device row order.
"""

from __future__ import annotations

import torch
from torch import nn

C_ATTN_SUFFIXES = ("attn.c_attn.weight", "attn.c_attn.bias")


def qkv_shard_permutation(n_head: int, n_kv_head: int, head_dim: int, tp: int) -> torch.Tensor:
    """Row indices `perm` such that `full[perm]` is the TP-shard-major [q_r; k_r; v_r] order."""
    if n_head % tp or n_kv_head % tp:
        raise ValueError(f"heads ({n_head}) and kv heads ({n_kv_head}) must be divisible by tp={tp}")
    q_rows = n_head * head_dim
    kv_rows = n_kv_head * head_dim
    q_per, kv_per = q_rows // tp, kv_rows // tp
    parts = []
    for r in range(tp):
        parts.append(torch.arange(r * q_per, (r + 1) * q_per))
        parts.append(q_rows + torch.arange(r * kv_per, (r + 1) * kv_per))
        parts.append(q_rows + kv_rows + torch.arange(r * kv_per, (r + 1) * kv_per))
    return torch.cat(parts)


def inverse_permutation(perm: torch.Tensor) -> torch.Tensor:
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(len(perm))
    return inverse


def head_counts(config) -> tuple[int, int, int]:
    """(n_head, n_kv_head, head_dim) of a GPT-2 or LLaMA 3 config."""
    n_kv = getattr(config, "n_kv_head", config.n_head)
    return config.n_head, n_kv, config.n_embd // config.n_head


def block_plan(block: nn.Module) -> dict:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {"attn.c_attn": ColwiseParallel(), "attn.c_proj": RowwiseParallel()}
    plan["mlp.c_fc"] = ColwiseParallel()
    if hasattr(block.mlp, "c_fc2"):
        plan["mlp.c_fc2"] = ColwiseParallel()
    plan["mlp.c_proj"] = RowwiseParallel()
    return plan


@torch.no_grad()
def apply_tensor_parallel(part: nn.Module, config, tp_mesh) -> None:
    """Re-arrange each block's fused c_attn rows, then shard the block's linears over tp_mesh."""
    from torch.distributed.tensor.parallel import parallelize_module

    tp = tp_mesh.size()
    n_head, n_kv, hd = head_counts(config)
    perm = qkv_shard_permutation(n_head, n_kv, hd, tp)
    for block in getattr(part, "h", {}).values():
        c_attn = block.attn.c_attn
        c_attn.weight.copy_(c_attn.weight[perm])
        if c_attn.bias is not None:
            c_attn.bias.copy_(c_attn.bias[perm])
        parallelize_module(block, tp_mesh, block_plan(block))


def full_gradient(name: str, grad: torch.Tensor, config, tp: int) -> torch.Tensor:
    """The single-device gradient of a parameter: DTensor shards gathered (a collective over the
    TP group: every TP rank must call this for the same parameters in the same order) and the
    c_attn row permutation undone."""
    from torch.distributed.tensor import DTensor

    if isinstance(grad, DTensor):
        grad = grad.full_tensor()
    if tp > 1 and name.endswith(C_ATTN_SUFFIXES):
        n_head, n_kv, hd = head_counts(config)
        grad = grad[inverse_permutation(qkv_shard_permutation(n_head, n_kv, hd, tp))]
    return grad


# -- sequence parallel ---------------------------------------------------------------------------
#
# `--sequence_parallel` (Megatron's): between the TP regions, activations are split along the
# sequence over the TP group, so the norms and residual adds run on T / tp tokens per rank.
#
# * after the embedding (forward hooks on wte, and on wpe whose output is (T, C)) each rank keeps
#   its sequence slice; the backward all-gathers the slices' gradients, so the embedding's
#   gradient is full on every rank;
# * each block's attention and MLP input is all-gathered to the full sequence
#   (PrepareModuleInput Shard(1) -> Replicate), the column-parallel linears run as without SP,
#   and the row-parallel c_proj reduce-scatters to the sequence slice (output_layouts=Shard(1));
#   LLaMA's RoPE table is swapped for the full sequence's (the part computed it from T / tp);
# * the final norm's output is all-gathered before the (replicated) head, whose backward takes
#   this rank's slice of the (identical) gradient;
# * the norms' weights (and biases) saw only this rank's tokens: their gradients are summed over
#   the TP group after the backward (`sequence_parallel_parameters`), as Megatron does.
# Pipeline stages pass the sequence slice (B, T / tp, C) from stage to stage.


class _ScatterSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, group, rank, size):
        ctx.dim, ctx.group, ctx.size = dim, group, size
        return x.chunk(size, dim=dim)[rank].contiguous()

    @staticmethod
    def backward(ctx, grad):
        import torch.distributed as dist

        parts = [torch.empty_like(grad) for _ in range(ctx.size)]
        dist.all_gather(parts, grad.contiguous(), group=ctx.group)
        return torch.cat(parts, dim=ctx.dim), None, None, None, None


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, group, rank, size):
        import torch.distributed as dist

        ctx.dim, ctx.rank, ctx.size = dim, rank, size
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(ctx.size, dim=ctx.dim)[ctx.rank].contiguous(), None, None, None, None


def sequence_parallel_parameters(part: nn.Module) -> list[str]:
    """Names of the parameters whose gradient must be summed over the TP group under SP."""
    return [name for name, _ in part.named_parameters() if ".ln_" in f".{name}"]


def apply_sequence_parallel(part: nn.Module, config, tp_mesh) -> None:
    """TP with sequence parallelism on a model part (instead of apply_tensor_parallel)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        parallelize_module,
    )

    group, rank, size = tp_mesh.get_group(), tp_mesh.get_local_rank(), tp_mesh.size()

    def scatter_hook(dim):
        return lambda _m, _args, out: _ScatterSequence.apply(out, dim, group, rank, size)

    if hasattr(part, "wte"):
        part.wte.register_forward_hook(scatter_hook(1))
    if hasattr(part, "wpe"):
        part.wpe.register_forward_hook(scatter_hook(0))
    if hasattr(part, "ln_f"):
        part.ln_f.register_forward_hook(
            lambda _m, _args, out: _GatherSequence.apply(out, 1, group, rank, size)
        )

    n_head, n_kv, hd = head_counts(config)
    perm = qkv_shard_permutation(n_head, n_kv, hd, size)
    llama = hasattr(part, "_rope_for")
    for block in getattr(part, "h", {}).values():
        with torch.no_grad():
            c_attn = block.attn.c_attn
            c_attn.weight.copy_(c_attn.weight[perm])
            if c_attn.bias is not None:
                c_attn.bias.copy_(c_attn.bias[perm])
        if llama:
            def full_rope(_m, args, _part=part):
                x, _rope = args
                return x, _part._rope_for(x.shape[1] * size, x.device)

            block.attn.register_forward_pre_hook(full_rope)
            attn_in = PrepareModuleInput(
                input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None),
                use_local_output=True,
            )
        else:
            attn_in = PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                use_local_output=True,
            )
        plan = {
            "attn": attn_in,
            "attn.c_attn": ColwiseParallel(),
            "attn.c_proj": RowwiseParallel(output_layouts=Shard(1)),
            "mlp": PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                use_local_output=True,
            ),
            "mlp.c_fc": ColwiseParallel(),
            "mlp.c_proj": RowwiseParallel(output_layouts=Shard(1)),
        }
        if hasattr(block.mlp, "c_fc2"):
            plan["mlp.c_fc2"] = ColwiseParallel()
        parallelize_module(block, tp_mesh, plan)
