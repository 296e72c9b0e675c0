"""Qwen3 as InfiniTrain's ``qwen3`` program computes it (feat/add_Qwen3-8B@a3f84f8), in plain
PyTorch.

Qwen3 is LLaMA 3's block with one change in the attention: each q head and each k head is
RMS-normalized over its head_dim (a learned gain per dimension, shared by all heads, eps the
model's norm_eps) after the projection and before RoPE. Everything else is this package's
LLaMA 3 (harness/trainer/models/llama3/model.py): the names, the fused [q | k | v] rows, RoPE on
interleaved pairs, grouped-query attention, SwiGLU with c_fc2 the gate, the untied head. So
this file holds the attention's addition only; the rest is LLaMA 3's. Parameter names (= the checkpoint's keys, InfiniTrain's without ``transformer.``):

    wte, h.{i}.ln_1, h.{i}.attn.q_norm, h.{i}.attn.k_norm, h.{i}.attn.c_attn, h.{i}.attn.c_proj,
    h.{i}.ln_2, h.{i}.mlp.c_fc, h.{i}.mlp.c_fc2, h.{i}.mlp.silu (no parameters),
    h.{i}.mlp.c_proj, ln_f, lm_head

InfiniTrain's sources for each choice (that branch's lines):
- q_norm / k_norm: RMSNorm(head_dim, qk_norm_eps) (transformer/causal_self_attention.cc:24-29),
  applied to q viewed as (B*T*H, D) and k as (B*T*KV, D) before ApplyRotaryEmbedding
  (:222-237); qk_norm_eps = norm_eps (example/qwen3/checkpoint_loader.cc:87-88);
- head_dim = n_embd / n_head (causal_self_attention.cc:68), not a separate config field;
- RoPE theta from the file (1e6 in config.h:24), never llama3-scaled (utils.cc:15-18);
- the MLP width 3 * n_embd (harness.contracts.models.Qwen3Config.ffn_dim).

Hugging Face's ``Qwen3ForCausalLM`` computes the same model from converted weights
(tests/trainer/models/test_qwen3_hf.py): q_proj / k_proj / v_proj stacked into c_attn with the
q and k rows of each head permuted from rotate_half's halves to interleaved pairs (and the q / k
norm gains permuted alike), gate_proj -> c_fc2 (the gate), up_proj -> c_fc, down_proj -> c_proj.
"""

from __future__ import annotations

import torch

from harness.contracts.models import Qwen3Config
from harness.trainer.models.llama3 import model as llama3
from harness.trainer.models.llama3.model import LLaMA3, RMSNorm


class CausalSelfAttention(llama3.CausalSelfAttention):
    """LLaMA 3's grouped-query attention (head counts derived from c_attn's width, so a TP shard
    of whole GQA groups runs the same code) with q and k normalized per head before RoPE."""

    def __init__(self, config: Qwen3Config):
        super().__init__(config)
        self.q_norm = RMSNorm(self.head_dim, config.norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.norm_eps)

    def normalized_heads(self, q: torch.Tensor, k: torch.Tensor):
        """Each q head and each k head (B, T, heads, hd) RMS-normalized over hd, InfiniTrain's
        q_norm / k_norm on (B*T*H, D) views (causal_self_attention.cc:222-237)."""
        return self.q_norm(q), self.k_norm(k)


class Block(llama3.Block):
    """LLaMA 3's block (pre-norm residual attention and SwiGLU MLP) with Qwen3's attention."""

    attention = CausalSelfAttention


class Qwen3(LLaMA3):
    """Qwen3, or any contiguous part of it (a pipeline stage / chunk): LLaMA 3's embedding,
    RoPE table, final norm and untied head around Qwen3's blocks."""

    block = Block
