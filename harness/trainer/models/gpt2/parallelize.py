"""GPT-2's tensor-parallel plan, as code: applied to a model part by module name, from outside
the model (model.py has no parallel code).

Per block: Megatron's plan (``block_plan``: c_attn and c_fc column-wise, both c_proj row-wise),
with c_attn's fused [q; k; v] rows re-ordered first so each shard holds whole heads. The
embeddings, norms and the (tied) head stay replicated.

Sequence parallel adds: the embeddings' outputs split along the sequence (wte gives (B, T, C),
wpe (T, C)), the blocks' attention / MLP inputs gathered and their row-wise outputs
reduce-scattered (``block_plan``), and ln_f's output gathered before the replicated head. The
norms then see this rank's tokens only (``is_sequence_norm``: their gradients are summed over
the TP group after the backward, harness.trainer.parallel.reductions).
"""

from __future__ import annotations

from harness.trainer.models.gpt2.model import GPT2
from harness.trainer.parallel.tensor_parallel import (
    block_plan,
    gather_sequence,
    scatter_sequence,
    shard_fused_qkv_rows,
)


def parallelize_gpt2(part: GPT2, tp_mesh, sequence_parallel: bool) -> None:
    """Shard ``part`` over ``tp_mesh`` (the mesh's "tp" dimension), in place."""
    from torch.distributed.tensor.parallel import parallelize_module

    plan = {}
    for i, block in part.h.items():
        shard_fused_qkv_rows(block.attn.c_attn, part.config, tp_mesh.size())
        plan.update(block_plan(f"h.{i}", sequence_parallel))
    if sequence_parallel:
        if part.has_embedding:
            scatter_sequence(part.wte, 1, tp_mesh)
            scatter_sequence(part.wpe, 0, tp_mesh)  # the position table: (T, C)
        if part.has_final_norm:
            gather_sequence(part.ln_f, 1, tp_mesh)
    if plan:  # a part without blocks has nothing sharded
        parallelize_module(part, tp_mesh, plan)
