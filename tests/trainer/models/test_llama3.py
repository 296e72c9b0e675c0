"""LLaMA 3 against an independent implementation: Hugging Face transformers' LlamaForCausalLM.

HF stores q_proj / k_proj rows permuted for its rotate_half RoPE (its converter permutes Meta's
interleaved weights); converting to llm.c / Meta layout inverts that permutation. Written as an
llm.c checkpoint and read back, logits and every parameter's gradient must then agree, with and
without the llama3 RoPE scaling.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from harness.contracts.llmc import read_checkpoint, write_checkpoint
from harness.trainer.models import LLaMA3, LLaMA3Config, build_model, load_weights
from harness.trainer.models.llama3.model import rope_frequencies
from tests.trainer.models.hf_parity import assert_matches_hf, interleaved_rows

transformers = pytest.importorskip("transformers")

V, C, N_HEAD, N_KV, N_LAYER, BLOCK = 100, 64, 4, 2, 2, 64
HD = C // N_HEAD


def our_config(theta: float, scaled: bool) -> LLaMA3Config:
    return LLaMA3Config(
        block_size=BLOCK,
        vocab_size=V,
        n_layer=N_LAYER,
        n_head=N_HEAD,
        n_kv_head=N_KV,
        n_embd=C,
        multiple_of=32,
        norm_eps=1e-5,
        rope_theta=theta,
        use_scaled_rope=scaled,
    )


def make_hf_model(config: LLaMA3Config, seed: int = 0):
    torch.manual_seed(seed)
    rope = {"rope_type": "default", "rope_theta": config.rope_theta}
    if config.use_scaled_rope:
        rope = {
            "rope_type": "llama3",
            "rope_theta": config.rope_theta,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }
    hf_config = transformers.LlamaConfig(
        vocab_size=V,
        hidden_size=C,
        intermediate_size=config.ffn_dim,
        num_hidden_layers=N_LAYER,
        num_attention_heads=N_HEAD,
        num_key_value_heads=N_KV,
        # nothing is sized by it in HF's LLaMA; > 8192 keeps its llama3-rope check quiet
        max_position_embeddings=131072,
        rms_norm_eps=config.norm_eps,
        rope_parameters=rope,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
    )
    hf = transformers.LlamaForCausalLM._from_config(hf_config, attn_implementation="eager")
    hf.eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    return hf


def hf_named(hf, getter) -> dict[str, torch.Tensor]:
    """HF tensors (weights or grads, via getter) under our names, q/k rows un-permuted."""
    t = {k: getter(p) for k, p in hf.named_parameters()}
    out = {
        "wte.weight": t["model.embed_tokens.weight"],
        "ln_f.weight": t["model.norm.weight"],
        "lm_head.weight": t["lm_head.weight"],
    }
    for i in range(N_LAYER):
        p = f"model.layers.{i}."
        q = interleaved_rows(t[p + "self_attn.q_proj.weight"], N_HEAD)
        k = interleaved_rows(t[p + "self_attn.k_proj.weight"], N_KV)
        out[f"h.{i}.attn.c_attn.weight"] = torch.cat([q, k, t[p + "self_attn.v_proj.weight"]])
        out[f"h.{i}.attn.c_proj.weight"] = t[p + "self_attn.o_proj.weight"]
        out[f"h.{i}.ln_1.weight"] = t[p + "input_layernorm.weight"]
        out[f"h.{i}.ln_2.weight"] = t[p + "post_attention_layernorm.weight"]
        out[f"h.{i}.mlp.c_fc.weight"] = t[p + "mlp.up_proj.weight"]
        out[f"h.{i}.mlp.c_fc2.weight"] = t[p + "mlp.gate_proj.weight"]  # the gate
        out[f"h.{i}.mlp.c_proj.weight"] = t[p + "mlp.down_proj.weight"]
    return out


CASES = [(500000.0, True), (10000.0, True), (10000.0, False)]


@pytest.mark.parametrize(("theta", "scaled"), CASES)
def test_llama3_matches_hf_logits_and_grads(theta, scaled, tmp_path):
    config = our_config(theta, scaled)
    hf = make_hf_model(config)
    tensors = {k: v.detach().numpy().copy() for k, v in hf_named(hf, lambda p: p).items()}
    # through an llm.c file, as the trainer loads it (the header stores eps / theta as float32)
    checkpoint = read_checkpoint(write_checkpoint(tmp_path / "hf.bin", config, tensors))
    assert checkpoint.config.use_scaled_rope == scaled
    ours = build_model(checkpoint.config)
    load_weights(ours, checkpoint.tensors)

    g = torch.Generator().manual_seed(2)
    T = 40
    idx = torch.randint(0, V, (2, T), generator=g)
    targets = torch.randint(0, V, (2, T), generator=g)
    hf_logits = assert_matches_hf(ours, hf, hf_named, idx, targets)

    # the comparison is sensitive to the RoPE variant: the other one is far off at this T
    other = build_model(dataclasses.replace(config, use_scaled_rope=not scaled))
    load_weights(other, tensors)
    assert (other(idx) - hf_logits).abs().max() > 1e-2


@pytest.mark.parametrize(("theta", "scaled"), CASES)
def test_rope_frequencies_match_hf(theta, scaled):
    hf = make_hf_model(our_config(theta, scaled))
    inv_freq = hf.model.rotary_emb.inv_freq
    torch.testing.assert_close(rope_frequencies(HD, theta, scaled), inv_freq, rtol=1e-6, atol=0)


def test_rope_scaling_covers_all_three_regimes():
    # with hd 16 and theta 500000 the frequencies fall in all three bands of apply_scaling:
    # kept (short wavelengths), divided by 8 (long), and interpolated (between)
    plain = rope_frequencies(HD, 500000.0, False)
    scaled = rope_frequencies(HD, 500000.0, True)
    ratio = plain / scaled
    assert (ratio == 1).any() and torch.isclose(ratio, torch.tensor(8.0)).any()
    assert ((ratio > 1.01) & (ratio < 7.99)).any()


def test_rope_buffer_is_not_state_and_survives_dtype_casts():
    model = LLaMA3(our_config(500000.0, True))
    model.init_weights(0)
    assert not any("rope" in n for n in model.state_dict())
    assert not any("rope" in n for n, _ in model.named_parameters())
    idx = torch.randint(0, V, (2, 8))
    ref = model(idx)
    model.to(torch.bfloat16)  # casts float buffers too; the table must come back in float32
    out = model(idx)
    assert model.rope.dtype == torch.float32
    assert out.dtype == torch.bfloat16 and out.shape == (2, 8, V)
    assert (out.float() - ref).abs().max() < 0.25 * ref.abs().max()


def test_llama3_sequence_longer_than_block_is_an_error():
    model = LLaMA3(our_config(500000.0, True))
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, BLOCK + 1, dtype=torch.long))


def test_names_and_shapes_follow_the_design_contract():
    config = our_config(500000.0, True)
    shapes = {n: tuple(p.shape) for n, p in LLaMA3(config).named_parameters()}
    ffn, kvd = config.ffn_dim, N_KV * HD
    expected = {"wte.weight": (V, C), "ln_f.weight": (C,), "lm_head.weight": (V, C)}
    for i in range(N_LAYER):
        expected.update(
            {
                f"h.{i}.ln_1.weight": (C,),
                f"h.{i}.attn.c_attn.weight": (C + 2 * kvd, C),
                f"h.{i}.attn.c_proj.weight": (C, C),
                f"h.{i}.ln_2.weight": (C,),
                f"h.{i}.mlp.c_fc.weight": (ffn, C),
                f"h.{i}.mlp.c_fc2.weight": (ffn, C),
                f"h.{i}.mlp.c_proj.weight": (C, ffn),
            }
        )
    assert shapes == expected
    assert np.prod(shapes["wte.weight"]) == V * C
