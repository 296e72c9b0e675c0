"""Tensor parallelism with DTensor plans, applied from outside the model by module name.

The plan is data in the model's ModelSpec (harness.spec.models: `tp_plan`, and `sp_plan` for
sequence parallelism, keyed by module-name pattern); `apply_tensor_parallel` is the one place
that turns it into DTensor styles and hooks. For GPT-2 and LLaMA 3, per transformer block
(`h.{i}`), over the mesh's "tp" dimension:

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

from harness.spec.models import (
    ParallelStyle,
    load_object,
    name_matches,
    plan_lookup,
    spec_for_config,
)


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
    """(n_head, n_kv_head, head_dim) of a config (n_kv_head defaults to n_head)."""
    n_kv = getattr(config, "n_kv_head", config.n_head)
    return config.n_head, n_kv, config.n_embd // config.n_head


def _torch_style(style: ParallelStyle):
    """The DTensor style of a plan entry that parallelize_module applies (None for the
    entries applied by hooks or after the backward)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
    )

    if style.kind in ("colwise", "colwise_qkv"):
        return ColwiseParallel()
    if style.kind == "rowwise":
        return RowwiseParallel() if style.dim is None else RowwiseParallel(output_layouts=Shard(style.dim))
    if style.kind == "gather_input":
        extra = (None,) * (style.inputs - 1)
        return PrepareModuleInput(
            input_layouts=(Shard(1), *extra), desired_input_layouts=(Replicate(), *extra),
            use_local_output=True,
        )
    return None


def apply_tensor_parallel(part: nn.Module, config, tp_mesh, sequence_parallel: bool = False) -> None:
    """Shard a model part over ``tp_mesh`` by its ModelSpec's plan (with the SP entries when
    ``sequence_parallel``): every module is looked up by name in the plan, so the model code
    has no parallel code and the plan has no model code.

    In order: the fused [q; k; v] rows of ``colwise_qkv`` modules are re-arranged for whole-head
    shards; the sequence scatter / gather hooks and the spec's ``sp_hooks`` are registered; then
    the DTensor styles are applied in one parallelize_module call.
    """
    from torch.distributed.tensor.parallel import parallelize_module

    spec = spec_for_config(config)
    plan = spec.parallel_plan(sequence_parallel)
    size = tp_mesh.size()
    group = tp_mesh.get_group() if sequence_parallel else None
    rank = tp_mesh.get_local_rank() if sequence_parallel else 0
    perm = None
    hooks = {pattern: load_object(path) for pattern, path in spec.sp_hooks.items()} if sequence_parallel else {}
    torch_plan = {}
    for name, module in part.named_modules():
        styles = plan_lookup(plan, name) if name else ()
        for style in styles:
            if style.kind == "colwise_qkv":
                if perm is None:
                    perm = qkv_shard_permutation(*head_counts(config), size)
                with torch.no_grad():
                    module.weight.copy_(module.weight[perm])
                    if module.bias is not None:
                        module.bias.copy_(module.bias[perm])
            elif style.kind == "scatter_output":
                module.register_forward_hook(_sequence_hook(_ScatterSequence, style.dim, group, rank, size))
            elif style.kind == "gather_output":
                module.register_forward_hook(_sequence_hook(_GatherSequence, style.dim, group, rank, size))
        for pattern, hook in hooks.items():
            if name and name_matches(pattern, name):
                hook(module, part, size)
        torch_styles = [t for t in map(_torch_style, styles) if t is not None]
        if torch_styles:
            (torch_plan[name],) = torch_styles
    if torch_plan:
        parallelize_module(part, tp_mesh, torch_plan)


def apply_sequence_parallel(part: nn.Module, config, tp_mesh) -> None:
    """TP with sequence parallelism: the same plan with its SP entries."""
    apply_tensor_parallel(part, config, tp_mesh, sequence_parallel=True)


def _sequence_hook(function, dim, group, rank, size):
    return lambda _module, _args, out: function.apply(out, dim, group, rank, size)


def full_gradient(name: str, grad: torch.Tensor, config, tp: int) -> torch.Tensor:
    """The single-device gradient of a parameter: DTensor shards gathered (a collective over the
    TP group: every TP rank must call this for the same parameters in the same order) and the
    c_attn row permutation undone."""
    from torch.distributed.tensor import DTensor

    if isinstance(grad, DTensor):
        grad = grad.full_tensor()
    module = name.rpartition(".")[0]
    if tp > 1 and any(s.kind == "colwise_qkv" for s in spec_for_config(config).styles(module)):
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


def sequence_parallel_parameters(part: nn.Module, config) -> list[str]:
    """Names of the parameters whose gradient must be summed over the TP group under SP: those
    of the modules the plan marks ``sequence_norm`` (they saw only this rank's tokens)."""
    spec = spec_for_config(config)
    return [
        name for name, _ in part.named_parameters()
        if any(s.kind == "sequence_norm" for s in spec.styles(name.rpartition(".")[0], True))
    ]
