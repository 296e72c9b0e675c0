"""tiny_mixtral's mathematics for the stand-in, written from InfiniTrain feat/support_moe (b7e0760)
itself: the forward pass of its TransformerModel with the tiny Mixtral config, in float32 torch,
torch autograd for the backward, and InfiniTrain's Adam. Nothing here comes from the harness's
bundled trainer (harness.trainer), so the PyTorch baseline of a tiny_mixtral case is checked
against an independent implementation.

The model (every line below names where InfiniTrain computes it):

- token embedding ``transformer.wte.weight[x]``, no position embedding (RoPE:
  infini_train/src/nn/modules/transformer/transformer.cc:32-35, 68-71);
- per layer ``x = x + attn(rmsnorm_1(x)); x = x + moe(rmsnorm_2(x))`` (transformer.cc:97-120);
- RMSNorm ``x * rsqrt(mean(x^2, -1) + eps) * weight`` (infini_train/src/nn/modules/normalization.cc:40-44);
- attention (infini_train/src/nn/modules/transformer/causal_self_attention.cc:181-257): packed
  ``c_attn`` rows q | k | v (no bias), RoPE on interleaved (even, odd) pairs of q and k (:133-167)
  with ``freqs = 1 / theta^(2i / D)`` over positions 0..T-1 (infini_train/src/nn/modules/
  transformer/utils.cc:9-29), GQA by repeating each KV head for n_head / n_kv_head consecutive
  query heads (RepeatKV, :169-179), scores ``q k^T / sqrt(D)``, the causal mask filled with the
  float's lowest value (:241-245; the mask is transformer.cc:155-156's ``Triu(ones, 1)``), softmax,
  ``c_proj``;
- MoE (infini_train/src/nn/modules/transformer/moe/): router logits ``x W_router^T`` (router.cc:44),
  top-k of the LOGITS then a softmax over those k (moe_utils.cc:33-36: MoEConfig's
  router_pre_softmax is false, transformer_config.h:46, and tiny Mixtral's config leaves it),
  scattered into a dense [tokens, experts] map (moe_utils.cc:54); each expert sees the tokens
  routed to it in token order (moe_utils.cc:86-96, experts.cc:44-56) and computes the SwiGLU MLP
  ``c_proj(c_fc(x) * silu(c_fc2(x)))`` (infini_train/src/nn/modules/transformer/mlp.cc:90-102,
  SwiGLU = ``x * sigmoid(x)`` in infini_train/src/nn/modules/activations.cc:21-23; c_fc2 is
  Mixtral's w1 / gate, c_fc its w3 / up, c_proj its w2 / down: example/tiny_mixtral/
  checkpoint_loader.cc:155-157); the outputs weighted by their probability and summed per token
  (Unpermute, moe_utils.cc:153-168); no aux loss (MoEConfig::aux_loss_coeff is used nowhere);
- final RMSNorm, untied ``lm_head`` (transformer.cc:194-201; config.h:26 tie_weights false), mean
  cross-entropy over every token.

``router_order="softmax_then_topk"`` is the other branch of moe_utils.cc:27-31 (router_pre_softmax
true: a softmax over every expert, then its top k, not renormalised): the planted router bug
(STANDIN_PLANT_ROUTER=other_order).

bfloat16: torch.autocast over float32 parameters, as InfiniTrain's AutocastGuard casts Matmul and
Linear to the lower precision (infini_train/include/autocast.h: kLowerPrecisionOps) and keeps the
norms' Rsqrt / Pow and CrossEntropy in float32.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

ROUTER_ORDERS = ("topk_then_softmax", "softmax_then_topk")
# The lm head's logits are computed in row blocks of at most this many floats (64 MiB), each
# recomputed in the backward, so a 128256-token vocabulary fits in memory.
HEAD_BLOCK_FLOATS = 1 << 24


def layer_names(i: int, num_experts: int) -> list[str]:
    """Layer i's parameter names, as InfiniTrain's state dict (checkpoint_loader.cc:141-158)."""
    p = f"transformer.h.{i}"
    names = [f"{p}.ln_1.weight", f"{p}.attn.c_attn.weight", f"{p}.attn.c_proj.weight", f"{p}.ln_2.weight",
             f"{p}.mlp.router.weight"]
    for e in range(num_experts):
        q = f"{p}.mlp.experts.expert_{e}"
        names += [f"{q}.c_fc2.weight", f"{q}.c_fc.weight", f"{q}.c_proj.weight"]
    return names


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """normalization.cc:40-44."""
    return x * torch.rsqrt(torch.mean(torch.pow(x, 2), -1, keepdim=True) + eps) * weight


def rope_tables(head_dim: int, length: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PrecomputeFreqsCis (utils.cc:9-29), float32: cos and sin, (length, head_dim / 2)."""
    arange = torch.arange(0, head_dim, dtype=torch.float32)[0::2]
    freqs = 1.0 / torch.pow(torch.tensor(theta, dtype=torch.float32), arange / float(head_dim))
    t = torch.arange(0, length, dtype=torch.float32)
    angles = torch.outer(t, freqs)
    return torch.cos(angles), torch.sin(angles)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """ApplyRotaryEmbedding (causal_self_attention.cc:133-167) on (B, T, H, D): interleaved pairs."""
    cos = cos[None, :, None, :]
    sin = sin[None, :, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), -1).flatten(-2)


def attention(x: torch.Tensor, w_qkv: torch.Tensor, w_proj: torch.Tensor, n_head: int, n_kv_head: int,
              cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """ForwardWithRoPE (causal_self_attention.cc:181-257), one device, no bias."""
    B, T, C = x.shape
    D = C // n_head
    qkv = F.linear(x, w_qkv)
    q = qkv[..., :n_head * D].reshape(B, T, n_head, D)
    k = qkv[..., n_head * D:(n_head + n_kv_head) * D].reshape(B, T, n_kv_head, D)
    v = qkv[..., (n_head + n_kv_head) * D:].reshape(B, T, n_kv_head, D)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    rep = n_head // n_kv_head  # RepeatKV: KV head j serves query heads j*rep .. j*rep + rep - 1
    k = torch.repeat_interleave(k, rep, dim=2)
    v = torch.repeat_interleave(v, rep, dim=2)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(float(D)))
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    att = att.masked_fill(mask, torch.finfo(att.dtype).min)
    att = torch.softmax(att, -1)
    y = torch.matmul(att, v).transpose(1, 2).reshape(B, T, C)
    return F.linear(y, w_proj)


def route(x: torch.Tensor, w_router: torch.Tensor, topk: int,
          order: str = "topk_then_softmax") -> tuple[torch.Tensor, torch.Tensor]:
    """TopkRoutingWithScoreFunction (moe_utils.cc:15-59), softmax score: the dense
    [tokens, experts] probabilities and the routing map (bool)."""
    logits = F.linear(x, w_router)
    if order == "topk_then_softmax":  # router_pre_softmax false, moe_utils.cc:33-36
        top, index = torch.topk(logits, topk, dim=-1)
        probs = torch.softmax(top, -1)
    elif order == "softmax_then_topk":  # router_pre_softmax true, moe_utils.cc:27-31
        probs, index = torch.topk(torch.softmax(logits, -1), topk, dim=-1)
    else:
        raise ValueError(f"router order {order!r}: expected one of {', '.join(ROUTER_ORDERS)}")
    dense = torch.zeros_like(logits).scatter(-1, index, probs)
    routed = torch.zeros(logits.shape, dtype=torch.bool).scatter(-1, index, True)
    return dense, routed


def moe(x: torch.Tensor, P: dict, prefix: str, num_experts: int, topk: int, order: str) -> torch.Tensor:
    """MoELayer (moe_layer.cc:25-31): the router, then SequentialMLP's experts in expert order
    over their tokens in token order, combined by probability (experts.cc:33-63)."""
    shape = x.shape
    tokens = x.reshape(-1, shape[-1])
    dense, routed = route(tokens, P[f"{prefix}.router.weight"], topk, order)
    out = torch.zeros_like(tokens)
    for e in range(num_experts):
        rows = torch.nonzero(routed[:, e]).flatten()
        if rows.numel() == 0:
            continue
        q = f"{prefix}.experts.expert_{e}"
        h = tokens[rows]
        gate = F.linear(h, P[f"{q}.c_fc2.weight"])
        y = F.linear(F.linear(h, P[f"{q}.c_fc.weight"]) * (gate * torch.sigmoid(gate)), P[f"{q}.c_proj.weight"])
        out = out.index_add(0, rows, (y * dense[rows, e:e + 1]).to(out.dtype))
    return out.reshape(shape)


def _head_loss(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(F.linear(h, w).float(), y, reduction="sum")


def loss(P: dict, x: torch.Tensor, y: torch.Tensor, cfg: dict, router_order: str = "topk_then_softmax",
         bf16: bool = False) -> torch.Tensor:
    """The mean cross-entropy of the model ``P`` (InfiniTrain's parameter names) on token ids
    ``x`` (B, T) with targets ``y``; ``cfg`` the tiny Mixtral config (tiny_mixtral.RUNTIME_CONFIG's
    keys)."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        B, T = x.shape
        H, KV, E = cfg["n_head"], cfg["n_kv_head"], cfg["num_experts"]
        cos, sin = rope_tables(cfg["n_embd"] // H, T, cfg["rope_theta"])
        eps = float(np.float32(cfg["norm_eps"]))
        h = F.embedding(x, P["transformer.wte.weight"])
        for i in range(cfg["n_layer"]):
            p = f"transformer.h.{i}"
            h = h + attention(rms_norm(h, P[f"{p}.ln_1.weight"], eps), P[f"{p}.attn.c_attn.weight"],
                              P[f"{p}.attn.c_proj.weight"], H, KV, cos, sin)
            h = h + moe(rms_norm(h, P[f"{p}.ln_2.weight"], eps), P, f"{p}.mlp", E, cfg["router_topk"],
                        router_order)
        h = rms_norm(h, P["transformer.ln_f.weight"], eps).reshape(B * T, -1)
        w, targets = P["lm_head.weight"], y.reshape(-1)
        rows = max(1, HEAD_BLOCK_FLOATS // w.shape[0])
        if h.shape[0] <= rows:
            return _head_loss(h, w, targets) / targets.numel()
        total = sum(checkpoint(_head_loss, h[i:i + rows], w, targets[i:i + rows], use_reentrant=False)
                    for i in range(0, h.shape[0], rows))
        return total / targets.numel()


class Adam:
    """InfiniTrain's Adam (optimizers::Adam::Create(lr): beta1 0.9, beta2 0.999, eps 1e-8 at
    infini_train/include/optimizer.h:49-50), the float32 update of
    infini_train/src/kernels/cpu/accumulate_grad.cc:22-33; the step count t is the optimizer's,
    and a parameter without a gradient (ZeroGrad sets them to none) is skipped
    (infini_train/src/optimizer.cc:53-69)."""

    def __init__(self, params: dict, lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8):
        f = np.float32
        self.params = params
        self.lr, self.b1, self.b2, self.eps = float(f(lr)), float(f(beta1)), float(f(beta2)), float(f(eps))
        self.one_minus_b1, self.one_minus_b2 = float(f(1) - f(beta1)), float(f(1) - f(beta2))
        self.m = {k: torch.zeros_like(v) for k, v in params.items()}
        self.v = {k: torch.zeros_like(v) for k, v in params.items()}
        self.t = 0

    @torch.no_grad()
    def step(self) -> list[str]:
        """One update; the names of the parameters skipped for want of a gradient."""
        self.t += 1
        skipped = []
        # 1.0f - std::pow(float, int64_t): the power in double, the difference stored as float
        bc_m = float(np.float32(1.0 - float(self.b1) ** self.t))
        bc_v = float(np.float32(1.0 - float(self.b2) ** self.t))
        for k, p in self.params.items():
            g = p.grad
            if g is None:  # an expert no token was routed to: no gradient, Adam skips it (optimizer.cc:57-61)
                skipped.append(k)
                continue
            self.m[k].mul_(self.b1).add_(g * self.one_minus_b1)
            self.v[k].mul_(self.b2).add_(g * self.one_minus_b2 * g)
            p.sub_(self.lr * (self.m[k] / bc_m) / (torch.sqrt(self.v[k] / bc_v) + self.eps))
        return skipped

    def zero_grad(self) -> None:
        """Optimizer::ZeroGrad(set_to_none = true) (optimizer.h:22, tensor.cc:506-514)."""
        for p in self.params.values():
            p.grad = None
