"""The tensor- and sequence-parallel pieces the families' parallelize plans are written with.

Each family's plan is code beside its model (``harness/trainer/models/<family>/parallelize.py``,
torchtitan style): a function that applies torch.distributed.tensor.parallel styles to the
part's modules by name. What the llm.c families share is here. Per transformer block (`h.{i}`),
over the mesh's "tp" dimension (``block_plan``):

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
permutation after gathering the shards (``full_gradient``), so it has the single-device row order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:  # the families' plans import this module: no import back into models
    from harness.trainer.models.configs import ModelConfig

# torch.distributed.tensor is imported inside the functions that use it: the families' plans
# import this module, and a single-device run (which builds a family's model) should not pay
# the ~0.8 s that importing torch.distributed.tensor.parallel costs.


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


def head_counts(config: ModelConfig) -> tuple[int, int, int]:
    """(n_head, n_kv_head, head_dim) of a config (harness.trainer.models.configs.ModelConfig)."""
    return config.n_head, config.n_kv_head, config.n_embd // config.n_head


def shard_fused_qkv_rows(linear: nn.Linear, config, tp: int) -> None:
    """Re-order a fused [q; k; v] Linear's rows (and bias) in place so that a contiguous
    ColwiseParallel shard r holds [q_r; k_r; v_r]: whole heads (and whole kv groups)."""
    perm = qkv_shard_permutation(*head_counts(config), tp)
    with torch.no_grad():
        linear.weight.copy_(linear.weight[perm])
        if linear.bias is not None:
            linear.bias.copy_(linear.bias[perm])


def block_plan(block: str, sequence_parallel: bool, attention_inputs: int = 1,
               mlp_colwise: tuple[str, ...] = ("c_fc",)) -> dict:
    """The DTensor styles of one llm.c transformer block (``block`` = "h.{i}"), Megatron's:
    attn.c_attn and the MLP's ``mlp_colwise`` linears column-wise, both c_proj row-wise. Under
    sequence parallelism the attention and MLP inputs arrive split along the sequence and are
    all-gathered (the attention takes ``attention_inputs`` positional inputs, only the first
    split), and the row-wise outputs are reduce-scattered back to the sequence slice instead of
    all-reduced. In module order (the order parallelize_module applies them)."""
    from torch.distributed.tensor.parallel import ColwiseParallel

    plan = {}
    if sequence_parallel:
        plan[f"{block}.attn"] = _gather_sequence_input(attention_inputs)
    plan[f"{block}.attn.c_attn"] = ColwiseParallel()
    plan[f"{block}.attn.c_proj"] = _rowwise(sequence_parallel)
    if sequence_parallel:
        plan[f"{block}.mlp"] = _gather_sequence_input(1)
    for name in mlp_colwise:
        plan[f"{block}.mlp.{name}"] = ColwiseParallel()
    plan[f"{block}.mlp.c_proj"] = _rowwise(sequence_parallel)
    return plan


def _rowwise(sequence_parallel: bool):
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import RowwiseParallel

    return RowwiseParallel(output_layouts=Shard(1)) if sequence_parallel else RowwiseParallel()


def _gather_sequence_input(inputs: int):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput

    extra = (None,) * (inputs - 1)
    return PrepareModuleInput(
        input_layouts=(Shard(1), *extra), desired_input_layouts=(Replicate(), *extra),
        use_local_output=True,
    )


def scatter_sequence(module: nn.Module, dim: int, tp_mesh) -> None:
    """Sequence parallel: ``module``'s output is split along ``dim`` (the sequence) over the TP
    group, each rank keeping its slice; the backward all-gathers the slices' gradients."""
    module.register_forward_hook(_sequence_hook(_ScatterSequence, dim, tp_mesh))


def gather_sequence(module: nn.Module, dim: int, tp_mesh) -> None:
    """Sequence parallel: ``module``'s output is all-gathered along ``dim`` (the sequence)."""
    module.register_forward_hook(_sequence_hook(_GatherSequence, dim, tp_mesh))


def _sequence_hook(function, dim, tp_mesh):
    group, rank, size = tp_mesh.get_group(), tp_mesh.get_local_rank(), tp_mesh.size()
    return lambda _module, _args, out: function.apply(out, dim, group, rank, size)


def full_gradient(grad: torch.Tensor, config, tp: int, fused_qkv: bool) -> torch.Tensor:
    """The single-device gradient of a parameter: DTensor shards gathered (a collective over the
    TP group: every TP rank must call this for the same parameters in the same order) and, for a
    fused [q; k; v] parameter (``fused_qkv``: the family's TrainSpec says which), the row
    permutation of ``shard_fused_qkv_rows`` undone."""
    from torch.distributed.tensor import DTensor

    if isinstance(grad, DTensor):
        grad = grad.full_tensor()
    if tp > 1 and fused_qkv:
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
#   the TP group after the backward (`TrainSpec.sequence_norm`, reductions.py), as Megatron does.
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

