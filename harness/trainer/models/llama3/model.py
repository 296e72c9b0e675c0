"""LLaMA 3 as Meta's reference code and llm.c's train_llama3.py define it, in plain PyTorch.

One readable file: no dropout, no parallel code, no torch.distributed. Parallelism is applied
from outside by module name (parallelize.py, beside this file), so the attribute names are part
of the contract (docs/design.md):

    wte, h.{i}.ln_1, h.{i}.attn.c_attn, h.{i}.attn.c_proj, h.{i}.ln_2,
    h.{i}.mlp.c_fc, h.{i}.mlp.c_fc2, h.{i}.mlp.silu (no parameters), h.{i}.mlp.c_proj, ln_f,
    lm_head

Details that matter for matching llm.c exports (and, after converting, Hugging Face):
- RMSNorm with the file's eps, computed in float32 and cast back (Meta's ``x.float() ...
  .type_as(x)``), weight only;
- c_attn is one fused Linear whose output rows are [q (C) | k (kv*hd) | v (kv*hd)];
- RoPE on *interleaved* pairs (x[2j], x[2j+1]) rotated by frequency j, i.e. Meta's complex
  multiply (Hugging Face's rotate_half convention uses q/k rows permuted from these), with the
  llama3 frequency scaling (factor 8, low 1, high 4, original context 8192) when
  use_scaled_rope is set;
- grouped-query attention: each of the n_kv_head k/v heads serves n_head / n_kv_head q heads;
- SwiGLU where c_fc2 is the gate: ``c_proj(silu(c_fc2(x)) * c_fc(x))``;
- untied lm head (V x C).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from harness.trainer.models.common import ModelPart
from harness.trainer.models.configs import LLaMA3Config

# llama3 RoPE frequency scaling, as Meta's apply_scaling hard-codes it
ROPE_SCALE_FACTOR = 8.0
ROPE_LOW_FREQ_FACTOR = 1.0
ROPE_HIGH_FREQ_FACTOR = 4.0
ROPE_OLD_CONTEXT_LEN = 8192


def apply_rope_scaling(freqs: torch.Tensor) -> torch.Tensor:
    """Meta's llama3 ``apply_scaling``: keep high frequencies, divide low ones by the factor,
    interpolate smoothly in between."""
    low_freq_wavelen = ROPE_OLD_CONTEXT_LEN / ROPE_LOW_FREQ_FACTOR
    high_freq_wavelen = ROPE_OLD_CONTEXT_LEN / ROPE_HIGH_FREQ_FACTOR
    wavelen = 2 * math.pi / freqs
    smooth = (ROPE_OLD_CONTEXT_LEN / wavelen - ROPE_LOW_FREQ_FACTOR) / (
        ROPE_HIGH_FREQ_FACTOR - ROPE_LOW_FREQ_FACTOR
    )
    smoothed = (1 - smooth) * freqs / ROPE_SCALE_FACTOR + smooth * freqs
    return torch.where(
        wavelen < high_freq_wavelen,
        freqs,
        torch.where(wavelen > low_freq_wavelen, freqs / ROPE_SCALE_FACTOR, smoothed),
    )


def rope_frequencies(
    head_dim: int, theta: float, use_scaled: bool, device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The head_dim/2 rotation frequencies theta^(-2j/hd), float32 (float64 for a float64
    run), llama3-scaled if asked."""
    exponents = torch.arange(0, head_dim, 2, device=device)[: head_dim // 2].to(dtype) / head_dim
    freqs = 1.0 / (theta**exponents)
    return apply_rope_scaling(freqs) if use_scaled else freqs


def precompute_rope(
    head_dim: int,
    end: int,
    theta: float,
    use_scaled: bool,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """cos / sin of position * frequency for positions 0..end-1: float32 (end, head_dim/2, 2).

    The same numbers as Meta's ``precompute_freqs_cis`` (which stores them as complex64).
    `dtype` float64: the table of a float64 run (the calibration's oracle), computed in float64.
    """
    freqs = rope_frequencies(head_dim, theta, use_scaled, device, dtype)
    t = torch.arange(end, device=device, dtype=dtype)
    angles = torch.outer(t, freqs)
    return torch.stack((angles.cos(), angles.sin()), dim=-1)


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of x (B, T, nh, hd) by rope (T, hd/2, 2), in float32.

    Pair j is (x[..., 2j], x[..., 2j+1]) seen as a complex number times exp(i * t * f_j):
    exactly Meta's ``view_as_complex`` multiply, written with real arithmetic.
    """
    xf = _widened(x).reshape(*x.shape[:-1], -1, 2)
    x0, x1 = xf[..., 0], xf[..., 1]
    cos = rope[..., 0][None, :, None, :]
    sin = rope[..., 1][None, :, None, :]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.flatten(-2).type_as(x)


def _widened(x: torch.Tensor) -> torch.Tensor:
    """x in float32 for the norm and RoPE; a float64 run's (the oracle) stays float64."""
    return x if x.dtype == torch.float64 else x.float()


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = _widened(x)
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


class CausalSelfAttention(nn.Module):
    """Grouped-query causal self-attention with RoPE and a fused [q | k | v] projection.

    Tensor parallelism: head counts are *derived at forward time* from the actual width of
    c_attn's output, never read from the config. With hd and n_rep = n_head / n_kv_head fixed,
    rows = hd * (n_local_q + 2 * n_local_kv) and n_local_q = n_rep * n_local_kv, so
    n_local_kv = rows // (hd * (n_rep + 2)). After a TP plan column-shards c_attn (and
    row-shards c_proj) the same forward runs on the local shard, provided each shard's rows
    are its own ``[q_i | k_i | v_i]``: the q heads of its kv groups, then those kv heads' k
    rows, then their v rows. A plain contiguous column shard of the fused weight would mix q,
    k and v; the parallel code must re-arrange the rows first.
    """

    def __init__(self, config: LLaMA3Config):
        super().__init__()
        self.head_dim = config.head_dim
        self.n_rep = config.n_head // config.n_kv_head
        kv_rows = 2 * config.n_kv_head * self.head_dim
        self.c_attn = nn.Linear(config.n_embd, config.n_embd + kv_rows, bias=False)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        qkv = self.c_attn(x)
        group = self.head_dim * (self.n_rep + 2)  # one kv head with its n_rep q heads
        if qkv.shape[-1] % group:
            raise ValueError(
                f"c_attn gives {qkv.shape[-1]} features: not whole GQA groups of {group} "
                f"({self.n_rep} q heads + k + v, head_dim {self.head_dim})"
            )
        n_kv = qkv.shape[-1] // group
        kv_width = n_kv * self.head_dim
        q, k, v = qkv.split([self.n_rep * kv_width, kv_width, kv_width], dim=-1)
        q, k = self.normalized_heads(q.view(B, T, -1, self.head_dim),
                                     k.view(B, T, -1, self.head_dim))
        v = v.view(B, T, -1, self.head_dim)
        q = apply_rope(q, rope)
        k = apply_rope(k, rope)
        # GQA: q head h uses kv head h // n_rep (as Meta's repeat_kv)
        k = k.repeat_interleave(self.n_rep, dim=2)
        v = v.repeat_interleave(self.n_rep, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hd)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, -1)
        return self.c_proj(y)


    def normalized_heads(self, q: torch.Tensor, k: torch.Tensor):
        """q and k (B, T, heads, hd) as RoPE receives them: as projected in LLaMA 3 (qwen3
        normalizes each head here)."""
        return q, k


class MLP(nn.Module):
    def __init__(self, config: LLaMA3Config):
        super().__init__()
        ffn = config.ffn_dim
        self.c_fc = nn.Linear(config.n_embd, ffn, bias=False)
        self.c_fc2 = nn.Linear(config.n_embd, ffn, bias=False)  # the SwiGLU gate
        # a module (no parameters) rather than F.silu so a module-level trace sees the gate as
        # InfiniTrain's `mlp.silu` (transformer/mlp.cc:63, applied to c_fc2's output at :88)
        self.silu = nn.SiLU()
        self.c_proj = nn.Linear(ffn, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # InfiniTrain's call order (mlp.cc:84-92: c_fc, c_fc2, silu), so the traces' forward
        # orders agree; the product is the same elementwise multiply as before
        up = self.c_fc(x)
        gate = self.silu(self.c_fc2(x))
        return self.c_proj(gate * up)


class Block(nn.Module):
    attention = CausalSelfAttention  # a family with LLaMA 3's block and its own attention: qwen3

    def __init__(self, config: LLaMA3Config):
        super().__init__()
        self.ln_1 = RMSNorm(config.n_embd, config.norm_eps)
        self.attn = self.attention(config)
        self.ln_2 = RMSNorm(config.n_embd, config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), rope)
        x = x + self.mlp(self.ln_2(x))
        return x


class LLaMA3(ModelPart):
    """LLaMA 3, or any contiguous part of it (a pipeline stage / chunk).

    forward(x): x is token ids (B, T) long when the part holds the embedding, hidden states
    (B, T, C) otherwise; returns logits (B, T, vocab_size) when it holds the head, hidden
    states (B, T, C) otherwise. A part with nothing at all returns a copy of its input.
    """

    block = Block  # a family with LLaMA 3's skeleton and its own blocks (qwen3) names its own

    def __init__(
        self,
        config: LLaMA3Config,
        layers: Iterable[int] | None = None,
        embedding: bool = True,
        final_norm: bool = True,
        lm_head: bool = True,
    ):
        super().__init__(config, layers, embedding, final_norm, lm_head)
        if self.has_embedding:
            self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.h = nn.ModuleDict({str(i): self.block(config) for i in self.layer_indices})
        if self.has_final_norm:
            self.ln_f = RMSNorm(config.n_embd, config.norm_eps)
        if self.has_lm_head:
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # RoPE table: a non-persistent float32 buffer (not a parameter, not in state_dict)
        self.register_buffer("rope", self._compute_rope(None), persistent=False)

    def _compute_rope(self, device: torch.device | str | None,
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
        c = self.config
        return precompute_rope(c.head_dim, c.block_size, c.rope_theta, c.use_scaled_rope, device,
                               dtype)

    def init_buffers(self, device: torch.device | str | None = None,
                     dtype: torch.dtype = torch.float32) -> None:
        """Recompute the RoPE table (after ``to_empty()`` from the meta device, for example)."""
        if device is None:
            device = self.rope.device
        self.rope = self._compute_rope(device, dtype)

    def _rope_for(self, T: int, device: torch.device,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
        self.check_length(T)
        # Module.to(dtype) casts float buffers too; RoPE is always applied in float32 (float64
        # in a float64 run), so a cast (or moved, or meta) table is recomputed rather than used
        # at another precision.
        if self.rope.dtype != dtype or self.rope.device != device:
            self.init_buffers(device, dtype)
        return self.rope[:T]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.has_embedding:
            x = self.wte(x)
        elif self.is_empty:
            # an empty pipeline chunk: identity, as a fresh tensor (no aliasing of the input)
            return x.clone()
        if self.h:
            wide = torch.float64 if x.dtype == torch.float64 else torch.float32
            rope = self._rope_for(x.shape[1], x.device, wide)
            for block in self.h.values():
                x = block(x, rope)
        if self.has_final_norm:
            x = self.ln_f(x)
        if self.has_lm_head:
            x = self.lm_head(x)
        return x

    def init_weights(self, seed: int = 0) -> None:
        """ModelPart's name-seeded init, and a fresh RoPE table."""
        super().init_weights(seed)
        self.init_buffers()

