"""GPT-2 as llm.c trains it, in plain PyTorch.

One readable file, nanoGPT / llm.c style: no dropout, no parallel code, no torch.distributed.
Pipeline, tensor and data parallelism are applied from outside by module name (the TP plan is
parallelize.py, beside this file; the rest is harness.trainer.parallel), so the attribute names
here are part of the contract (docs/design.md):

    wte, wpe, h.{i}.ln_1, h.{i}.attn.c_attn, h.{i}.attn.c_proj, h.{i}.ln_2,
    h.{i}.mlp.c_fc, h.{i}.mlp.gelu (no parameters), h.{i}.mlp.c_proj, ln_f, lm_head

A model *part* holds any subset of that: ``layers`` are global layer indices, kept in an
``nn.ModuleDict`` keyed by ``str(i)`` so parameter names carry the global index on every
pipeline stage.

Details that matter for matching llm.c and Hugging Face:
- LayerNorm eps 1e-5; GELU with the tanh approximation;
- c_attn is one fused Linear whose output rows are [q; k; v];
- the lm head is tied to wte. A part that holds both ends computes logits against
  ``wte.weight`` (one Parameter, one name). A part that holds the head but not the embedding
  (a last pipeline stage) owns ``lm_head.weight``, which stands for the tied wte: it is loaded
  from ``wte.weight`` and its gradient must be summed with the first stage's;
- wte has padded_vocab_size rows (llm.c pads the vocabulary) but logits use only the first
  vocab_size rows, so padded rows never win a softmax and logits are (B, T, vocab_size).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from harness.trainer.models.common import ModelPart
from harness.trainer.models.configs import GPT2Config

LAYER_NORM_EPS = 1e-5


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with a fused [q; k; v] projection.

    Tensor parallelism: the number of heads is *derived at forward time* from the actual width
    of c_attn's output (``n_local_heads = rows // (3 * head_dim)``), never read from the config.
    So after a TP plan column-shards c_attn (and row-shards c_proj), the same forward runs on
    the local shard, provided each shard's rows are its own ``[q_i; k_i; v_i]`` (whole heads of
    each). A plain contiguous column shard of the fused weight would mix q, k and v; the
    parallel code must re-arrange the rows (and bias) first.
    """

    def __init__(self, config: GPT2Config):
        super().__init__()
        self.head_dim = config.head_dim
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=True)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        qkv = self.c_attn(x)  # (B, T, 3 * n_local_heads * hd), rows [q; k; v]
        if qkv.shape[-1] % (3 * self.head_dim):
            raise ValueError(
                f"c_attn gives {qkv.shape[-1]} features: not whole [q; k; v] heads of "
                f"head_dim {self.head_dim}"
            )
        local = qkv.shape[-1] // 3
        q, k, v = qkv.split(local, dim=-1)
        # (B, T, nh, hd) -> (B, nh, T, hd); nh is whatever this (possibly sharded) layer holds
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, local)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config: GPT2Config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=True)
        # a module (no parameters) rather than F.gelu so a module-level trace sees its output
        # as InfiniTrain's `mlp.gelu` (NewGELU, transformer/mlp.cc:61); the same F.gelu call
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config: GPT2Config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=LAYER_NORM_EPS)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=LAYER_NORM_EPS)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class LMHead(nn.Module):
    """The untied stand-in for the tied head on a part without the embedding.

    ``weight`` has padded_vocab_size rows, like wte, so it loads from ``wte.weight`` as is;
    the forward uses only the first vocab_size rows.
    """

    def __init__(self, config: GPT2Config):
        super().__init__()
        self.vocab_size = config.vocab_size
        self.weight = nn.Parameter(torch.empty(config.padded_vocab_size, config.n_embd))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight[: self.vocab_size])


class TiedLMHead(nn.Module):
    """The head of a part that holds the embedding too: logits against ``wte.weight``, passed
    in. No parameters (the tied weight keeps its one name, ``wte.weight``); a module so that a
    module-level trace sees the logits as ``lm_head``, as on a last stage and in InfiniTrain."""

    def __init__(self, config: GPT2Config):
        super().__init__()
        self.vocab_size = config.vocab_size

    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.linear(x, weight[: self.vocab_size])


class GPT2(ModelPart):
    """GPT-2, or any contiguous part of it (a pipeline stage / chunk).

    forward(x): x is token ids (B, T) long when the part holds the embedding, hidden states
    (B, T, C) otherwise; returns logits (B, T, vocab_size) when it holds the head, hidden
    states (B, T, C) otherwise. A part with nothing at all returns a copy of its input.
    """

    def __init__(
        self,
        config: GPT2Config,
        layers: Iterable[int] | None = None,
        embedding: bool = True,
        final_norm: bool = True,
        lm_head: bool = True,
    ):
        super().__init__(config, layers, embedding, final_norm, lm_head)
        if self.has_embedding:
            self.wte = nn.Embedding(config.padded_vocab_size, config.n_embd)
            self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.h = nn.ModuleDict({str(i): Block(config) for i in self.layer_indices})
        if self.has_final_norm:
            self.ln_f = nn.LayerNorm(config.n_embd, eps=LAYER_NORM_EPS)
        if self.has_lm_head and not self.has_embedding:
            self.lm_head = LMHead(config)
        elif self.has_lm_head:
            # with both ends here the head is wte itself: no second Parameter, no second name
            self.lm_head = TiedLMHead(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.has_embedding:
            self.check_length(x.shape[1])
            pos = torch.arange(x.shape[1], device=x.device)
            x = self.wte(x) + self.wpe(pos)
        elif self.is_empty:
            # an empty pipeline chunk: identity, as a fresh tensor (no aliasing of the input)
            return x.clone()
        for block in self.h.values():
            x = block(x)
        if self.has_final_norm:
            x = self.ln_f(x)
        if self.has_lm_head:
            if self.has_embedding:
                x = self.lm_head(x, self.wte.weight)
            else:
                x = self.lm_head(x)
        return x

    def source_name(self, name: str) -> str:
        """``lm_head.weight`` (the tied head on a part without wte) is ``wte.weight``."""
        return "wte.weight" if name == "lm_head.weight" else name
