"""tiny Mixtral against an independent implementation: Hugging Face transformers'
MixtralForCausalLM, and its routing against InfiniTrain's rules.

HF's weights mapped to our names (q/k rows un-permuted from its rotate_half RoPE, as for LLaMA 3;
each expert's fused gate_up_proj split into c_fc2 = gate and c_fc = up), written as a tiny Mixtral
checkpoint (layer by layer) and read back: logits, loss and every parameter's gradient must
agree. HF routes by softmax over all experts then renormalises the top k; InfiniTrain (and ours)
take the top k logits then a softmax over them: the same weights.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from harness.contracts.llmc import read_checkpoint, write_checkpoint
from harness.contracts.mixtral_facts import MIXTRAL_FACTS
from harness.trainer.models import Mixtral, MixtralConfig, build_model, load_weights
from tests.trainer.models.hf_parity import assert_matches_hf, interleaved_rows

transformers = pytest.importorskip("transformers")

V, C, N_HEAD, N_KV, N_LAYER, BLOCK = 100, 64, 4, 2, 2, 64
E, TOP_K, FFN = 4, 2, 48


def our_config(**changes) -> MixtralConfig:
    values = dict(block_size=BLOCK, vocab_size=V, n_layer=N_LAYER, n_head=N_HEAD, n_kv_head=N_KV,
                  n_embd=C, num_experts=E, router_topk=TOP_K, moe_ffn_hidden_size=FFN,
                  norm_eps=1e-5, rope_theta=1e6)
    return MixtralConfig(**{**values, **changes})


def make_hf_model(config: MixtralConfig, seed: int = 0):
    torch.manual_seed(seed)
    hf_config = transformers.MixtralConfig(
        vocab_size=V, hidden_size=C, intermediate_size=FFN, num_hidden_layers=N_LAYER,
        num_attention_heads=N_HEAD, num_key_value_heads=N_KV, num_local_experts=E,
        num_experts_per_tok=config.router_topk, max_position_embeddings=BLOCK,
        rms_norm_eps=config.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        tie_word_embeddings=False, router_jitter_noise=0.0, sliding_window=None,
    )
    hf = transformers.MixtralForCausalLM._from_config(
        hf_config, attn_implementation="eager", experts_implementation="eager")
    hf.eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    return hf


def hf_named(hf, getter) -> dict[str, torch.Tensor]:
    """HF tensors (weights or grads, via getter) under our names."""
    t = {k: getter(p) for k, p in hf.named_parameters()}
    out = {"wte.weight": t["model.embed_tokens.weight"], "ln_f.weight": t["model.norm.weight"],
           "lm_head.weight": t["lm_head.weight"]}
    for i in range(N_LAYER):
        p, h = f"model.layers.{i}.", f"h.{i}."
        q = interleaved_rows(t[p + "self_attn.q_proj.weight"], N_HEAD)
        k = interleaved_rows(t[p + "self_attn.k_proj.weight"], N_KV)
        out[h + "attn.c_attn.weight"] = torch.cat([q, k, t[p + "self_attn.v_proj.weight"]])
        out[h + "attn.c_proj.weight"] = t[p + "self_attn.o_proj.weight"]
        out[h + "ln_1.weight"] = t[p + "input_layernorm.weight"]
        out[h + "ln_2.weight"] = t[p + "post_attention_layernorm.weight"]
        out[h + "mlp.router.weight"] = t[p + "mlp.gate.weight"]
        gate_up, down = t[p + "mlp.experts.gate_up_proj"], t[p + "mlp.experts.down_proj"]
        for e in range(E):
            x = f"{h}mlp.experts.expert_{e}."
            out[x + "c_fc2.weight"] = gate_up[e, :FFN]  # Mixtral's w1, the gated one
            out[x + "c_fc.weight"] = gate_up[e, FFN:]  # w3, up
            out[x + "c_proj.weight"] = down[e]  # w2, down
    return out


def routed_experts(model: Mixtral, idx: torch.Tensor) -> list[set[int]]:
    """The experts each layer's router picks for ``idx``."""
    picked = []
    hooks = [block.mlp.router.register_forward_hook(
        lambda _m, _a, out: picked.append(set(out.topk(TOP_K, -1).indices.unique().tolist())))
        for block in model.h.values()]
    with torch.no_grad():
        model(idx)
    for hook in hooks:
        hook.remove()
    return picked


def test_mixtral_matches_hf_logits_loss_and_grads(tmp_path):
    config = our_config()
    hf = make_hf_model(config)
    tensors = {k: v.detach().numpy().copy() for k, v in hf_named(hf, lambda p: p).items()}
    # through a tiny Mixtral file, as the trainer loads it
    checkpoint = read_checkpoint(write_checkpoint(tmp_path / "hf.bin", config, tensors))
    assert checkpoint.version == 2 and checkpoint.config == config
    ours = build_model(checkpoint.config)
    load_weights(ours, checkpoint.tensors)

    g = torch.Generator().manual_seed(2)
    T = 40
    idx = torch.randint(0, V, (2, T), generator=g)
    targets = torch.randint(0, V, (2, T), generator=g)
    assert routed_experts(ours, idx) == [set(range(E))] * N_LAYER  # every expert gets tokens
    hf_logits = assert_matches_hf(ours, hf, hf_named, idx, targets)

    # the comparison bites: the gate on the other projection (c_fc) is far off
    swapped = dict(tensors)
    for i in range(N_LAYER):
        for e in range(E):
            x = f"h.{i}.mlp.experts.expert_{e}."
            swapped[x + "c_fc.weight"], swapped[x + "c_fc2.weight"] = \
                tensors[x + "c_fc2.weight"], tensors[x + "c_fc.weight"]
    other = build_model(config)
    load_weights(other, swapped)
    assert (other(idx) - hf_logits).abs().max() > 1e-2


def test_routing_is_topk_logits_then_softmax_and_sums_in_expert_order():
    # One MoE layer against its definition written out densely: every token's output is the sum
    # over its top-k experts (by logit) of softmax(those k logits) * the expert's SwiGLU output
    torch.manual_seed(0)
    config = our_config(num_experts=5, router_topk=3)
    moe = build_model(config, [0], embedding=False, final_norm=False, lm_head=False).h["0"].mlp
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0, 0.3)
    x = torch.randn(2, 7, C)
    tokens = x.reshape(-1, C)
    logits = tokens @ moe.router.weight.T
    expected = torch.zeros_like(tokens)
    for n, row in enumerate(logits):
        chosen = torch.argsort(row, descending=True)[:3]
        weights = torch.softmax(row[chosen], dim=0)
        for w, e in zip(weights, chosen.tolist()):
            ex = moe.experts[f"expert_{e}"]
            t = tokens[n]
            swiglu = F.silu(ex.c_fc2.weight @ t) * (ex.c_fc.weight @ t)
            expected[n] += w * (ex.c_proj.weight @ swiglu)
    torch.testing.assert_close(moe(x), expected.view_as(x), atol=1e-5, rtol=1e-5)
    # Mixtral's softmax over all experts then renormalised top k: the same weights
    top = torch.softmax(logits, -1).topk(3, -1).values
    torch.testing.assert_close(top / top.sum(-1, keepdim=True),
                               torch.softmax(logits.topk(3, -1).values, -1))


def test_an_expert_no_token_chose_is_not_run_and_gets_no_gradient():
    # InfiniTrain skips it (feat/support_moe@b7e0760:infini_train/src/nn/modules/transformer/
    # moe/experts.cc:47-50): its grad stays None, so an optimizer skips it as InfiniTrain's does
    moe = build_model(our_config(n_layer=1), [0], embedding=False, final_norm=False,
                      lm_head=False).h["0"].mlp
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0, 0.3)
        moe.router.weight.abs_()
        moe.router.weight[3].zero_()  # positive inputs: experts 0-2 score > 0, expert 3 scores 0
    x = torch.rand(2, 16, C) + 0.1
    moe(x).square().sum().backward()
    grads = {n: p.grad for n, p in moe.named_parameters()}
    assert all(grads[f"experts.expert_3.{w}.weight"] is None for w in ("c_fc", "c_fc2", "c_proj"))
    assert all(g is not None for n, g in grads.items() if "expert_3." not in n)
    # the unselected logit gets no gradient either (the softmax is over the chosen k only)
    assert torch.count_nonzero(grads["router.weight"][3]) == 0
    assert torch.count_nonzero(grads["router.weight"][:3]) > 0


def test_names_and_shapes_are_the_checkpoint_keys():
    from harness.contracts.llmc import parameter_shapes

    config = our_config()
    shapes = {n: tuple(p.shape) for n, p in Mixtral(config).named_parameters()}
    assert shapes == parameter_shapes(config)
    assert shapes["h.1.mlp.experts.expert_3.c_fc2.weight"] == (FFN, C)
    assert not any(n.endswith("bias") for n in shapes)  # no biases (config.h:24-25)


def test_rope_is_unscaled_with_the_configs_theta():
    from harness.trainer.models.llama3.model import rope_frequencies

    hf = make_hf_model(our_config(rope_theta=1e6))
    inv_freq = hf.model.rotary_emb.inv_freq
    torch.testing.assert_close(rope_frequencies(C // N_HEAD, 1e6, False), inv_freq,
                               rtol=1e-6, atol=0)
    model = Mixtral(our_config(rope_theta=1e6))
    other = Mixtral(our_config(rope_theta=1e4))
    assert not torch.equal(model.rope, other.rope)  # theta comes from the config


SOURCE = re.compile(r"feat/support_moe@b7e0760:[\w/.]+\.(cc|h):\d+(-\d+)?(, \d+(-\d+)?)*")


def test_every_fact_names_its_source_lines():
    assert len(MIXTRAL_FACTS) >= 15
    for fact in MIXTRAL_FACTS:
        assert fact.subject and fact.baseline, fact
        for source in fact.source.split("; "):
            assert SOURCE.fullmatch(source), source


MIRROR = Path("/work/.mirror/InfiniTensor+InfiniTrain/repo")


@pytest.mark.skipif(not MIRROR.is_dir(), reason=f"no fetched InfiniTrain mirror at {MIRROR}")
def test_every_fact_source_is_a_file_and_lines_of_the_branch():
    """Where the fetched repository is here (not in CI): each cited file exists at b7e0760 and
    each cited line lies inside it."""
    wrong = []
    for fact in MIXTRAL_FACTS:
        for source in fact.source.split("; "):
            _, path, lines = source.split(":")
            shown = subprocess.run(["git", "-C", str(MIRROR), "show", f"b7e0760:{path}"],
                                   capture_output=True, text=True)
            last = max(int(n) for n in re.findall(r"\d+", lines))
            if shown.returncode or last > len(shown.stdout.splitlines()):
                wrong.append(source)
    assert not wrong


def test_float64_run_and_sequence_limit():
    model = Mixtral(our_config())
    model.init_weights(0)
    idx = torch.randint(0, V, (1, 8))
    ref = model(idx)
    model.to(torch.float64)
    out = model(idx)
    assert out.dtype == torch.float64 and model.rope.dtype == torch.float64
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().double().numpy(), atol=1e-4)
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, BLOCK + 1, dtype=torch.long))
