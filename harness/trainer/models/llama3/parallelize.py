"""LLaMA 3's tensor-parallel plan, as code: applied to a model part by module name, from
outside the model (model.py has no parallel code).

Per block: Megatron's plan (``block_plan``: c_attn and c_fc column-wise, both c_proj row-wise)
and the SwiGLU gate c_fc2 column-wise, with c_attn's fused [q | k | v] rows re-ordered first so
each shard holds whole GQA groups. The embedding, norms and the untied head stay replicated.

Sequence parallel adds: the embedding's output split along the sequence, the blocks' attention /
MLP inputs gathered (the attention's second input, the RoPE table, is not split) and their
row-wise outputs reduce-scattered (``block_plan``), the attention's RoPE table swapped for the
full sequence's, and ln_f's output gathered before the head. The norms then see this rank's
tokens only (``is_sequence_norm``: their gradients are summed over the TP group after the
backward, harness.trainer.parallel.reductions).
"""

from __future__ import annotations

from harness.trainer.models.llama3.model import CausalSelfAttention, LLaMA3
from harness.trainer.parallel.tensor_parallel import (
    block_plan,
    gather_sequence,
    scatter_sequence,
    shard_fused_qkv_rows,
)


def parallelize_llama3(part: LLaMA3, tp_mesh, sequence_parallel: bool) -> None:
    """Shard ``part`` over ``tp_mesh`` (the mesh's "tp" dimension), in place."""
    from torch.distributed.tensor.parallel import parallelize_module

    tp = tp_mesh.size()
    plan = {}
    for i, block in part.h.items():
        shard_fused_qkv_rows(block.attn.c_attn, part.config, tp)
        # the attention takes x and the RoPE table; c_fc2 is the SwiGLU gate
        plan.update(block_plan(f"h.{i}", sequence_parallel, attention_inputs=2,
                               mlp_colwise=("c_fc", "c_fc2")))
        if sequence_parallel:
            # registered before the plan's input gather, so it runs first and sees T / tp
            full_sequence_rope(block.attn, part, tp)
    if sequence_parallel:
        if part.has_embedding:
            scatter_sequence(part.wte, 1, tp_mesh)
        if part.has_final_norm:
            gather_sequence(part.ln_f, 1, tp_mesh)
    if plan:  # a part without blocks has nothing sharded
        parallelize_module(part, tp_mesh, plan)


def full_sequence_rope(attn: CausalSelfAttention, part: LLaMA3, tp: int) -> None:
    """Sequence parallel: the part computed its RoPE table for the T / tp tokens a rank holds,
    but the attention runs on the all-gathered sequence, so the table is swapped for the full
    sequence's before the input is gathered."""

    def full_rope(_module, args):
        x, _rope = args
        return x, part._rope_for(x.shape[1] * tp, x.device)

    attn.register_forward_pre_hook(full_rope)
