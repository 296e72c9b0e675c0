"""tiny Mixtral as InfiniTrain feat/support_moe's ``tiny_mixtral`` computes it, in plain PyTorch.

One readable file, nanoGPT style: no dropout, no parallel code, no torch.distributed. Parallelism
is applied from outside by module name (parallelize.py, beside this file), so the attribute names
are part of the contract; they are the checkpoint's keys (InfiniTrain's without ``transformer.``,
feat/support_moe@b7e0760:example/tiny_mixtral/checkpoint_loader.cc:139-161):

    wte, h.{i}.ln_1, h.{i}.attn.c_attn, h.{i}.attn.c_proj, h.{i}.ln_2,
    h.{i}.mlp.router, h.{i}.mlp.experts.expert_{e}.c_fc / .c_fc2 / .c_proj, ln_f, lm_head

A LLaMA block whose MLP is a top-k mixture of experts. The attention, RoPE, RMSNorm and each
expert are LLaMA 3's modules (harness.trainer.models.llama3.model), imported because they are
the same arithmetic as InfiniTrain's (harness.contracts.mixtral_facts: every choice with its
source line):

| piece | what it computes | InfiniTrain (feat/support_moe@b7e0760) |
| --- | --- | --- |
| ln_1, ln_2, ln_f | RMSNorm x * rsqrt(mean(x^2) + norm_eps) * w | normalization.cc:40-43 |
| attn | fused [q, k, v] rows, GQA (kv head j serves q heads j*r .. j*r+r-1), causal softmax / sqrt(hd) | transformer/causal_self_attention.cc:204-247 |
| RoPE | interleaved pairs, 1 / rope_theta^(2j/hd) in float32, never scaled | causal_self_attention.cc:142-166, transformer/utils.cc:13-26 |
| mlp.router | bias-free Linear C -> num_experts on ln_2's output | moe/router.cc:23-44 |
| routing | top-k of the raw logits, softmax over those k | moe/moe_utils.cc:33-36 |
| experts | SwiGLU c_proj(c_fc(x) * silu(c_fc2(x))), width moe_ffn_hidden_size | transformer/mlp.cc:41-46, 90-101 |
| combine | sum over a token's k experts of weight * output, experts in index order | moe/moe_utils.cc:153-167 |
| - | no aux loss, no capacity / dropped tokens, no biases, untied head | transformer_config.h:47-51, config.h:24-26 |

Routing by index: an expert runs on exactly the tokens that chose it, and one that no token chose
is not run (moe/experts.cc:47-50), so its weights get no gradient (``.grad`` stays None) as in
InfiniTrain. Mixtral's "softmax over all experts, then renormalise the top k" gives the same
weights (the common factor cancels) and the same zero gradient on an unselected logit.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from harness.trainer.models.common import ModelPart
from harness.trainer.models.configs import MixtralConfig
from harness.trainer.models.llama3.model import MLP, CausalSelfAttention, RMSNorm, precompute_rope


class MoE(nn.Module):
    """The mixture of experts: ``router`` picks each token's ``router_topk`` experts, each a
    SwiGLU MLP of width moe_ffn_hidden_size (LLaMA 3's MLP, whose ``ffn_dim`` the config gives)."""

    def __init__(self, config: MixtralConfig):
        super().__init__()
        self.top_k = config.router_topk
        self.router = nn.Linear(config.n_embd, config.num_experts, bias=False)
        self.experts = nn.ModuleDict(
            {f"expert_{e}": MLP(config) for e in range(config.num_experts)}
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])  # (B*T, C)
        logits = self.router(tokens)  # (B*T, num_experts)
        # top-k of the logits (largest first), then the softmax over the k chosen ones
        top_logits, top_experts = logits.topk(self.top_k, dim=-1)
        weights = F.softmax(top_logits, dim=-1)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts.values()):
            # the tokens (ascending) that chose expert e, and at which of their k places
            token, place = torch.nonzero(top_experts == e, as_tuple=True)
            if token.numel() == 0:
                continue  # not run: no gradient for its weights this step
            y = expert(tokens[token]) * weights[token, place, None]
            out = out.index_add(0, token, y.to(out.dtype))
        return out.view_as(x)


class Block(nn.Module):
    def __init__(self, config: MixtralConfig):
        super().__init__()
        self.ln_1 = RMSNorm(config.n_embd, config.norm_eps)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = RMSNorm(config.n_embd, config.norm_eps)
        self.mlp = MoE(config)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), rope)
        x = x + self.mlp(self.ln_2(x))
        return x


class Mixtral(ModelPart):
    """tiny Mixtral, or any contiguous part of it (a pipeline stage / chunk).

    forward(x): token ids (B, T) when the part holds the embedding, hidden states (B, T, C)
    otherwise; logits (B, T, vocab_size) when it holds the head, hidden states otherwise. A part
    with nothing at all returns a copy of its input.
    """

    def __init__(
        self,
        config: MixtralConfig,
        layers: Iterable[int] | None = None,
        embedding: bool = True,
        final_norm: bool = True,
        lm_head: bool = True,
    ):
        super().__init__(config, layers, embedding, final_norm, lm_head)
        if self.has_embedding:
            self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.h = nn.ModuleDict({str(i): Block(config) for i in self.layer_indices})
        if self.has_final_norm:
            self.ln_f = RMSNorm(config.n_embd, config.norm_eps)
        if self.has_lm_head:
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # RoPE table: a non-persistent buffer (not a parameter, not in state_dict)
        self.register_buffer("rope", self._compute_rope(None), persistent=False)

    def _compute_rope(self, device: torch.device | str | None,
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
        c = self.config  # rope_theta from the header; use_scaled_rope is always False here
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
        # Module.to(dtype) casts float buffers too: a table at another precision or place is
        # recomputed (RoPE runs in float32, float64 in a float64 run), never used as cast.
        if self.rope.dtype != dtype or self.rope.device != device:
            self.init_buffers(device, dtype)
        return self.rope[:T]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.has_embedding:
            x = self.wte(x)
        elif self.is_empty:
            return x.clone()  # an empty pipeline chunk: identity, not aliasing its input
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
