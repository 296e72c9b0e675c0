"""The fused c_attn under tensor parallelism, checked without torchrun: the re-arranged rows,
sharded contiguously as ColwiseParallel does, give each shard whole [q_r; k_r; v_r] heads, and the
shards' attention outputs (through row-sharded c_proj) sum to the full layer's."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from harness.trainer.models.configs import GPT2Config, LLaMA3Config
from harness.trainer.parallel.tensor_parallel import (
    inverse_permutation,
    qkv_shard_permutation,
)

GPT2 = GPT2Config(block_size=16, vocab_size=32, n_layer=1, n_head=4, n_embd=32, padded_vocab_size=32)
LLAMA = LLaMA3Config(block_size=16, vocab_size=32, n_layer=1, n_head=8, n_kv_head=4, n_embd=32,
                     ffn_dim_multiplier=1.0, multiple_of=8)


def test_permutation_layout_and_inverse():
    # n_head 4, kv 2, hd 1, tp 2: q rows 0..3, k rows 4..5, v rows 6..7
    perm = qkv_shard_permutation(4, 2, 1, 2)
    assert perm.tolist() == [0, 1, 4, 6, 2, 3, 5, 7]
    x = torch.arange(8)
    assert torch.equal(x[perm][inverse_permutation(perm)], x)
    with pytest.raises(ValueError):
        qkv_shard_permutation(4, 2, 1, 4)


def _attention(model: str):
    torch.manual_seed(0)
    if model == "gpt2":
        from harness.trainer.models.gpt2.model import CausalSelfAttention

        config = GPT2
    else:
        from harness.trainer.models.llama3.model import CausalSelfAttention

        config = LLAMA
    attn = CausalSelfAttention(config)
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.3)
    return config, attn


def _run(model, attn, x, config):
    if model == "gpt2":
        return attn(x)
    from harness.trainer.models.llama3.model import precompute_rope

    rope = precompute_rope(config.head_dim, x.shape[1], config.rope_theta, config.use_scaled_rope)
    return attn(x, rope)


def _shard(attn, rows: torch.Tensor, tp: int, r: int) -> nn.Module:
    shard = copy.deepcopy(attn)
    W = attn.c_attn.weight[rows]
    local = W.shape[0] // tp
    shard.c_attn = nn.Linear(W.shape[1], local, bias=attn.c_attn.bias is not None)
    shard.c_attn.weight = nn.Parameter(W[r * local : (r + 1) * local].clone())
    if attn.c_attn.bias is not None:
        shard.c_attn.bias = nn.Parameter(attn.c_attn.bias[rows][r * local : (r + 1) * local].clone())
    P = attn.c_proj.weight
    cols = P.shape[1] // tp
    shard.c_proj = nn.Linear(cols, P.shape[0], bias=False)
    shard.c_proj.weight = nn.Parameter(P[:, r * cols : (r + 1) * cols].clone())
    return shard


@pytest.mark.parametrize("model", ["gpt2", "llama3"])
@pytest.mark.parametrize("tp", [2, 4])
def test_rearranged_shards_reproduce_full_attention(model, tp):
    config, attn = _attention(model)
    n_kv = getattr(config, "n_kv_head", config.n_head)
    x = torch.randn(2, 8, config.n_embd)
    with torch.no_grad():
        full = _run(model, attn, x, config)
        bias = attn.c_proj.bias if attn.c_proj.bias is not None else 0
        perm = qkv_shard_permutation(config.n_head, n_kv, config.head_dim, tp)
        total = sum(
            _run(model, _shard(attn, perm, tp, r), x, config) for r in range(tp)
        ) + bias
        assert torch.allclose(total, full, atol=1e-5)
        # the trap: a plain contiguous shard of the fused rows mixes q, k and v
        naive = sum(
            _run(model, _shard(attn, torch.arange(attn.c_attn.weight.shape[0]), tp, r), x, config)
            for r in range(tp)
        ) + bias
        assert not torch.allclose(naive, full, atol=1e-3)
