"""The trainer's side of a model family (harness.trainer.models): one TrainSpec per family of
harness.contracts.models, its model class, and the parallel plan pieces written as code."""

from __future__ import annotations

import dataclasses

import pytest

from harness.contracts.models import (
    GPT2_SPEC,
    LLAMA3_SPEC,
    MIXTRAL_SPEC,
    MODEL_SPECS,
    UnknownModelError,
)
from harness.trainer.models.common import is_fused_qkv, is_sequence_norm
from harness.trainer.models.configs import CONFIG_FIELDS, missing_config_fields
from harness.trainer.models.registry import TRAIN_SPECS, train_spec_for_config
from harness.trainer.models.train_spec import TrainSpec


def test_every_family_of_the_contract_has_a_train_spec_holding_it():
    assert list(TRAIN_SPECS) == list(MODEL_SPECS)
    for name, spec in TRAIN_SPECS.items():
        assert spec.name == name and spec.contract is MODEL_SPECS[name]
    assert train_spec_for_config(GPT2_SPEC.asset_configs["tiny"]) is TRAIN_SPECS["gpt2"]
    assert train_spec_for_config(LLAMA3_SPEC.asset_configs["tiny"]) is TRAIN_SPECS["llama3"]
    assert train_spec_for_config(MIXTRAL_SPEC.asset_configs["tiny"]) is TRAIN_SPECS["mixtral"]
    with pytest.raises(UnknownModelError, match="no registered model has config type object"):
        train_spec_for_config(object())


def test_a_train_spec_refuses_a_model_that_is_not_a_model_part():
    spec = TRAIN_SPECS["gpt2"]
    with pytest.raises(TypeError, match="TrainSpec 'gpt2': model .* is not a ModelPart subclass"):
        TrainSpec(spec.contract, dict, spec.parallelize, spec.fused_qkv, spec.sequence_norm)


def test_every_family_declares_every_config_field_the_trainer_reads():
    # GPT-2 declares the values the parallel plans once guessed for a family without them
    for spec in MODEL_SPECS.values():
        assert missing_config_fields(spec.config) == []
        for config in spec.asset_configs.values():
            assert all(isinstance(getattr(config, name), int) for name in CONFIG_FIELDS)
    gpt2 = GPT2_SPEC.asset_configs["tiny"]
    assert (gpt2.n_kv_head, gpt2.ffn_dim) == (gpt2.n_head, 4 * gpt2.n_embd)


def test_a_family_whose_config_leaves_out_a_field_is_refused_at_its_definition():
    # GPT-2's header fields and head_dim, but no n_kv_head and no ffn_dim
    ToyConfig = dataclasses.make_dataclass(
        "ToyConfig", [(f.name, f.type) for f in dataclasses.fields(GPT2_SPEC.config)],
        namespace={"head_dim": property(lambda self: self.n_embd // self.n_head)}, frozen=True)
    gpt2 = TRAIN_SPECS["gpt2"]
    toy = dataclasses.replace(GPT2_SPEC, name="toy", title="Toy", config=ToyConfig)  # unregistered
    with pytest.raises(TypeError, match=r"TrainSpec 'toy': config ToyConfig does not declare "
                                        r"n_kv_head, ffn_dim \(harness.trainer.models.configs"):
        TrainSpec(contract=toy, model=gpt2.model, parallelize=gpt2.parallelize)
    assert "toy" not in MODEL_SPECS and "toy" not in TRAIN_SPECS


def test_build_model_builds_each_family_module():
    from harness.contracts.models import QWEN3_SPEC
    from harness.trainer.models import GPT2, LLaMA3, Mixtral, Qwen3, build_model

    assert isinstance(build_model(GPT2_SPEC.asset_configs["tiny"], layers=[0]), GPT2)
    assert isinstance(build_model(LLAMA3_SPEC.asset_configs["tiny"], layers=[0]), LLaMA3)
    assert isinstance(build_model(MIXTRAL_SPEC.asset_configs["tiny"], layers=[0]), Mixtral)
    assert isinstance(build_model(QWEN3_SPEC.asset_configs["tiny"], layers=[0]), Qwen3)
    with pytest.raises(TypeError, match="unsupported config type object; expected GPT2Config "
                                        "or LLaMA3Config or Qwen3Config or MixtralConfig"):
        build_model(object())


@pytest.mark.parametrize("name, fused, norm", [
    ("h.3.attn.c_attn.weight", True, False),
    ("h.12.attn.c_attn.bias", True, False),
    ("h.3.attn.c_proj.weight", False, False),
    ("h.3.4.attn.c_attn.weight", False, False),  # one name part per layer index
    ("h.3.attn.c_attn.x.weight", False, False),
    ("attn.c_attn.weight", False, False),
    ("h.0.ln_1.weight", False, True),
    ("h.0.ln_2.bias", False, True),
    ("ln_f.weight", False, True),
    ("h.0.ln_3.weight", False, False),
    ("h.0.mlp.c_fc.weight", False, False),
    ("wte.weight", False, False),
])
def test_the_parameters_the_plans_single_out(name, fused, norm):
    assert (is_fused_qkv(name), is_sequence_norm(name)) == (fused, norm)


def test_the_block_plan_is_megatrons_and_sequence_parallel_adds_its_entries():
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
    )

    from harness.trainer.parallel.tensor_parallel import block_plan

    tp = block_plan("h.3", False)
    assert {k: type(v) for k, v in tp.items()} == {
        "h.3.attn.c_attn": ColwiseParallel, "h.3.attn.c_proj": RowwiseParallel,
        "h.3.mlp.c_fc": ColwiseParallel, "h.3.mlp.c_proj": RowwiseParallel}
    assert tp["h.3.attn.c_proj"].output_layouts == (Replicate(),)
    sp = block_plan("h.3", True, attention_inputs=2, mlp_colwise=("c_fc", "c_fc2"))
    assert list(sp) == ["h.3.attn", "h.3.attn.c_attn", "h.3.attn.c_proj", "h.3.mlp",
                        "h.3.mlp.c_fc", "h.3.mlp.c_fc2", "h.3.mlp.c_proj"]  # module order
    assert sp["h.3.attn.c_proj"].output_layouts == (Shard(1),)  # reduce-scattered to the slice
    gather = sp["h.3.attn"]
    assert isinstance(gather, PrepareModuleInput)
    assert gather.input_layouts == (Shard(1), None)  # x split, the RoPE table not
    assert gather.desired_input_layouts == (Replicate(), None)
    assert sp["h.3.mlp"].input_layouts == (Shard(1),)


def test_the_mixtral_plan_shards_each_expert_and_keeps_the_router_replicated(monkeypatch):
    import torch.distributed.tensor.parallel as tp_styles
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from harness.trainer.models import build_model
    from harness.trainer.models.mixtral.parallelize import parallelize_mixtral

    applied = {}
    monkeypatch.setattr(tp_styles, "parallelize_module",
                        lambda module, mesh, plan: applied.update(plan))

    class Mesh:  # a TP group of two, as far as the plan asks
        def size(self):
            return 2

        def get_group(self):
            return None  # the routing hook's broadcast group (not run here)

    part = build_model(MIXTRAL_SPEC.asset_configs["tiny"], layers=[5], embedding=False)
    parallelize_mixtral(part, Mesh(), sequence_parallel=False)
    modules = dict(part.named_modules())
    assert set(applied) <= set(modules)  # every entry names a module of the part
    expected = {"h.5.attn.c_attn": ColwiseParallel, "h.5.attn.c_proj": RowwiseParallel}
    for e in range(4):
        expected.update({f"h.5.mlp.experts.expert_{e}.c_fc": ColwiseParallel,
                         f"h.5.mlp.experts.expert_{e}.c_fc2": ColwiseParallel,
                         f"h.5.mlp.experts.expert_{e}.c_proj": RowwiseParallel})
    assert {k: type(v) for k, v in applied.items()} == expected  # no router, norms or head
    # an expert runs on a (tokens, C) subset: its output is all-reduced, never sequence-split
    assert applied["h.5.mlp.experts.expert_0.c_proj"].output_layouts == (Replicate(),)
    # and every TP rank routes with the same logits (a hook on the replicated router)
    assert len(part.h["5"].mlp.router._forward_hooks) == 1
