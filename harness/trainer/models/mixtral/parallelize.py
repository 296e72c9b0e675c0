"""tiny Mixtral's tensor-parallel plan, as code: applied to a model part by module name, from
outside the model (model.py has no parallel code).

Per block:

| module | style | why |
| --- | --- | --- |
| `attn`, its RoPE table | LLaMA 3's: `attn.c_attn` column-wise (rows re-ordered to whole GQA groups), `attn.c_proj` row-wise | the same attention |
| `mlp.router` | replicated | every rank routes every token the same way, so the experts' collectives match across the TP group |
| `mlp.experts.expert_{e}.c_fc`, `.c_fc2` | ColwiseParallel | each rank holds a slice of the expert's width |
| `mlp.experts.expert_{e}.c_proj` | RowwiseParallel, output replicated (all-reduced) | an expert runs on a (tokens, C) subset, not on (B, T, C), so its output cannot be split along the sequence |

The embedding, the norms, the router and the untied head stay replicated.

The router's logits are made bitwise the same on every rank of the TP group (rank 0's,
broadcast; the backward passes the gradient through): the experts' collectives only match when
every rank routes every token alike. In training the logits are already equal (the MoE input is
replicated), but a pipeline stage infers its shapes by running on *uninitialised* inputs, which
differ from rank to rank, and would route differently (a deadlock, or a mismatched all-reduce).

Sequence parallel adds LLaMA 3's entries for the attention (input gathered, c_proj
reduce-scattered, the RoPE table swapped for the full sequence's), the MoE's input all-gathered
along the sequence (every rank routes all tokens) and its replicated output cut back to this
rank's slice (the all-reduce then slice of Megatron's reduce-scatter), the embedding's output
split and ln_f's gathered. The norms then see this rank's tokens only (their gradients are summed
over the TP group after the backward, ``is_sequence_norm``); the router sees every token, so its
gradient is already whole.
"""

from __future__ import annotations

import torch

from harness.trainer.models.llama3.parallelize import full_sequence_rope
from harness.trainer.models.mixtral.model import Mixtral
from harness.trainer.parallel.tensor_parallel import (
    block_plan,
    gather_sequence,
    scatter_sequence,
    shard_fused_qkv_rows,
)


def parallelize_mixtral(part: Mixtral, tp_mesh, sequence_parallel: bool) -> None:
    """Shard ``part`` over ``tp_mesh`` (the mesh's "tp" dimension), in place."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        parallelize_module,
    )

    tp = tp_mesh.size()
    plan = {}
    for i, block in part.h.items():
        shard_fused_qkv_rows(block.attn.c_attn, part.config, tp)
        # the attention half of Megatron's block plan (LLaMA 3's: x and the RoPE table)
        attention = f"h.{i}.attn"
        plan.update({name: style for name, style in
                     block_plan(f"h.{i}", sequence_parallel, attention_inputs=2).items()
                     if name == attention or name.startswith(attention + ".")})
        if sequence_parallel:
            full_sequence_rope(block.attn, part, tp)  # before the plan's input gather
            plan[f"h.{i}.mlp"] = PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                use_local_output=True)
            scatter_sequence(block.mlp, 1, tp_mesh)  # its replicated output: this rank's slice
        same_routing(block.mlp.router, tp_mesh)
        for e in block.mlp.experts:
            expert = f"h.{i}.mlp.experts.{e}"
            plan[f"{expert}.c_fc"] = ColwiseParallel()
            plan[f"{expert}.c_fc2"] = ColwiseParallel()  # the SwiGLU gate
            plan[f"{expert}.c_proj"] = RowwiseParallel()
    if sequence_parallel:
        if part.has_embedding:
            scatter_sequence(part.wte, 1, tp_mesh)
        if part.has_final_norm:
            gather_sequence(part.ln_f, 1, tp_mesh)
    if plan:  # a part without blocks has nothing sharded
        parallelize_module(part, tp_mesh, plan)


def same_routing(router, tp_mesh) -> None:
    """Every TP rank routes with TP rank 0's router logits (see the module docstring)."""
    group = tp_mesh.get_group()
    router.register_forward_hook(lambda _module, _args, logits: _FromFirstRank.apply(logits, group))


class _FromFirstRank(torch.autograd.Function):
    """Forward: the TP group's rank 0's tensor on every rank (equal to this rank's in training);
    backward: the gradient unchanged, as for the identity it is then."""

    @staticmethod
    def forward(ctx, x, group):
        import torch.distributed as dist

        out = x.detach().clone()
        dist.broadcast(out, group=group, group_src=0)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None
