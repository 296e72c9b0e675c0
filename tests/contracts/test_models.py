"""The families' torch-free contract (harness.contracts.models): registry, clear errors, the name ->
place rule. The torch side (TrainSpec, the parallel plans): tests/trainer/models/test_train_specs.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.contracts import models as spec_models
from harness.contracts.models import (
    GPT2_SPEC,
    LLAMA3_SPEC,
    MODEL_SPECS,
    GPT2Config,
    LLaMA3Config,
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
    assert list(MODEL_SPECS) == ["gpt2", "llama3"]
    assert get_model_spec("gpt2") is GPT2_SPEC and get_model_spec("llama3") is LLAMA3_SPEC
    config = GPT2_SPEC.asset_configs["tiny"]
    assert spec_for_config(config) is GPT2_SPEC
    assert spec_for_config(LLAMA3_SPEC.asset_configs["tiny"]) is LLAMA3_SPEC
    # the old import path is the same class
    from harness.trainer.models.configs import GPT2Config as old

    assert old is GPT2Config


def test_unknown_model_names_it_and_the_known_ones():
    with pytest.raises(UnknownModelError, match="unknown model 'mamba'; known models: gpt2, llama3"):
        get_model_spec("mamba")
    with pytest.raises(UnknownModelError, match="no registered model has config type object"):
        spec_for_config(object())


def test_register_refuses_a_second_spec_under_a_name_or_config():
    with pytest.raises(ValueError, match="'gpt2' is already registered"):
        register_model(ModelSpec(**{**GPT2_SPEC.__dict__, "title": "another GPT-2"}))
    with pytest.raises(ValueError, match="config GPT2Config is already model 'gpt2'"):
        register_model(ModelSpec(**{**GPT2_SPEC.__dict__, "name": "gpt2-bis"}))
    assert register_model(GPT2_SPEC) is GPT2_SPEC  # the same spec again is fine
    assert list(MODEL_SPECS) == ["gpt2", "llama3"]


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
    magics = [s.checkpoint_magic for s in MODEL_SPECS.values()]
    tokens = [s.token_magic for s in MODEL_SPECS.values()]
    assert len(set(magics + tokens)) == len(magics) + len(tokens)
    for spec in MODEL_SPECS.values():
        assert set(spec.asset_configs) == {"tiny", "small", "bench", "infinitrain"}
        for config in spec.asset_configs.values():
            assert isinstance(config, spec.config)
        names = [n for n, _shape, _stacked in spec.tensor_layout(spec.asset_configs["tiny"])]
        assert len(names) == len(set(names))
