"""Qwen3 against an independent implementation: Hugging Face transformers' Qwen3ForCausalLM.

The bundled Qwen3 is what InfiniTrain's ``qwen3`` program computes (harness/trainer/models/
qwen3/model.py). HF rotates q / k by rotate_half (each head's first and second halves), the
program by interleaved pairs, so converting HF's weights permutes each head's q and k rows, and
the per-head q / k norm gains alike (an RMS norm does not care about the order of its inputs;
its gains do). Written as the program's checkpoint and read back, logits, loss and every
parameter's gradient must then agree.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from harness.contracts.llmc import checkpoint_info, read_checkpoint, write_checkpoint
from harness.contracts.models import QWEN3_SPEC, Qwen3Config
from harness.trainer.models import build_model, load_weights
from harness.trainer.models.qwen3.model import Qwen3
from tests.trainer.models.hf_parity import assert_matches_hf, interleaved_rows

transformers = pytest.importorskip("transformers")

V, C, N_HEAD, N_KV, N_LAYER, BLOCK = 100, 64, 4, 2, 2, 64
HD = C // N_HEAD


def our_config(theta: float = 1000000.0) -> Qwen3Config:
    return Qwen3Config(block_size=BLOCK, vocab_size=V, n_layer=N_LAYER, n_head=N_HEAD,
                       n_kv_head=N_KV, n_embd=C, norm_eps=1e-6, rope_theta=theta)


def make_hf_model(config: Qwen3Config, seed: int = 0):
    torch.manual_seed(seed)
    hf_config = transformers.Qwen3Config(
        vocab_size=V, hidden_size=C, intermediate_size=config.ffn_dim,
        num_hidden_layers=N_LAYER, num_attention_heads=N_HEAD, num_key_value_heads=N_KV,
        head_dim=HD, max_position_embeddings=BLOCK, rms_norm_eps=config.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        tie_word_embeddings=False, attention_bias=False, use_sliding_window=False,
    )
    hf = transformers.Qwen3ForCausalLM._from_config(hf_config, attn_implementation="eager")
    hf.eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    return hf


def hf_named(hf, getter) -> dict[str, torch.Tensor]:
    """HF tensors (weights or grads, via getter) under the program's names, converted."""
    t = {k: getter(p) for k, p in hf.named_parameters()}
    out = {"wte.weight": t["model.embed_tokens.weight"], "ln_f.weight": t["model.norm.weight"],
           "lm_head.weight": t["lm_head.weight"]}
    for i in range(N_LAYER):
        p = f"model.layers.{i}."
        q = interleaved_rows(t[p + "self_attn.q_proj.weight"], N_HEAD)
        k = interleaved_rows(t[p + "self_attn.k_proj.weight"], N_KV)
        out[f"h.{i}.attn.c_attn.weight"] = torch.cat([q, k, t[p + "self_attn.v_proj.weight"]])
        out[f"h.{i}.attn.q_norm.weight"] = interleaved_rows(
            t[p + "self_attn.q_norm.weight"], 1)
        out[f"h.{i}.attn.k_norm.weight"] = interleaved_rows(
            t[p + "self_attn.k_norm.weight"], 1)
        out[f"h.{i}.attn.c_proj.weight"] = t[p + "self_attn.o_proj.weight"]
        out[f"h.{i}.ln_1.weight"] = t[p + "input_layernorm.weight"]
        out[f"h.{i}.ln_2.weight"] = t[p + "post_attention_layernorm.weight"]
        out[f"h.{i}.mlp.c_fc.weight"] = t[p + "mlp.up_proj.weight"]
        out[f"h.{i}.mlp.c_fc2.weight"] = t[p + "mlp.gate_proj.weight"]  # the gate
        out[f"h.{i}.mlp.c_proj.weight"] = t[p + "mlp.down_proj.weight"]
    return out


def _batch(T: int = 40):
    g = torch.Generator().manual_seed(2)
    return torch.randint(0, V, (2, T), generator=g), torch.randint(0, V, (2, T), generator=g)


@pytest.mark.parametrize("theta", [1000000.0, 10000.0])
def test_qwen3_matches_hf_logits_loss_and_grads(theta, tmp_path):
    config = our_config(theta)
    hf = make_hf_model(config)
    tensors = {k: v.detach().numpy().copy() for k, v in hf_named(hf, lambda p: p).items()}
    # through the program's checkpoint file, as the trainer loads it
    checkpoint = read_checkpoint(write_checkpoint(tmp_path / "hf.bin", config, tensors))
    assert checkpoint.model == "qwen3" and checkpoint.config == config
    ours = build_model(checkpoint.config)
    assert isinstance(ours, Qwen3)
    load_weights(ours, checkpoint.tensors)

    idx, targets = _batch()
    assert_matches_hf(ours, hf, hf_named, idx, targets, grad_norm=True)


def test_the_q_and_k_norms_and_their_gain_order_are_what_makes_it_qwen3():
    """The parity above needs the q / k norms, and their gains permuted like the rows: with HF's
    gain order, or with unit gains (LLaMA 3's attention), the logits are far from HF's."""
    config = our_config()
    hf = make_hf_model(config)
    tensors = {k: v.detach() for k, v in hf_named(hf, lambda p: p).items()}
    idx, _ = _batch()
    hf_logits = hf(input_ids=idx).logits
    for gains in ("hf order", "unit"):
        ours = build_model(config)
        load_weights(ours, {**tensors, **{
            f"h.{i}.attn.{n}_norm.weight":
                hf.model.layers[i].self_attn.get_submodule(f"{n}_norm").weight.detach()
                if gains == "hf order" else torch.ones(HD)
            for i in range(N_LAYER) for n in "qk"}})
        assert (ours(idx) - hf_logits).abs().max() > 1e-3, gains


def test_names_and_shapes_follow_the_checkpoint():
    config = our_config()
    shapes = {n: tuple(p.shape) for n, p in Qwen3(config).named_parameters()}
    from harness.contracts.llmc import parameter_shapes
    assert shapes == parameter_shapes(config)
    assert shapes["h.1.attn.q_norm.weight"] == (HD,) and shapes["h.0.mlp.c_fc2.weight"] == (3 * C, C)


def test_the_file_is_read_as_the_program_reads_it(tmp_path):
    """Byte offsets as example/qwen3/checkpoint_loader.cc reads them (feat/add_Qwen3-8B@
    a3f84f8: header 256 int32; wte; every ln_1; (q_norm, k_norm) of layer 0, of layer 1, ...;
    every c_attn; every c_proj; every ln_2; every c_fc; every c_fc2; every c_proj; ln_f;
    lm_head), computed here independently of the layout code."""
    config = our_config()
    tensors = {n: np.full(s, float(i), dtype=np.float32)
               for i, (n, s) in enumerate(sorted(
                   {n: tuple(p.shape) for n, p in Qwen3(config).named_parameters()}.items()))}
    path = write_checkpoint(tmp_path / "q.bin", config, tensors)
    raw = np.fromfile(path, dtype="<f4", offset=1024)
    header = np.fromfile(path, dtype="<i4", count=256)
    assert list(header[:8]) == [20240804, 3, BLOCK, V, N_LAYER, N_HEAD, N_KV, C]
    assert header[8] == 0  # ffn_dim_multiplier 0.0: the loader sizes the MLP 3 * n_embd
    order = ["wte.weight"] + [f"h.{i}.ln_1.weight" for i in range(N_LAYER)]
    order += [f"h.{i}.attn.{n}_norm.weight" for i in range(N_LAYER) for n in "qk"]
    for name in ("attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_fc2", "mlp.c_proj"):
        order += [f"h.{i}.{name}.weight" for i in range(N_LAYER)]
    order += ["ln_f.weight", "lm_head.weight"]
    offset = 0
    for name in order:
        size = tensors[name].size
        assert (raw[offset:offset + size] == tensors[name].ravel()).all(), name
        offset += size
    assert offset == raw.size == checkpoint_info(path).num_parameters


def test_a_header_the_facts_do_not_know_is_one_line(tmp_path):
    from harness.contracts.llmc import LlmcFormatError
    config = our_config()
    good = write_checkpoint(tmp_path / "q.bin", config,
                            {n: np.zeros(s, np.float32) for n, s in
                             {n: tuple(p.shape) for n, p in Qwen3(config).named_parameters()}.items()})
    data = bytearray(good.read_bytes())
    data[32:36] = np.array(1.3, dtype="<f4").tobytes()  # an ffn_dim_multiplier
    bad = tmp_path / "multiplier.bin"
    bad.write_bytes(bytes(data))
    with pytest.raises(LlmcFormatError) as error:
        read_checkpoint(bad)
    assert str(bad) in str(error.value) and "ffn_dim_multiplier is 1.3" in str(error.value)
    assert "expected 0.0" in str(error.value) and "\n" not in str(error.value)
    data = bytearray(good.read_bytes())
    data[4:8] = np.array(5, dtype="<i4").tobytes()  # a bfloat16 version: qwen3 reads 3 only
    bad.write_bytes(bytes(data))
    with pytest.raises(LlmcFormatError, match="version 5"):
        read_checkpoint(bad)


def test_config_refusals_name_the_field():
    with pytest.raises(ValueError, match="use_scaled_rope"):
        dataclasses.replace(our_config(), use_scaled_rope=True)
    with pytest.raises(ValueError, match="multiple_of=7 does not divide"):
        dataclasses.replace(our_config(), multiple_of=7)
    with pytest.raises(ValueError, match="odd"):
        Qwen3Config(block_size=8, vocab_size=8, n_layer=1, n_head=2, n_kv_head=1, n_embd=6)
    assert QWEN3_SPEC.asset_configs["infinitrain"].ffn_dim == 192
