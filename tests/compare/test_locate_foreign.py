"""InfiniTrain names its parameters with a `transformer.` prefix: located like ours."""

from harness.compare.locate import Locator, canonical_name, layer_of

LAYOUT = {"chunks": [[0, 0, 3], [1, 3, 8]]}


def test_infinitrain_names_are_located_to_stage_and_layer():
    locator = Locator.from_layout(LAYOUT, "gpt2")
    assert locator.locate("transformer.h.3.attn.c_attn.weight") == ("1", "3")
    assert locator.locate("transformer.h.2.mlp.c_fc.lora_A") == ("0", "2")
    assert locator.locate("transformer.ln_f.weight") == ("1 (final norm)", "-")
    assert locator.locate("lm_head.weight") == ("1 (lm head)", "-")
    assert locator.locate("transformer.wpe.weight") == ("0 (embedding)", "-")
    assert locator.stages("transformer.wte.weight") == (0, 1)  # tied: both ends


def test_canonical_name_strips_only_known_prefixes():
    assert canonical_name("module.transformer.h.0.ln_1.weight") == "h.0.ln_1.weight"
    assert canonical_name("h.0.ln_1.weight") == "h.0.ln_1.weight"
    assert canonical_name("encoder.h.0.ln_1.weight") == "encoder.h.0.ln_1.weight"
    assert layer_of("encoder.h.0.ln_1.weight") == "other"
