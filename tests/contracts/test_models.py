"""The families' torch-free contract (harness.contracts.models): registry, clear errors, the name ->
place rule. The torch side (TrainSpec, the parallel plans): tests/trainer/models/test_train_specs.py."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import pytest

from harness.contracts import models as spec_models
from harness.contracts.models import (
    GPT2_SPEC,
    LLAMA3_SPEC,
    MIXTRAL_SPEC,
    QWEN3_SPEC,
    MODEL_SPECS,
    GPT2Config,
    LLaMA3Config,
    MixtralConfig,
    ModelSpec,
    UnknownModelError,
    get_model_spec,
    layer_of,
    register_model,
    spec_for_config,
)


def test_importing_the_registry_loads_no_torch():
    code = ("import sys, harness.contracts.models, harness.trainer.models.configs, "
            "harness.contracts.llmc, harness.compare.locate, harness.assets; "
            "print([m for m in sys.modules if m == 'torch' or m.startswith('torch.')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_known_families_and_lookups():
    assert list(MODEL_SPECS) == ["gpt2", "llama3", "qwen3", "mixtral"]
    assert get_model_spec("gpt2") is GPT2_SPEC and get_model_spec("llama3") is LLAMA3_SPEC
    assert get_model_spec("mixtral") is MIXTRAL_SPEC
    config = GPT2_SPEC.asset_configs["tiny"]
    assert spec_for_config(config) is GPT2_SPEC
    assert spec_for_config(LLAMA3_SPEC.asset_configs["tiny"]) is LLAMA3_SPEC
    assert spec_for_config(MIXTRAL_SPEC.asset_configs["tiny"]) is MIXTRAL_SPEC
    assert spec_for_config(QWEN3_SPEC.asset_configs["tiny"]) is QWEN3_SPEC is get_model_spec("qwen3")
    # the old import path is the same class
    from harness.trainer.models.configs import GPT2Config as old

    assert old is GPT2Config


def test_unknown_model_names_it_and_the_known_ones():
    with pytest.raises(UnknownModelError, match="unknown model 'mamba'; known models: gpt2, llama3, qwen3, mixtral"):
        get_model_spec("mamba")
    with pytest.raises(UnknownModelError, match="no registered model has config type object"):
        spec_for_config(object())


def test_register_refuses_a_second_spec_under_a_name_or_config():
    with pytest.raises(ValueError, match="'gpt2' is already registered"):
        register_model(ModelSpec(**{**GPT2_SPEC.__dict__, "title": "another GPT-2"}))
    with pytest.raises(ValueError, match="config GPT2Config is already model 'gpt2'"):
        register_model(ModelSpec(**{**GPT2_SPEC.__dict__, "name": "gpt2-bis"}))
    assert register_model(GPT2_SPEC) is GPT2_SPEC  # the same spec again is fine
    assert list(MODEL_SPECS) == ["gpt2", "llama3", "qwen3", "mixtral"]


def test_a_new_family_registers_and_is_found(monkeypatch):
    monkeypatch.setattr(spec_models, "MODEL_SPECS", dict(MODEL_SPECS))

    class TinyConfig(LLaMA3Config):
        pass

    spec = ModelSpec(**{**LLAMA3_SPEC.__dict__, "name": "tiny3", "title": "Tiny 3",
                        "config": TinyConfig, "checkpoint_magic": 1, "token_magic": 2})
    spec_models.register_model(spec)
    assert spec_models.get_model_spec("tiny3") is spec
    assert "tiny3" in str(pytest.raises(UnknownModelError, spec_models.get_model_spec, "x").value)


def test_tied_parameters_and_name_to_layer_rule():
    assert GPT2_SPEC.tied_parameters == (("wte.weight", "lm_head.weight"),)
    assert LLAMA3_SPEC.tied_parameters == ()
    assert GPT2_SPEC.place("h.7.mlp.c_fc.weight") == 7
    assert GPT2_SPEC.place("wpe.weight") == "embedding"
    assert LLAMA3_SPEC.place("wpe.weight") == "other"
    assert layer_of("ln_f.bias") == "final_norm" and layer_of("lm_head.weight") == "head"
    assert layer_of("wpe.weight") == "embedding" and layer_of("rope") == "other"


def test_every_spec_is_complete_and_consistent():
    from harness.contracts.llmc.checkpoint import parameter_shapes

    magics = [s.checkpoint_magic for s in MODEL_SPECS.values()]
    tokens = {s.token_magic: (s.token_version, s.token_dtype, s.token_max_id)
              for s in MODEL_SPECS.values()}
    assert len(set(magics)) == len(magics) and not set(magics) & set(tokens)
    for spec in MODEL_SPECS.values():
        # a token magic names one format, whichever families read it (mixtral reads llama3's)
        assert tokens[spec.token_magic] == (spec.token_version, spec.token_dtype,
                                            spec.token_max_id)
        assert set(spec.asset_configs) == {"tiny", "small", "bench", "infinitrain"}
        for config in spec.asset_configs.values():
            assert isinstance(config, spec.config)
            if spec.parameter_count is not None:  # the closed form is the layout's count
                assert spec.parameter_count(config) == sum(
                    math.prod(shape) for shape in parameter_shapes(config).values())
        names = [n for n, _shape, _stacked in spec.tensor_layout(spec.asset_configs["tiny"])]
        assert len(names) == len(set(names))
    assert MIXTRAL_SPEC.token_magic == LLAMA3_SPEC.token_magic


def test_a_config_naming_no_models_runs_gpt2_and_llama3_only():
    from harness.cases.build import DEFAULT_MODELS

    assert [n for n, s in MODEL_SPECS.items() if s.in_default_cases] == ["gpt2", "llama3"]
    assert DEFAULT_MODELS == ("gpt2", "llama3")  # mixtral runs where a config names it


# TinyMixtralConfig(), feat/support_moe@b7e0760:example/tiny_mixtral/config.h:11-41, written out
# independently of MixtralConfig's defaults
TINY_MIXTRAL = dict(block_size=32768, vocab_size=128256, n_layer=32, n_head=4, n_kv_head=1,
                    n_embd=512, num_experts=8, ffn_expansion_ratio=3.5, norm_eps=1e-5,
                    rope_theta=1e6, use_scaled_rope=False, router_topk=2,
                    moe_ffn_hidden_size=1792)


def test_mixtral_defaults_are_tiny_mixtrals_config_and_its_857m_parameters():
    from harness.contracts.llmc.checkpoint import parameter_shapes

    config = MixtralConfig()
    assert config == MixtralConfig(**TINY_MIXTRAL)
    assert (config.head_dim, config.ffn_dim) == (128, 1792)
    assert MIXTRAL_SPEC.parameter_count(config) == 857_113_088  # the real file's float count
    shapes = parameter_shapes(MixtralConfig(**{**TINY_MIXTRAL, "n_layer": 1}))
    assert shapes["h.0.attn.c_attn.weight"] == (512 + 2 * 128, 512)
    assert shapes["h.0.mlp.router.weight"] == (8, 512)
    assert shapes["h.0.mlp.experts.expert_7.c_fc2.weight"] == (1792, 512)
    assert shapes["h.0.mlp.experts.expert_7.c_proj.weight"] == (512, 1792)


@pytest.mark.parametrize("change, message", [
    (dict(n_embd=510), "n_embd=510 is not divisible by n_head=4"),
    (dict(n_kv_head=3), "n_head=4 is not divisible by n_kv_head=3"),
    (dict(router_topk=9), "router_topk=9 exceeds num_experts=8"),
    (dict(num_experts=0), "MixtralConfig.num_experts is 0; expected a positive integer"),
    (dict(n_embd=12, n_head=4), "n_embd / n_head = 3 is odd"),
    (dict(norm_eps=0.0), "MixtralConfig.norm_eps is 0.0; expected a positive, finite number"),
    (dict(rope_theta=float("inf")), "MixtralConfig.rope_theta is inf"),
    (dict(use_scaled_rope=True), "use_scaled_rope is True; tiny Mixtral keeps scaled RoPE "
                                 "disabled"),
])
def test_mixtral_config_refuses_what_tiny_mixtral_refuses(change, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        MixtralConfig(**{**TINY_MIXTRAL, **change})
